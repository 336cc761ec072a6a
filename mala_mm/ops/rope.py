"""RoPE's rotation of per-head features by the tables of :class:`~mala_mm.models.layers.rope.RoPE2d`: in torch
operators (:func:`apply_rope`), and for the softmax stages' q and k together (:func:`rotate_pair`) in one Triton
kernel (:mod:`.rope_triton`) where it runs."""
from typing import NamedTuple, Tuple

import torch
from torch import Tensor

from . import dispatch


class RotaryTables(NamedTuple):
    """cos and sign-folded sin of every token's angles, each (N, d), float32 (float64 for float64 features).

    ``sin`` holds ``-sin`` at even channels and ``+sin`` at odd ones, so that :func:`apply_rope` needs only a swap
    of each channel pair, not a negation.
    """
    cos: Tensor
    sin: Tensor


def apply_rope(x: Tensor, tables: RotaryTables) -> Tensor:
    """``RoPE(x) = x * cos + rot(x) * sin``, with ``rot`` mapping each channel pair ``(x_2m, x_2m+1)`` to
    ``(-x_2m+1, x_2m)``: each pair rotated by its angle.

    Args:
        x: (..., N, d) features of N tokens.
        tables: the (N, d) tables of :meth:`RoPE2d.tables`.

    Returns:
        (..., N, d) in the dtype of x.
    """
    features = x.to(tables.cos.dtype)
    swapped = features.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (x_2m+1, x_2m); the sign is in tables.sin
    return torch.addcmul(features * tables.cos, swapped, tables.sin).to(x.dtype)


def rotate_pair(q: Tensor, k: Tensor, tables: RotaryTables, impl: str = 'torch') -> Tuple[Tensor, Tensor]:
    """``(apply_rope(q, tables), apply_rope(k, tables))``: in one Triton launch where ``impl`` takes the kernels for
    q (:func:`~mala_mm.ops.dispatch.uses_triton`), which read q and k in place and lay the results out as the heads
    of channels-last maps; else in torch operators.

    Args:
        q, k: (B, h, N, d) features of one shape, any strides.
        tables: the (N, d) :class:`RotaryTables`.
        impl: 'auto', 'triton' or 'torch'.
    """
    if impl == 'torch':
        return _rotate_pair(q, k, tables)
    return dispatch.run(ROTATE_PAIR, impl, q, _fused_rotate_pair, q, k, tables)


def _rotate_pair(q: Tensor, k: Tensor, tables: RotaryTables) -> Tuple[Tensor, Tensor]:
    return apply_rope(q, tables), apply_rope(k, tables)


def _fused_rotate_pair(*args):
    return dispatch.rope_triton.rotate_pair(*args)


ROTATE_PAIR = dispatch.Operator('rotate_pair', _rotate_pair)
