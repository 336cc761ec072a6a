_base_ = ['mmdet::_base_/default_runtime.py', '../../_base_/mala_runtime.py']

# checkpoints are written whole or not at all (mala_mm.engine.hooks)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))
