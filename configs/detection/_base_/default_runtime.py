_base_ = 'mmdet::_base_/default_runtime.py'

# checkpoints are written whole or not at all, and random draws repeat on resume (mala_mm.engine.hooks)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))
custom_hooks = [dict(type='IterationSeedHook'), dict(type='SyncNormStatsHook')]
