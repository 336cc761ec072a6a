_base_ = 'mmseg::_base_/schedules/schedule_80k.py'

# AdamW in fp32 with every parameter decayed, as the release trained Semantic FPN (no fp16, no paramwise_cfg)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-4))

param_scheduler = [dict(type='PolyLR', eta_min=1e-6, power=0.9, begin=0, end=80000, by_epoch=False)]

# the recipe's lr is for 8 GPUs x 2 images
auto_scale_lr = dict(enable=False, base_batch_size=16)

# validate and checkpoint every 4,000 iterations, as released, keeping the last 3 checkpoints. Checkpoints are
# written whole or not at all (mala_mm.engine.hooks); in mmseg the schedule sets the hooks.
interval = 4000
train_cfg = dict(val_interval=interval)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook', interval=interval, max_keep_ckpts=3))
