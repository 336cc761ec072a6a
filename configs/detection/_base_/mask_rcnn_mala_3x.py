# Mask R-CNN 3x: 36 epochs, DETR-style multi-scale training, 8 GPUs x 2 images
_base_ = [
    './models/mask_rcnn_mala.py', './datasets/coco_instance_ms_3x.py', './schedules/adamw_3x.py',
    './default_runtime.py', '../../_base_/release_weight_decay.py'
]

train_dataloader = dict(batch_size=2)
optim_wrapper = dict(paramwise_cfg=_base_.no_decay_if_named_norm)
