_base_ = 'mmdet::_base_/schedules/schedule_1x.py'

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)

# linear warm-up over 500 iterations from 0.001 x lr, then x0.1 at epochs 8 and 11
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11], gamma=0.1)
]

# AdamW in fp16 mixed precision with a static loss scale of 512, as the release trained every detector (mmcv 1.x's
# fp16 = dict() defaults to that scale; a float loss_scale stays fixed in mmengine too, and a step whose
# gradients overflow is skipped). Which parameters are decayed is the method's
# (../../../_base_/release_weight_decay.py).
optim_wrapper = dict(
    type='AmpOptimWrapper',
    loss_scale=512.,
    optimizer=dict(_delete_=True, type='AdamW', lr=4e-4, betas=(0.9, 0.999), weight_decay=0.05))

# the recipe's lr is for 8 GPUs x 2 images
auto_scale_lr = dict(enable=False, base_batch_size=16)
