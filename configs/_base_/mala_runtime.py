# What every config here runs with, detection and segmentation, paper and built-in. The modules that register the
# types the configs name, so that mmdet's and mmseg's own tools run them too: mala_mm, the MALA backbone;
# mala_mm.engine, the hooks below, AtomicCheckpointHook and the CPU mixed-precision optim wrapper that
# tools/train.py --amp picks on CPU; and mala_mm.safe_loading, with which mmengine reads checkpoints as data (under
# torch >= 2.6, mmdet's and mmseg's own tools and inferencers then load and resume mmengine's checkpoints). The
# hooks: random draws that repeat on resume and every rank's norm statistics the saved model's
# (mala_mm.engine.hooks), and the count of optimizer steps that fp16's loss scaler skipped, which stops a run that
# skips more than a tenth of them (mala_mm.engine.skipped_steps).
custom_imports = dict(imports=['mala_mm', 'mala_mm.engine', 'mala_mm.safe_loading'], allow_failed_imports=False)
# A config adds them to default_hooks (default_hooks = dict(**_base_.mala_hooks, ...)), a dict that a config over
# it merges into, so that a user's own custom_hooks, a list, which replaces, adds to them; the Runner registers
# every hook by its priority, wherever it is named. (Named here as default_hooks, they would clash with the
# default_hooks of the mmdet or mmseg base beside this file.)
mala_hooks = dict(
    iteration_seed=dict(type='IterationSeedHook'),
    sync_norm_stats=dict(type='SyncNormStatsHook'),
    skipped_steps=dict(type='SkippedStepsHook'))
