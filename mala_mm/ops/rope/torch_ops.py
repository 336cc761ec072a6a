"""RoPE's rotation in torch operators: a swap of each channel pair and one ``addcmul``, the pair's sign in the
tables."""
from typing import Tuple

import torch
from torch import Tensor

from .naive import RotaryTables


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


def rotate_pair(q: Tensor, k: Tensor, tables: RotaryTables) -> Tuple[Tensor, Tensor]:
    """q and k, each rotated by the tables."""
    return apply_rope(q, tables), apply_rope(k, tables)
