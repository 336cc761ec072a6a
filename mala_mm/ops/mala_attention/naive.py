"""Magnitude-aware linear attention as the paper writes it: every query's N scores, then their weighted sum of the
values. O(N^2 d) time and memory: the reference that the implementations are tested against, at the tests' sizes.

With ``phi(x) = elu(x) + 1``, ``s = d^-1/2``, N tokens and RoPE applied after the kernel
(``q~ = RoPE(phi(q))``, ``k~ = RoPE(phi(k))``)::

    z_i    = s phi(q_i) . mean_j phi(k_j)          (before RoPE, as released)
    beta_i = 1 + 1 / (z_i + eps),   gamma_i = z_i / N
    s_ij   = s q~_i . k~_j / N
    S_ij   = beta_i s_ij - gamma_i,   Y_i = sum_j S_ij v_j

A larger ``|phi(q_i)|`` gives a spikier row; each row of S sums to one where RoPE is the identity.
"""
from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from ..rope.naive import RotaryTables, apply_rope


def phi(x: Tensor) -> Tensor:
    """MALA's kernel, ``elu(x) + 1``: positive features."""
    return F.elu(x) + 1


def mala_scores(q: Tensor, k: Tensor, rope: Optional[RotaryTables] = None, eps: float = 1e-6) -> Tensor:
    """The (..., N, N) scores ``S_ij`` of (..., N, d) queries and keys, in their dtype."""
    num_tokens, head_dims = k.shape[-2:]
    s = head_dims ** -0.5
    phi_q, phi_k = phi(q), phi(k)
    z = s * phi_q @ phi_k.mean(-2, keepdim=True).transpose(-2, -1)
    beta, gamma = 1 + 1 / (z + eps), z / num_tokens
    if rope is not None:
        phi_q, phi_k = apply_rope(phi_q, rope), apply_rope(phi_k, rope)
    similarity = s * phi_q @ phi_k.transpose(-2, -1) / num_tokens
    return beta * similarity - gamma


def mala_attention(q: Tensor, k: Tensor, v: Tensor, rope: Optional[RotaryTables] = None, eps: float = 1e-6) -> Tensor:
    """``Y = S v`` for (..., N, d) q, k, v, in their dtype."""
    return mala_scores(q, k, rope, eps) @ v
