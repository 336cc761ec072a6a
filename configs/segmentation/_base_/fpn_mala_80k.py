# Semantic FPN 80k on ADE20K: 512x512 crops, 8 GPUs x 2 images, single-scale test
_base_ = [
    './models/fpn_mala.py', 'mmseg::_base_/datasets/ade20k.py', './schedules/adamw_poly_80k.py',
    './default_runtime.py'
]

train_dataloader = dict(batch_size=2)
# this project's hooks, beside the schedule's (mmseg's schedules set the default hooks)
default_hooks = _base_.mala_hooks
