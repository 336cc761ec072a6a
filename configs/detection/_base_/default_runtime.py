_base_ = ['mmdet::_base_/default_runtime.py', '../../_base_/mala_runtime.py']

# checkpoints are written whole or not at all (mala_mm.engine.hooks); the last 3 are kept (a checkpoint with its
# AdamW state is 3-4 times the weights: docs/reproducing.md)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook', max_keep_ckpts=3), **_base_.mala_hooks)
