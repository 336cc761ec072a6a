# What the built-in detectors share: the built-in shapes data, a MALA-T trained from scratch, and a schedule
# short enough for minutes on CPU (2 processes, gloo). A check of the whole pipeline, not a recipe for COCO.
_base_ = ['./datasets/builtin_instance.py', './default_runtime.py', '../../_base_/mala_t.py']  # for its widths
custom_imports = dict(imports=['mala_mm'], allow_failed_imports=False)

norm_cfg = dict(type='BN', requires_grad=True)  # SyncBN does not run on CPU tensors
builtin_backbone = dict(
    _delete_=True,  # replaces the ResNet of the mmdet model config it goes into
    type='MALA',
    arch='tiny',
    drop_path_rate=0.0,  # short from-scratch schedule: regularisation only slows it down
    out_indices=(0, 1, 2, 3),
    norm_cfg=norm_cfg,
    init_cfg=None)
# necks and heads narrower than COCO's: at this resolution they, the mask head above all, would cost more than
# the backbone; BN in them lets them learn from scratch within a few hundred iterations
builtin_neck = dict(in_channels=_base_.mala_channels, out_channels=128, norm_cfg=norm_cfg)
builtin_rpn_head = dict(in_channels=128, feat_channels=128, anchor_generator=dict(scales=[4]))  # objects: 33-67 px

max_iters = 500
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

optim_wrapper = dict(
    type='OptimWrapper',
    # at 1e-3 the RoI head from scratch oscillates instead of settling
    optimizer=dict(type='AdamW', lr=3e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(norm_decay_mult=0.0),
    clip_grad=dict(max_norm=10.0))
# warm-up, then the full rate until the last fifth: a short run needs every step at full speed
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='MultiStepLR', by_epoch=False, begin=0, end=max_iters, milestones=[int(0.8 * max_iters)], gamma=0.1),
]

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=10),
    checkpoint=dict(by_epoch=False, interval=max_iters, max_keep_ckpts=2))
log_processor = dict(window_size=10, by_epoch=False)
randomness = dict(seed=0)
