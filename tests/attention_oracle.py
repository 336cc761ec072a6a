"""MALA written out as an explicit N x N score matrix, the reference the linear-time implementation is tested
against, in every precision.

With phi(x) = elu(x) + 1 and scale d^-1/2, MALA (Magnitude-Aware Linear Attention, ICCV 2025) weighs value j
for query i by

    S_ij = beta_i s_ij - gamma_i,    s_ij = scale RoPE(phi(q_i)) . RoPE(phi(k_j)) / N,
    z_i = scale phi(q_i) . mean_j phi(k_j),    beta_i = 1 + 1 / (z_i + 1e-6),    gamma_i = z_i / N,

so that y_i = sum_j S_ij v_j. z uses the un-rotated features, so without RoPE each row of S sums to one.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from mala_mm.models.layers import RotaryTables, apply_rope

EPS = 1e-6


def phi(x: Tensor) -> Tensor:
    return F.elu(x) + 1


def explicit_mala_scores(q: Tensor, k: Tensor, rope: Optional[RotaryTables] = None, rows=slice(None)) -> Tensor:
    """Rows ``rows`` of S, term by term: (..., rows, N) for q, k of shape (..., N, d)."""
    scale = q.shape[-1] ** -0.5
    num_tokens = k.shape[-2]
    fq, fk = phi(q[..., rows, :]), phi(k)
    z = scale * fq @ fk.mean(-2, keepdim=True).transpose(-2, -1)          # (..., rows, 1)
    if rope is not None:
        fq = apply_rope(fq, RotaryTables(rope.cos[rows], rope.sin[rows]))
        fk = apply_rope(fk, rope)
    s = scale * fq @ fk.transpose(-2, -1) / num_tokens                    # s_ij
    beta, gamma = 1 + 1 / (z + EPS), z / num_tokens
    return beta * s - gamma


def explicit_mala_attention(q: Tensor, k: Tensor, v: Tensor, rope: Optional[RotaryTables] = None,
                            rows_at_a_time: int = 1024) -> Tensor:
    """y = S v in float64, S built ``rows_at_a_time`` query rows at a time (S of 128 x 128 tokens alone would
    take 2 GiB)."""
    q, k, v = (t.double() for t in (q, k, v))
    rope = None if rope is None else RotaryTables(*(t.double() for t in rope))
    return torch.cat([explicit_mala_scores(q, k, rope, slice(start, start + rows_at_a_time)) @ v
                      for start in range(0, q.shape[-2], rows_at_a_time)], dim=-2)
