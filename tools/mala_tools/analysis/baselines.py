"""Attention that no MALA model computes, kept as the baseline MALA is compared with."""
from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from mala_mm.ops.rope import RotaryTables, apply_rope


def linear_attention(q: Tensor, k: Tensor, v: Tensor, rope: Optional[RotaryTables] = None,
                     eps: float = 1e-6) -> Tensor:
    """Plain (magnitude-blind) linear attention ``phi(q~) (sum_j phi(k~_j)^T v_j) / (phi(q) sum_m phi(k_m)^T)``.

    The reference MALA improves on, where the norm of ``phi(q_i)`` cancels between numerator and denominator: the
    comparison baseline of ``benchmarks/attention_op.py``, of the attention-insight tool and of the tests of
    magnitude awareness.

    Args:
        q, k, v: (B, h, N, d); rope: (N, d) tables from :meth:`RoPE2d.tables`, or None.
    """
    q, k = F.elu(q) + 1, F.elu(k) + 1
    denominator = q @ k.sum(dim=-2, keepdim=True).transpose(-2, -1)     # (B, h, N, 1)
    if rope is not None:
        q, k = apply_rope(q, rope), apply_rope(k, rope)
    return (q @ (k.transpose(-2, -1) @ v)) / (denominator + eps)
