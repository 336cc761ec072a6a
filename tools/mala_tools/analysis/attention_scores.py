"""What one MALA block attends to, and how the three kinds of attention react to the query's magnitude.

For one image, stage and block, q and k are taken from the block's own projection (``attn.qkvo`` on the block's
normalised input). From the same q, k the score matrices of MALA, plain linear attention and softmax attention are
computed with the package's attention functions: fed the identity matrix as values, each returns its N x N score
matrix (every kind is linear in v). The magnitude experiment is the paper's: φ(q) is multiplied by a factor (q
itself for softmax, which has no φ) and the rows' max score and entropy are measured; softmax and MALA sharpen as
the query grows, plain linear attention cannot. RoPE is left out there, so that every MALA and linear row sums to
one and only the query's magnitude changes.
"""
import math
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from mala_mm.models import MALA
from mala_mm.ops.mala_attention import mala_attention
from mala_mm.ops.rope import RotaryTables
from mala_mm.ops.softmax_attention import softmax_attention
from mala_tools.analysis.baselines import linear_attention

KINDS = {'MALA': mala_attention, 'linear': linear_attention, 'softmax': softmax_attention}


@dataclass
class BlockAttention:
    """What one attention module saw and produced on an image."""
    q: Tensor  # (B, h, N, d) raw projections, before φ and RoPE
    k: Tensor
    v: Tensor
    rope: RotaryTables  # the stage's (N, d) RoPE tables
    height: int  # the token map
    width: int
    qkvo: Tuple[Tensor, Tensor, Tensor, Tensor]  # the projection's (B, C, H, W) q, k, v, o
    output: Tensor  # (B, C, H, W) the module's output


def capture_block(backbone: MALA, images: Tensor, stage: int, block: int) -> BlockAttention:
    """Run ``backbone`` on ``images`` and record the q, k, v of ``layers[stage].blocks[block].attn``."""
    attn = backbone.layers[stage].blocks[block].attn
    seen = {}
    hooks = [attn.qkvo.register_forward_hook(lambda module, args, out: seen.update(qkvo=out)),
             attn.register_forward_hook(lambda module, args, out: seen.update(output=out))]
    try:
        with torch.no_grad():
            backbone(images)
    finally:
        for hook in hooks:
            hook.remove()
    q, k, v, o = seen['qkvo']
    height, width = q.shape[-2:]
    rope = backbone.layers[stage].RoPE.tables(height, width, dtype=q.dtype)
    return BlockAttention(attn.split_heads(q), attn.split_heads(k), attn.split_heads(v), rope, height, width,
                          (q, k, v, o), seen['output'])


def score_matrix(kind: str, q: Tensor, k: Tensor, rope: Optional[RotaryTables]) -> Tensor:
    """(..., N, N) scores of ``kind`` from (..., N, d) q, k: the attention of the identity matrix as values."""
    num_tokens = q.shape[-2]
    identity = torch.eye(num_tokens, dtype=q.dtype, device=q.device).expand(*q.shape[:-2], -1, -1)
    return KINDS[kind](q, k, identity, rope)


def scale_query(kind: str, q: Tensor, factor: float) -> Tensor:
    """The raw query whose feature is ``factor`` times q's: φ(q) for MALA and linear, q itself for softmax."""
    if kind == 'softmax':
        return q * factor
    scaled = factor * (F.elu(q) + 1)
    return torch.where(scaled > 1, scaled - 1, torch.log(scaled))  # φ^-1, φ(x) = x + 1 (x > 0), e^x (x <= 0)


def row_statistics(scores: Tensor) -> Dict[str, float]:
    """Mean over rows of N x max score and of the normalised entropy of the positive part of the row."""
    num_tokens = scores.shape[-1]
    positive = scores.clamp(min=0)
    p = positive / positive.sum(-1, keepdim=True).clamp(min=1e-30)
    entropy = -(p * torch.log(p.clamp(min=1e-30))).sum(-1) / math.log(num_tokens)
    return dict(max=float(num_tokens * scores.amax(-1).mean()), entropy=float(entropy.mean()))


def magnitude_curves(attention: BlockAttention, head: int, factors: Sequence[float]) -> Dict[str, dict]:
    """{kind: {'max': [...], 'entropy': [...]}} over ``factors`` for one head of ``attention``, without RoPE."""
    q, k = attention.q[:, head:head + 1], attention.k[:, head:head + 1]
    curves = {}
    for kind in KINDS:
        stats = [row_statistics(score_matrix(kind, scale_query(kind, q, f), k, None)) for f in factors]
        curves[kind] = {name: [s[name] for s in stats] for name in ('max', 'entropy')}
    return curves
