"""RoPE's rotation as the paper writes it: each channel pair ``(x_2m, x_2m+1)`` of a token turned by its angle
``theta``, ``(x_2m cos - x_2m+1 sin, x_2m sin + x_2m+1 cos)``; the reference of :mod:`.torch_ops` and
:mod:`.triton_ops`."""
from typing import NamedTuple, Tuple

import torch
from torch import Tensor


class RotaryTables(NamedTuple):
    """cos and sign-folded sin of every token's angles, each (N, d), float32 (float64 for float64 features).

    Both hold each pair's value at its two channels; ``sin`` holds ``-sin`` at even channels and ``+sin`` at odd
    ones, so that the torch operators and the kernels need only a swap of each channel pair, not a negation.
    """
    cos: Tensor
    sin: Tensor


def apply_rope(x: Tensor, tables: RotaryTables) -> Tensor:
    """(..., N, d) x rotated by the (N, d) tables, in the promoted dtype of x and the tables."""
    cos, sin = tables.cos[..., 0::2], tables.sin[..., 1::2]  # each pair's cos and sin
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """(B, C, H, W) to (B, h, N, d), tokens row-major and channels head-major; a view where x's channels are adjacent
    in memory (channels-last, or a channel slice of such a map)."""
    batch, channels, height, width = x.shape
    return x.permute(0, 2, 3, 1).reshape(batch, height * width, num_heads, channels // num_heads).transpose(1, 2)


def rotate_qk(qkvo: Tensor, tables: RotaryTables, num_heads: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The (B, 4C, H, W) map of q, k, v and o (C channels each, in that order) as softmax attention takes it: q's and
    k's (B, h, N, d) heads rotated by the (N, d) tables, and v's and o's (B, C, H, W) maps."""
    q, k, v, o = qkvo.chunk(4, dim=1)
    return apply_rope(split_heads(q, num_heads), tables), apply_rope(split_heads(k, num_heads), tables), v, o
