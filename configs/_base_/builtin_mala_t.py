# What the built-in detection and segmentation configs share: a MALA-T trained from scratch on the built-in shapes
# data in a run short enough for minutes on CPU (2 processes, gloo); a check of the whole pipeline, not a recipe
# for COCO or ADE20K. A task's built-in config adds its number of iterations, its lr and weight decay, its
# schedulers and its hooks.
_base_ = ['./mala_t.py']  # MALA-T's arch and widths; its ImageNet weights are not loaded

# norm of the backbone and the heads: SyncBN does not run on CPU tensors. Not `norm_cfg`, which mmseg's model
# configs set beside this base; each task's config passes this on under that name.
builtin_norm_cfg = dict(type='BN', requires_grad=True)
builtin_backbone = dict(
    _base_.mala_variant,
    _delete_=True,  # replaces the ResNet of the model config it goes into
    type='MALA',
    drop_path_rate=0.0,  # short from-scratch schedule: regularisation only slows it down
    out_indices=(0, 1, 2, 3),
    norm_cfg=builtin_norm_cfg,
    init_cfg=None)

# an iteration-based run; each task's config sets its length and validates at its end
train_cfg = dict(type='IterBasedTrainLoop')
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', betas=(0.9, 0.999)),
    paramwise_cfg=dict(norm_decay_mult=0.0),
    clip_grad=dict(max_norm=10.0))
# a linear warm-up from a hundredth of the lr, over a tenth of the run (its end is the task's)
builtin_warmup = dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0)

# a log line every log_interval iterations, averaged over them; iteration-based checkpoints, the last two kept
log_interval = 10
builtin_checkpoint = dict(by_epoch=False, max_keep_ckpts=2)
# reproducible runs; a run killed and resumed ends with the weights of an uninterrupted one
randomness = dict(seed=0)
