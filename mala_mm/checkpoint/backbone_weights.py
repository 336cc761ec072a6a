"""Loading MALA backbone weights from the formats users have: the release's classification checkpoints,
mmdet/mmseg checkpoints and plain state dicts, with their shapes checked against the model."""
import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from torch import nn

from .reading import CheckpointError, safe_load

# Keys of the release's classification head, which a dense backbone does not have.
CLASSIFICATION_ONLY_PREFIXES = ('proj.', 'norm.', 'head.')


def model_state(checkpoint: dict) -> dict:
    """The state dict inside a checkpoint: its ``state_dict`` (mmengine) or ``model`` (the release's
    classification trainer) entry, or the checkpoint itself when it is a plain state dict."""
    for container in ('state_dict', 'model'):
        if isinstance(checkpoint.get(container), dict):
            return checkpoint[container]
    return checkpoint


def extract_backbone_state_dict(checkpoint, prefix: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """The backbone's tensors from a loaded checkpoint of any supported format.

    - mmengine/mmdet/mmseg: ``{'state_dict': {'backbone.*': ...}}``;
    - the release's classification trainer: ``{'model': {...}, 'model_ema': ..., 'args': ...}``, whose
      classification-only keys (``proj.*``, ``norm.*``, ``head.*``) are dropped;
    - a plain backbone state dict (as this project's tools write).

    Args:
        prefix: take only keys under this prefix (e.g. 'backbone.'); by default 'backbone.' where present.
    """
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f'a checkpoint must be a dict, got {type(checkpoint).__name__}')
    state = {k[len('module.'):] if k.startswith('module.') else k: v
             for k, v in model_state(checkpoint).items() if isinstance(v, torch.Tensor)}
    if prefix is None and any(k.startswith('backbone.') for k in state):
        prefix = 'backbone.'
    if prefix:
        return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    return {k: v for k, v in state.items() if not k.startswith(CLASSIFICATION_ONLY_PREFIXES)}


@dataclass
class StateDictComparison:
    """How a checkpoint's state dict lines up with a model's: keys in both, keys only the model has, keys only
    the checkpoint has, and keys in both whose shapes differ ('key: checkpoint (...), model (...)')."""
    matched: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)
    wrong_shapes: List[str] = field(default_factory=list)


def compare_state_dict(state: Dict[str, torch.Tensor], model: nn.Module) -> StateDictComparison:
    own = model.state_dict()
    matched = [key for key in state if key in own]
    return StateDictComparison(
        matched=matched,
        missing=[key for key in own if key not in state],
        unexpected=[key for key in state if key not in own],
        wrong_shapes=[f'{key}: checkpoint {tuple(state[key].shape)}, model {tuple(own[key].shape)}'
                      for key in matched if state[key].shape != own[key].shape])


def load_backbone_weights(model: nn.Module, filename: str, prefix: Optional[str] = None,
                          logger: Optional[logging.Logger] = None) -> None:
    """Load a backbone checkpoint into ``model``, refusing one that does not fit.

    Missing keys (e.g. the dense model's extra norms, absent from classification checkpoints) keep their
    initialisation and are logged, as are unexpected keys.

    Raises:
        CheckpointError: no key of the checkpoint belongs to the model, or some shapes differ (another arch).
    """
    logger = logger or logging.getLogger(__name__)
    state = extract_backbone_state_dict(safe_load(filename), prefix)
    comparison = compare_state_dict(state, model)
    if not comparison.matched:
        raise CheckpointError(
            f'no key of {filename!r} belongs to {type(model).__name__} (it has {len(state)} tensors, e.g. '
            f'{list(state)[:3]}); is it a MALA checkpoint, and is prefix={prefix!r} right?')
    if comparison.wrong_shapes:
        raise CheckpointError(
            f'{filename!r} does not fit this {type(model).__name__} arch: {len(comparison.wrong_shapes)} shapes '
            f'differ, e.g. ' + '; '.join(comparison.wrong_shapes[:3]) + '. Pick the arch the checkpoint was '
            'trained with.')
    model.load_state_dict(state, strict=False)
    logger.info(f'loaded {len(comparison.matched)} tensors into {type(model).__name__} from {filename}')
    if comparison.missing:
        logger.warning(f'keys missing from the checkpoint, left at their initialisation: {comparison.missing}')
    if comparison.unexpected:
        logger.warning(f'checkpoint keys the model does not have, ignored: {comparison.unexpected}')
