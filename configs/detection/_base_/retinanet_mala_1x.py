# RetinaNet 1x: 12 epochs, single scale 1333x800 with flip, 8 GPUs x 2 images, weight decay 1e-4
_base_ = [
    './models/retinanet_mala.py', 'mmdet::_base_/datasets/coco_detection.py', './schedules/adamw_1x.py',
    './default_runtime.py'
]

train_dataloader = dict(batch_size=2)
# weight decay 1e-4 on every parameter: the release gave RetinaNet no paramwise_cfg
optim_wrapper = dict(optimizer=dict(weight_decay=1e-4))
