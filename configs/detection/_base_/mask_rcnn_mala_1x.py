# Mask R-CNN 1x: 12 epochs, single scale 1333x800 with flip, 8 GPUs x 2 images
_base_ = [
    './models/mask_rcnn_mala.py', 'mmdet::_base_/datasets/coco_instance.py', './schedules/adamw_1x.py',
    './default_runtime.py', '../../_base_/release_weight_decay.py'
]

train_dataloader = dict(batch_size=2)
optim_wrapper = dict(paramwise_cfg=_base_.no_decay_if_named_norm)
