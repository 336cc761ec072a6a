# MALA-T UperNet on the built-in shapes dataset: a from-scratch run that learns visibly within minutes on
# CPU (2 processes, gloo) — a check of the whole pipeline, not a recipe for ADE20K.
_base_ = [
    'mmseg::_base_/models/upernet_r50.py',
    './_base_/datasets/builtin_semantic.py',
    './_base_/default_runtime.py',
    '../_base_/mala_t.py',  # for its widths
]
custom_imports = dict(imports=['mala_mm'], allow_failed_imports=False)

norm_cfg = dict(type='BN', requires_grad=True)  # SyncBN does not run on CPU tensors
num_classes = 5
model = dict(
    data_preprocessor=dict(size=(128, 128)),  # the crop size of the dataset piece
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='MALA',
        arch='tiny',
        drop_path_rate=0.0,  # short from-scratch schedule: regularisation only slows it down
        out_indices=(0, 1, 2, 3),
        norm_cfg=norm_cfg,
        init_cfg=None),
    # heads a quarter as wide as ADE20K's: most of a CPU step is spent in them at this resolution
    decode_head=dict(
        in_channels=_base_.mala_channels, channels=128, num_classes=num_classes, norm_cfg=norm_cfg),
    auxiliary_head=dict(in_channels=_base_.mala_channels[2], channels=64, num_classes=num_classes, norm_cfg=norm_cfg))

max_iters = 300
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(norm_decay_mult=0.0),
    clip_grad=dict(max_norm=10.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=30),
    dict(type='PolyLR', power=1.0, by_epoch=False, begin=30, end=max_iters, eta_min=1e-5),
]

default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=10, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='AtomicCheckpointHook', by_epoch=False, interval=max_iters, max_keep_ckpts=2),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))
log_processor = dict(window_size=10, by_epoch=False)
# reproducible runs; a run killed and resumed ends with the weights of an uninterrupted one
randomness = dict(seed=0)
