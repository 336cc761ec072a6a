"""Reading checkpoints as data, and loading MALA backbone weights from the formats users have.

Every checkpoint is read through a restricted unpickler: the only globals its pickle may name are torch's own
allow-list for ``weights_only`` loading and :data:`SAFE_GLOBALS`, which the released and mmengine checkpoints
legitimately carry. It is this module's own, so it is equally strict on every torch, whether or not that torch
has the safe-globals API. :func:`use_safe_loading` makes mmengine's own loading (``load_from``, ``resume``, any
``Pretrained`` init) do the same.
"""
from mmengine.runner import CheckpointLoader

from .backbone_weights import (CLASSIFICATION_ONLY_PREFIXES, StateDictComparison, compare_state_dict,
                               extract_backbone_state_dict, load_backbone_weights, model_state)
from .reading import SAFE_GLOBALS, CheckpointError, CheckpointNotFoundError, pickle_globals, safe_load

__all__ = ['CLASSIFICATION_ONLY_PREFIXES', 'SAFE_GLOBALS', 'CheckpointError', 'CheckpointNotFoundError',
           'StateDictComparison', 'compare_state_dict', 'extract_backbone_state_dict', 'load_backbone_weights',
           'model_state', 'pickle_globals', 'safe_load', 'use_safe_loading']


def use_safe_loading() -> None:
    """Make mmengine read every checkpoint as :func:`safe_load` does: local files (``load_from``, ``resume``,
    ``init_cfg=dict(type='Pretrained')`` of any model) and http(s) URLs, with :func:`safe_load`'s clear errors.
    Without this, torch >= 2.6 refuses mmengine's own checkpoints on resume (their meta holds HistoryBuffer and
    numpy objects), and older torch reads any pickle with no restriction at all."""
    CheckpointLoader.register_scheme(prefixes='', loader=safe_load, force=True)
    CheckpointLoader.register_scheme(prefixes=('http://', 'https://'), loader=safe_load, force=True)
