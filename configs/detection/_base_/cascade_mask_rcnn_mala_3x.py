# Cascade Mask R-CNN 3x: 36 epochs, DETR-style multi-scale training, 8 GPUs x 2 images
_base_ = [
    './models/cascade_mask_rcnn_mala.py', './datasets/coco_instance_ms_3x.py', './schedules/adamw_3x.py',
    './default_runtime.py'
]

train_dataloader = dict(batch_size=2)
