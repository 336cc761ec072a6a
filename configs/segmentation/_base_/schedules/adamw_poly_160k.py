_base_ = 'mmseg::_base_/schedules/schedule_160k.py'

# AdamW in fp16 mixed precision with a static loss scale of 512, as the release trained UperNet (mmcv 1.x's
# fp16 = dict()). Which parameters are decayed is the method's (../../../_base_/release_weight_decay.py).
optim_wrapper = dict(
    _delete_=True,
    type='AmpOptimWrapper',
    loss_scale=512.,
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01))

# linear warm-up (1500 iterations from 1e-6 x lr) multiplying a poly(1.0) decay over all 160k iterations,
# which is how the release's mmcv 1.x poly policy applied its warm-up
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=0, end=160000, by_epoch=False)
]

# the recipe's lr is for 8 GPUs x 2 images
auto_scale_lr = dict(enable=False, base_batch_size=16)

# validate and checkpoint every 8,000 iterations and keep the best mIoU, as released, and the last 3 checkpoints
# (docs/reproducing.md says which one is tested). Checkpoints are written whole or not at all
# (mala_mm.engine.hooks); in mmseg the schedule sets the hooks.
interval = 8000
train_cfg = dict(val_interval=interval)
default_hooks = dict(
    checkpoint=dict(type='AtomicCheckpointHook', interval=interval, save_best='mIoU', max_keep_ckpts=3))
