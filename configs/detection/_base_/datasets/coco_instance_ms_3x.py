_base_ = 'mmdet::_base_/datasets/coco_instance.py'

# DETR-style multi-scale training: with probability 0.5 each, resize the short side to one of 480..800
# (step 32, long side <= 1333), or resize to 400/500/600, crop 384..600 and then resize as before
short_side_scales = [(short, 1333) for short in range(480, 801, 32)]
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(
        type='RandomChoice',
        transforms=[
            [dict(type='RandomChoiceResize', scales=short_side_scales, keep_ratio=True)],
            [
                dict(type='RandomChoiceResize', scales=[(400, 1333), (500, 1333), (600, 1333)], keep_ratio=True),
                dict(type='RandomCrop', crop_type='absolute_range', crop_size=(384, 600),
                     allow_negative_crop=True),
                dict(type='RandomChoiceResize', scales=short_side_scales, keep_ratio=True),
            ],
        ]),
    dict(type='PackDetInputs')
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
