"""MALA's backbone written out explicitly from the spec: the release comparison's oracle and the benchmarks'
baseline.

Development code, not part of the installed package: ``from mala_tools import reference``. Nothing here calls the
forward code of :mod:`mala_mm.models`: every block is computed term by term, in the default NCHW layout, with the
RoPE tables rebuilt from the spec's angles in every block and heads split by reshape + transpose + contiguous copy;
the attention formulas are the ops' plain references (``mala_mm.ops.<op>.naive``). Only plain torch layers (convs,
norms) are reused, through their parameters.

:func:`mala_attention` evaluates MALA (:mod:`mala_mm.ops.mala_attention.naive`) in either of two orders:

- ``'scores'``: the N x N matrix S, then S v; O(N^2 d). The oracle: every score is a term of the formula.
- ``'release'``: the release's order, ``KV = (k~ sqrt(s/N))^T (v sqrt(s/N))`` (d x d per head), then
  ``y = q~ KV beta - z mean(v)``; O(N d^2). Needed where N x N does not fit: stage 0 of a 1280 x 800 image has
  N = 64,000 tokens, whose S takes 16 GB in fp32 for every head.

Softmax attention is always explicit: ``softmax(s q~ k~^T) v`` through its N x N matrix.

:func:`reference_backbone` copies a :class:`mala_mm.MALA` with its weights and gives it this forward. The
benchmarks time it with ``mala_order='release'``. Everything here computes in the dtype of its inputs, so fp64
inputs give an fp64 reference, and under autocast its matmuls run in the autocast dtype as the release's would.
"""
import copy
import functools
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mala_mm.models.layers import MALAttention
from mala_mm.ops.mala_attention import naive
from mala_mm.ops.rope.naive import RotaryTables, apply_rope
from mala_mm.ops.self_check import relative_error  # noqa: F401  (the tools' and benchmarks' measure)

EPS = 1e-6
MALA_ORDERS = ('scores', 'release')


def rope_frequencies(head_dims: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The spec's ``a``: ``F = d / 4`` frequencies ``1 / 10000 ** linspace(0, 1, F)``, each twice in place; (d/2,).

    A released model stores ``a`` in its checkpoint (``layers.{i}.RoPE.angle``); :func:`reference_backbone` uses
    that buffer, and this builds it for the attention alone.
    """
    theta = 1 / 10000 ** torch.linspace(0, 1, head_dims // 4, dtype=dtype)
    return theta.repeat_interleave(2)


def rope_angles(frequencies: Tensor, height: int, width: int) -> Tensor:
    """The (H W, d) rotation angles of a map's tokens, row-major: ``concat(row * a, column * a)``."""
    rows = torch.arange(height, dtype=frequencies.dtype, device=frequencies.device)
    columns = torch.arange(width, dtype=frequencies.dtype, device=frequencies.device)
    row_angles = (rows[:, None, None] * frequencies).expand(height, width, -1)
    column_angles = (columns[None, :, None] * frequencies).expand(height, width, -1)
    return torch.cat([row_angles, column_angles], dim=-1).flatten(0, 1)


def rope_tables(angles: Tensor) -> RotaryTables:
    """The (N, d) tables of ``angles`` in the layout of :class:`~mala_mm.ops.rope.RotaryTables`: each channel's
    cos, and its sin signed as the rotation ``(x_2m, x_2m+1) -> (x_2m cos - x_2m+1 sin, x_2m sin + x_2m+1 cos)``
    weighs its partner (- at even channels)."""
    sign = torch.ones(angles.shape[-1], dtype=angles.dtype, device=angles.device)
    sign[0::2] = -1
    return RotaryTables(angles.cos(), angles.sin() * sign)


def mala_attention(q: Tensor, k: Tensor, v: Tensor, angles: Optional[Tensor] = None,
                   order: str = 'scores') -> Tensor:
    """MALA's y = S v for (..., N, d) q, k, v, in the evaluation ``order`` 'scores' or 'release' (module doc)."""
    rope = None if angles is None else rope_tables(angles)
    if order == 'scores':
        return naive.mala_attention(q, k, v, rope, EPS)
    if order == 'release':
        scale = q.shape[-1] ** -0.5
        phi_q, phi_k = naive.phi(q), naive.phi(k)
        z = scale * phi_q @ phi_k.mean(-2, keepdim=True).transpose(-2, -1)
        beta = 1 + 1 / (z + EPS)
        if rope is not None:
            phi_q, phi_k = apply_rope(phi_q, rope), apply_rope(phi_k, rope)
        # the release scales both factors of KV by sqrt(s / N) rather than KV by s / N
        factor = (scale / k.shape[-2]) ** 0.5
        kv = (phi_k * factor).transpose(-2, -1) @ (v * factor)
        return phi_q @ kv * beta - z * v.mean(-2, keepdim=True)
    raise ValueError(f'MALA evaluation order must be one of {MALA_ORDERS}, got {order!r}')


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, angles: Optional[Tensor] = None) -> Tensor:
    """``softmax(d^-1/2 q~ k~^T) v`` on the raw q, k (rotated where angles are given), through the N x N matrix."""
    if angles is not None:
        tables = rope_tables(angles)
        q, k = apply_rope(q, tables), apply_rope(k, tables)
    return (q.shape[-1] ** -0.5 * q @ k.transpose(-2, -1)).softmax(-1) @ v


