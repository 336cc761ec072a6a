"""Softmax attention, the token mixer of MALA's later stages: RoPE's rotation of q and k, then torch's fused scaled
dot-product attention, which forms no N x N matrix where it has a kernel for that. Where the Triton kernels run, the
attention's skeleton rotates q and k in the projection's map first (:func:`~.rope.rotate_qk`)."""
from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from .rope import RotaryTables
from .rope import torch_ops as rope_ops


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, rope: Optional[RotaryTables] = None) -> Tensor:
    """``softmax(d^-1/2 q~ k~^T) v`` on RoPE-rotated raw q, k.

    Args:
        q, k, v: (B, h, N, d); rope: the (N, d) tables of :meth:`~mala_mm.models.layers.RoPE2d.tables`, or None
            where q and k come rotated (or take no RoPE).
    """
    if rope is not None:
        q, k = rope_ops.apply_rope(q, rope), rope_ops.apply_rope(k, rope)
    return F.scaled_dot_product_attention(q, k, v)
