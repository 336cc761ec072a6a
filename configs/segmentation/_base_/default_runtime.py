_base_ = 'mmseg::_base_/default_runtime.py'

# random draws repeat on resume, and every rank's norm statistics are the saved model's (mala_mm.engine.hooks)
custom_hooks = [dict(type='IterationSeedHook'), dict(type='SyncNormStatsHook')]