def gated_attention(attn: nn.Module, x: Tensor, frequencies: Tensor, mala_order: str = 'scores') -> Tensor:
    """The attention skeleton on the parameters of ``attn`` (a :class:`mala_mm.models.layers.GatedAttention`):
    ``proj((Y + LePE(v)) * o)`` with q, k, v, o the four C-channel chunks of the 1x1 ``qkvo`` conv.

    x: (B, C, H, W); frequencies: the stage's RoPE ``a``. MALA for a :class:`MALAttention`, softmax otherwise.
    """
    batch, channels, height, width = x.shape
    heads = attn.num_heads
    q, k, v, o = F.conv2d(x, attn.qkvo.weight, attn.qkvo.bias).chunk(4, dim=1)
    lepe = F.conv2d(v, attn.lepe.weight, attn.lepe.bias, padding=attn.lepe.kernel_size[0] // 2, groups=channels)
    angles = rope_angles(frequencies, height, width)

    def split_heads(t):  # channel c is position c % d of head c // d; tokens row-major
        return t.reshape(batch, heads, channels // heads, height * width).transpose(-2, -1).contiguous()

    q, k, v = split_heads(q), split_heads(k), split_heads(v)
    if isinstance(attn, MALAttention):
        y = mala_attention(q, k, v, angles, mala_order)
    else:
        y = softmax_attention(q, k, v, angles)
    y = y.transpose(-2, -1).reshape(batch, channels, height, width)
    return attn.proj((y + lepe) * o)


def _layer_norm(norm: nn.Module, x: Tensor) -> Tensor:
    """LayerNorm over the channels of (B, C, H, W) with the parameters of a LayerNorm2d."""
    inner = norm.norm
    return F.layer_norm(x.permute(0, 2, 3, 1), inner.normalized_shape, inner.weight, inner.bias,
                        inner.eps).permute(0, 3, 1, 2)


def _residual_depthwise(conv: nn.Conv2d, x: Tensor) -> Tensor:
    """``x + DWConv(x)`` with the weights of a residual depth-wise conv."""
    return x + F.conv2d(x, conv.weight, conv.bias, padding=conv.kernel_size[0] // 2, groups=conv.groups)


def _layer_scaled(gamma: Optional[Tensor], x: Tensor) -> Tensor:
    return x if gamma is None else gamma * x


def block_forward(block: nn.Module, x: Tensor, frequencies: Tensor, mala_order: str = 'scores') -> Tensor:
    """One MALA block on the parameters of ``block``, as in eval (no stochastic depth): CPE, then attention and FFN,
    each pre-norm and residual."""
    x = _residual_depthwise(block.pos, x)
    attn = gated_attention(block.attn, _layer_norm(block.norm1, x), frequencies, mala_order)
    x = x + _layer_scaled(block.gamma_1, attn)
    ffn = block.ffn
    hidden = F.gelu(ffn.fc1(_layer_norm(block.norm2, x)))
    out = ffn.fc2(_residual_depthwise(ffn.dwconv, hidden))
    return x + _layer_scaled(block.gamma_2, out)


def backbone_forward(model: nn.Module, x: Tensor, mala_order: str = 'scores') -> tuple:
    """The dense backbone on the parameters of a :class:`mala_mm.MALA`: per out index, the stage's output before
    its downsample, through its extra LayerNorm, as contiguous NCHW."""
    x = model.patch_embed.proj(x)
    outs = []
    for i, stage in enumerate(model.layers):
        for block in stage.blocks:
            x = block_forward(block, x, stage.RoPE.angle, mala_order)
        if i in model.out_indices:
            outs.append(_layer_norm(model.extra_norms[str(i)], x).contiguous())
        if stage.downsample is not None:
            x = stage.downsample.norm(stage.downsample.reduction(x))
    return tuple(outs)


def reference_backbone(model: nn.Module, mala_order: str = 'scores') -> nn.Module:
    """A deep copy of a :class:`mala_mm.MALA` (same weights, buffers, modes) whose forward is
    :func:`backbone_forward` with MALA in ``mala_order``; ``.double()`` on it gives the fp64 reference."""
    if mala_order not in MALA_ORDERS:
        raise ValueError(f'MALA evaluation order must be one of {MALA_ORDERS}, got {mala_order!r}')
    reference = copy.deepcopy(model)
    reference.forward = functools.partial(backbone_forward, reference, mala_order=mala_order)
    return reference
