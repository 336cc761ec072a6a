"""Softmax attention, the token mixer of MALA's later stages: RoPE's rotation of q and k (:mod:`.rope`), then
torch's fused scaled dot-product attention, which forms no N x N matrix where it has a kernel for that."""
from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from .rope import RotaryTables, rotate_pair


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, rope: Optional[RotaryTables] = None,
                      impl: str = 'torch') -> Tensor:
    """``softmax(d^-1/2 q~ k~^T) v`` on RoPE-rotated raw q, k.

    Args:
        q, k, v: (B, h, N, d); rope: the (N, d) tables of :meth:`~mala_mm.models.layers.RoPE2d.tables`, or None.
        impl: how q and k are rotated (:func:`~.rope.rotate_pair`).
    """
    if rope is not None:
        q, k = rotate_pair(q, k, rope, impl)
    return F.scaled_dot_product_attention(q, k, v)
