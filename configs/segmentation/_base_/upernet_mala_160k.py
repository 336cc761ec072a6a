# UperNet 160k on ADE20K: 512x512 crops, 8 GPUs x 2 images, single-scale test
_base_ = [
    './models/upernet_mala.py', 'mmseg::_base_/datasets/ade20k.py', './schedules/adamw_poly_160k.py',
    './default_runtime.py', '../../_base_/release_weight_decay.py'
]

train_dataloader = dict(batch_size=2)
# this project's hooks, beside the schedule's (mmseg's schedules set the default hooks)
default_hooks = _base_.mala_hooks
optim_wrapper = dict(paramwise_cfg=_base_.no_decay_if_named_norm)
