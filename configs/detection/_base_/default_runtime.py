_base_ = 'mmdet::_base_/default_runtime.py'

# checkpoints are written whole or not at all, random draws repeat on resume, and every rank's norm statistics
# are the saved model's (mala_mm.engine.hooks)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))
custom_hooks = [dict(type='IterationSeedHook'), dict(type='SyncNormStatsHook')]
