"""The Triton helpers that several operators' kernels and launchers share: GELU and its slope, a tile of a head's
(N, d) matrix, RoPE's rotation of a tile (the attention's kernels rotate inside, RoPE's own kernel alone), and the
layouts that the launchers read and write."""
from typing import Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

# Triton compiles a kernel again where an integer argument moves between 1, multiples of 16 and other values; the
# number of tokens changes with every image size, so the kernels over tokens take it as a plain runtime value
TOKEN_ARGS = ['num_tokens']

# at most this many rows of partial sums in a backward's workspace, one per program (a chunk of tiles): with 64
# channels and a 5x5 kernel, 512 rows are 3.4 MB for the sum to read, and 512 programs are still several per SM of
# an H100 (132 SMs)
MAX_PARTIAL_ROWS = 512

# constants of GELU, 1 / sqrt(2) and 1 / sqrt(2 pi), which a compiled kernel reads only as constexpr globals
INV_SQRT2 = tl.constexpr(0.7071067811865476)
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)


@triton.jit
def gelu(x):
    """torch's exact GELU, x Phi(x)."""
    return 0.5 * x * (1 + tl.math.erf(x * INV_SQRT2))


@triton.jit
def gelu_slope(x):
    """The derivative of GELU: Phi(x) + x phi(x)."""
    return 0.5 * (1 + tl.math.erf(x * INV_SQRT2)) + x * tl.exp(-0.5 * x * x) * INV_SQRT_2PI


@triton.jit
def swap_pairs(x, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Each channel pair (x_2m, x_2m+1) of a (BLOCK_N, BLOCK_D) tile as (x_2m+1, x_2m)."""
    even, odd = tl.split(tl.reshape(x, (BLOCK_N, BLOCK_D // 2, 2)))
    return tl.reshape(tl.join(odd, even), (BLOCK_N, BLOCK_D))


@triton.jit
def rotate(x, cos, sin, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """R(x) = x cos + swap(x) sin, with sin sign-folded as in RotaryTables."""
    return x * cos + swap_pairs(x, BLOCK_N, BLOCK_D) * sin


@triton.jit
def rotate_transposed(g, cos, sin, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """R^T(g) = g cos - swap(g) sin: a pair's two sines differ only in sign."""
    return g * cos - swap_pairs(g, BLOCK_N, BLOCK_D) * sin


@triton.jit
def load_tile(ptr, stride_n, rows, cols, num_tokens, head_dims):
    """A (rows, cols) tile of a (N, d) matrix as fp32, zero outside it, and where it lies inside."""
    valid = (rows[:, None] < num_tokens) & (cols[None, :] < head_dims)
    return tl.load(ptr + rows[:, None] * stride_n + cols[None, :], mask=valid, other=0.0).to(tl.float32), valid


@triton.jit
def load_tables(cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims):
    """The (rows, cols) tiles of the (N, d) RoPE tables."""
    cos, _ = load_tile(cos_ptr, head_dims, rows, cols, num_tokens, head_dims)
    sin, _ = load_tile(sin_ptr, head_dims, rows, cols, num_tokens, head_dims)
    return cos, sin


def strides(t: Tensor) -> Tuple[int, int, int]:
    """The batch, head and token strides of a (B, h, N, d) tensor, as the kernels take them."""
    return t.stride(0), t.stride(1), t.stride(2)


def heads_of_channels_last_map(like: Tensor) -> Tensor:
    """An empty (B, h, N, d) tensor like ``like``, laid out as the heads of a channels-last (B, h d, H, W) map: the
    attention's skeleton turns it back into that map without a copy, and flash attention reads it as it is."""
    batch, heads, num_tokens, head_dims = like.shape
    return like.new_empty((batch, num_tokens, heads, head_dims)).transpose(1, 2)


def channel_tile_shape(channels: int) -> Tuple[int, int]:
    """(BLOCK_P, BLOCK_C) of a tile of pixels by channels of a channels-last map: 1024 elements, at most 32 channels
    (MALA's maps have multiples of 32: no tile half empty), which the depth-wise and elementwise kernels compile
    without spilling on every GPU Triton serves (tools/compile_kernels.py)."""
    block_c = min(32, triton.next_power_of_2(channels))
    return 1024 // block_c, block_c


def dense_channels_last(t: Tensor) -> Tensor:
    """t, or a copy of it, as a dense channels-last map: kernels that address (pixel, channel) as pixel * C + c."""
    return t.contiguous(memory_format=torch.channels_last)


def unit_stride(t: Tensor) -> Tensor:
    """t, or a copy of it, whose channels are adjacent in memory, as the kernels address them."""
    return t if t.stride(-1) == 1 else t.contiguous()
