""":class:`~.mala.MALA`'s arguments checked before anything is built, each refusal a :class:`MALAConfigError` that
says which argument and what it allows."""
import warnings
from typing import Dict, List, Optional, Sequence, Union

import torch

from ...ops.torch_compat import HAS_CUSTOM_OPS
from ..layers import ATTENTION_KINDS, rope_head_dims

CUSTOM_ARCH_DEFAULTS = dict(mlp_ratio=3.5, layer_scale_init=1.0, drop_path_rate=0.1)


class MALAConfigError(ValueError):
    """An argument of :class:`~.mala.MALA` that cannot build a model; the message says which and what is allowed."""


def resolve_arch(arch: Union[str, dict], arch_zoo: Dict[str, dict]) -> dict:
    """A variant of ``arch_zoo`` by name, or a custom dict with its defaults filled in."""
    if isinstance(arch, str):
        if arch.lower() not in arch_zoo:
            raise MALAConfigError(f'MALA: unknown arch {arch!r}; choose one of {sorted(set(arch_zoo))} '
                                  f'or pass a dict with embed_dims, depths and num_heads')
        return arch_zoo[arch.lower()]
    if not isinstance(arch, dict):
        raise MALAConfigError(f'MALA: arch must be a name or a dict, got {type(arch).__name__}')
    required = {'embed_dims', 'depths', 'num_heads'}
    allowed = required | set(CUSTOM_ARCH_DEFAULTS)
    if not required <= set(arch) or not set(arch) <= allowed:
        raise MALAConfigError(f'MALA: a custom arch needs {sorted(required)} and may set '
                              f'{sorted(CUSTOM_ARCH_DEFAULTS)}; got keys {sorted(arch)}')
    arch = {**CUSTOM_ARCH_DEFAULTS, **arch}
    lengths = {len(arch[key]) for key in required}
    if len(lengths) != 1:
        raise MALAConfigError(f'MALA: embed_dims, depths and num_heads need one entry per stage, got {arch}')
    if isinstance(arch['layer_scale_init'], (list, tuple)) and len(arch['layer_scale_init']) not in lengths:
        raise MALAConfigError(f'MALA: layer_scale_init needs one entry per stage, got {arch["layer_scale_init"]}')
    for stage, (channels, heads) in enumerate(zip(arch['embed_dims'], arch['num_heads'])):
        rope_head_dims(channels, heads, f'MALA: in stage {stage}, ', MALAConfigError)
    return arch


def resolve_attn_types(attn_types: Union[str, Sequence[str]], num_stages: int) -> List[str]:
    """One token mixer per stage, lower case; one string applies to every stage."""
    if isinstance(attn_types, str):
        attn_types = [attn_types] * num_stages
    attn_types = [kind.lower() for kind in attn_types]
    if len(attn_types) != num_stages or any(kind not in ATTENTION_KINDS for kind in attn_types):
        raise MALAConfigError(f'MALA: attn_types must be one of {sorted(ATTENTION_KINDS)} or a sequence of '
                              f'{num_stages} of them, got {attn_types}')
    return attn_types


def check_stages(out_indices: Sequence[int], frozen_stages: int, num_stages: int) -> None:
    if not out_indices or any(not 0 <= i < num_stages for i in out_indices):
        raise MALAConfigError(f'MALA: out_indices must be non-empty stage indices in [0, {num_stages}), '
                              f'got {out_indices}')
    if not -1 <= frozen_stages <= num_stages:
        raise MALAConfigError(f'MALA: frozen_stages must be in [-1, {num_stages}], got {frozen_stages}')


def resolve_init_cfg(init_cfg: Optional[dict], pretrained: Optional[str]) -> Optional[dict]:
    """``init_cfg``, or the ``Pretrained`` one that the deprecated ``pretrained`` path stands for, as mmdet's and
    mmseg's backbones take it (mmseg's segmentors hand their ``model.pretrained`` to the backbone)."""
    if pretrained is not None:
        if not isinstance(pretrained, str):
            raise MALAConfigError(f'MALA: pretrained must be a path or URL (or None), got {pretrained!r}')
        if init_cfg is not None:
            raise MALAConfigError(
                f'MALA: pretrained={pretrained!r} and init_cfg={init_cfg} are given together; give one of them '
                f'(where a config over an mmseg model base sets model.pretrained, which mmseg hands to the backbone, '
                f'set model.pretrained=None to keep the backbone\'s init_cfg)')
        # OpenMMLab's backbones' words, as a warning shown by default (a DeprecationWarning would be hidden)
        warnings.warn('DeprecationWarning: pretrained is deprecated, please use "init_cfg" instead', stacklevel=3)
        init_cfg = dict(type='Pretrained', checkpoint=pretrained)
    if init_cfg is not None and (not isinstance(init_cfg, dict) or init_cfg.get('type') != 'Pretrained'
                                 or not init_cfg.get('checkpoint')):
        raise MALAConfigError(f"MALA: init_cfg must be None (the release's initialisation) or "
                              f"dict(type='Pretrained', checkpoint=PATH_OR_URL[, prefix=...]), got {init_cfg}")
    return init_cfg


def check_compile(compile: Union[bool, dict]) -> Union[bool, dict]:
    """``compile`` if it is a bool or a dict of ``torch.compile`` arguments that this torch can take, else a
    :class:`MALAConfigError` saying why."""
    if compile is not True and compile is not False and not isinstance(compile, dict):
        raise MALAConfigError(f'MALA: compile must be a bool or a dict of torch.compile arguments, got {compile!r}')
    if compile is not False and not HAS_CUSTOM_OPS:
        raise MALAConfigError(f'MALA: compile needs torch >= 2.4 (its custom operators), this is {torch.__version__}')
    return compile
