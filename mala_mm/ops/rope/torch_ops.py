"""RoPE's rotation in torch operators: a swap of each channel pair and one ``addcmul``, the pair's sign in the
tables."""
from typing import Tuple

import torch
from torch import Tensor

from .naive import RotaryTables, split_heads


def apply_rope(x: Tensor, tables: RotaryTables) -> Tensor:
    """``RoPE(x) = x * cos + swap(x) * sin``, ``swap`` mapping each channel pair ``(x_2m, x_2m+1)`` to
    ``(x_2m+1, x_2m)`` and the sign-folded sin of the tables giving ``-x_2m+1 sin`` at even channels.

    Args:
        x: (..., N, d) features of N tokens.
        tables: the (N, d) tables of :meth:`~mala_mm.models.layers.RoPE2d.tables`.

    Returns:
        (..., N, d) in the dtype of x; the arithmetic in the tables' (fp32, or fp64).
    """
    features = x.to(tables.cos.dtype)
    return torch.addcmul(features * tables.cos, swap_pairs(features), tables.sin).to(x.dtype)


def rotate_back(x: Tensor, tables: RotaryTables) -> Tensor:
    """``R^T(x) = x * cos - swap(x) * sin``: the rotation by the opposite angles, which carries a gradient back
    through :func:`apply_rope`. x: (..., N, d) in the tables' dtype."""
    return torch.addcmul(x * tables.cos, swap_pairs(x), tables.sin, value=-1)


def swap_pairs(x: Tensor) -> Tensor:
    """Each channel pair ``(x_2m, x_2m+1)`` of (..., d) features as ``(x_2m+1, x_2m)``."""
    return x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)


def rotate_qk(qkvo: Tensor, tables: RotaryTables, num_heads: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The (B, 4C, H, W) qkvo map split as softmax attention takes it: q's and k's (B, h, N, d) heads rotated, v's
    and o's (B, C, H, W) maps (:func:`~.naive.rotate_qk`)."""
    q, k, v, o = qkvo.chunk(4, dim=1)
    return apply_rope(split_heads(q, num_heads), tables), apply_rope(split_heads(k, num_heads), tables), v, o
