"""The two token mixers of MALA: magnitude-aware linear attention and softmax attention.

Both share one skeleton (:class:`GatedAttention`); they differ only in the function that turns per-head
q, k, v into the attention result, :func:`mala_attention` or :func:`softmax_attention`.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .rope import RoPE2d, apply_rope

Rotations = Optional[Tensor]  # (N, d/2) complex rotations from RoPE2d.tables, or None


def _power_of_two_above(x: Tensor) -> Tensor:
    """``2^e`` with ``x = m 2^e``, ``1/2 <= m < 1`` (1 where x is 0): dividing by it is exact in every float format."""
    x = x.detach()
    return torch.ldexp(torch.ones_like(x), torch.frexp(x).exponent)


def mala_attention(q: Tensor, k: Tensor, v: Tensor, rope: Rotations = None, eps: float = 1e-6) -> Tensor:
    """Magnitude-aware linear attention in O(N d^2).

    The effective score of query i on key j is ``beta_i * s_ij - gamma_i`` with
    ``s_ij = phi(q_i).phi(k_j) d^-1/2 / N``, ``z_i = sum_j s_ij``, ``beta_i = 1 + 1/z_i``, ``gamma_i = z_i / N``,
    so every row sums to one and a larger ``|phi(q_i)|`` gives a spikier row. The N x N matrix is never formed.

    Under autocast, or with fp16/bf16 inputs, only the two matmuls run in low precision; ``phi``, ``z``, ``beta``
    and the mean of v are computed in fp32. ``beta`` amplifies any error of ``z`` when ``z`` is small, and
    ``elu(x) + 1`` computed in bf16 is 0 for x below about -6 where it should be ``e^x``. The matmul operands are
    scaled by powers of two to about unit size (per query, per head of keys, per value channel) and the product
    scaled back in fp32, so fp16 neither overflows nor underflows in between; powers of two are exact, so the
    fp32 result is unchanged.

    Args:
        q, k, v: (B, h, N, d) per-head projections.
        rope: (N, d/2) complex rotations from :meth:`RoPE2d.tables`, or None for no rotation.
        eps: keeps ``1 / z`` finite.

    Returns:
        (B, h, N, d) in the dtype of v.
    """
    num_tokens, head_dims = q.shape[-2:]
    scale = head_dims ** -0.5
    dtype, full = v.dtype, torch.promote_types(v.dtype, torch.float32)     # of the matmuls, of the normaliser
    with torch.autocast(q.device.type, enabled=False):
        q, k, v = F.elu(q.to(full)) + 1, F.elu(k.to(full)) + 1, v.to(full)  # phi(q), phi(k)
        z = scale * (q @ k.mean(-2, keepdim=True).transpose(-2, -1))         # z_i, un-rotated
        v_mean = v.mean(-2, keepdim=True)                                    # mean_j v_j
        # max |q_i| and max |k| become about 1, max |v| d^-1/2 / N about N^-1/2: KV stays below N^1/2
        q_unit = _power_of_two_above(q.amax(-1, keepdim=True))
        k_unit = _power_of_two_above(k.amax((-2, -1), keepdim=True))
        v_unit = _power_of_two_above(v.abs().amax(-2, keepdim=True) * (scale / num_tokens ** 0.5))
        q, k, v = q / q_unit, k / k_unit, v * (scale / num_tokens / v_unit)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)                  # q~, k~
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    kv = k.transpose(-2, -1) @ v  # KV = d^-1/2 / N sum_j k~_j^T v_j, over k_unit and v_unit
    beta = 1 + 1 / (z + eps)                                                     # beta_i
    y = beta * (q_unit * k_unit) * (q @ kv).to(full) * v_unit                  # beta_i q~_i KV
    return (y - z * v_mean).to(dtype)                                          # - gamma_i sum_j v_j (gamma_i N = z_i)


def linear_attention(q: Tensor, k: Tensor, v: Tensor, rope: Rotations = None, eps: float = 1e-6) -> Tensor:
    """Plain (magnitude-blind) linear attention ``phi(q~) (sum_j phi(k~_j)^T v_j) / (phi(q) sum_m phi(k_m)^T)``.

    The reference MALA improves on; the norm of ``phi(q_i)`` cancels between numerator and denominator.

    Args:
        q, k, v: (B, h, N, d); rope: (N, d/2) complex rotations or None.
    """
    q, k = F.elu(q) + 1, F.elu(k) + 1
    denominator = q @ k.sum(dim=-2, keepdim=True).transpose(-2, -1)     # (B, h, N, 1)
    if rope is not None:
        q, k = apply_rope(q, rope), apply_rope(k, rope)
    return (q @ (k.transpose(-2, -1) @ v)) / (denominator + eps)


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, rope: Rotations = None) -> Tensor:
    """``softmax(d^-1/2 q~ k~^T) v`` on RoPE-rotated raw q, k; fused kernels, no N x N matrix where available.

    Args:
        q, k, v: (B, h, N, d); rope: (N, d/2) complex rotations or None.
    """
    if rope is not None:
        q, k = apply_rope(q, rope), apply_rope(k, rope)
    return F.scaled_dot_product_attention(q, k, v)


class GatedAttention(nn.Module):
    """The attention skeleton shared by both kinds.

    ``qkvo`` projects (B, C, H, W) to q, k, v and an output gate o (C channels each, channels head-major);
    the result Y of :meth:`attend` leaves as ``proj((Y + LePE(v)) * o)``, with LePE a depth-wise 5x5 conv.

    Args:
        embed_dims: C.
        num_heads: h; C / h must be a multiple of 4 (2-D RoPE splits each head into rows and columns).
    """

    def __init__(self, embed_dims: int, num_heads: int):
        super().__init__()
        if embed_dims % num_heads:
            raise ValueError(f'{type(self).__name__}: {num_heads} heads do not divide {embed_dims} channels')
        if (embed_dims // num_heads) % 4:
            raise ValueError(f'{type(self).__name__}: head width {embed_dims // num_heads} '
                             f'({embed_dims} channels / {num_heads} heads) must be a multiple of 4 for 2-D RoPE')
        self.num_heads = num_heads
        self.qkvo = nn.Conv2d(embed_dims, 4 * embed_dims, 1)
        self.lepe = nn.Conv2d(embed_dims, embed_dims, 5, padding=2, groups=embed_dims)
        self.proj = nn.Conv2d(embed_dims, embed_dims, 1)

    @staticmethod
    def attend(q: Tensor, k: Tensor, v: Tensor, rope: Rotations) -> Tensor:
        """(B, h, N, d) q, k, v to the (B, h, N, d) attention result."""
        raise NotImplementedError

    def forward(self, x: Tensor, rope: Optional[RoPE2d] = None) -> Tensor:
        """x: (B, C, H, W); rope: the stage's RoPE (head width C / h), or None. Returns (B, C, H, W)."""
        batch, channels, height, width = x.shape
        q, k, v, o = self.qkvo(x).chunk(4, dim=1)
        lepe = self.lepe(v)

        def split_heads(t: Tensor) -> Tensor:  # (B, C, H, W) -> (B, h, N, d)
            return t.reshape(batch, self.num_heads, -1, height * width).transpose(-2, -1)

        tables = None if rope is None else rope.tables(height, width, dtype=q.dtype)
        y = self.attend(split_heads(q), split_heads(k), split_heads(v), tables)
        y = y.transpose(-2, -1).reshape(batch, channels, height, width)
        return self.proj((y + lepe) * o)


class MALAttention(GatedAttention):
    """Magnitude-aware linear attention (:func:`mala_attention`) in the gated skeleton."""
    attend = staticmethod(mala_attention)


class SoftmaxAttention(GatedAttention):
    """Softmax attention (:func:`softmax_attention`) in the gated skeleton."""
    attend = staticmethod(softmax_attention)
