"""Magnitude-aware linear attention in Triton kernels (:mod:`.mala_triton_kernels`), as an autograd function:
how one call splits its (B, h, N, d) features into tiles and chunks, and the four launches, two for the forward
and two for the backward.
"""
from typing import Optional, Tuple

import torch
import triton
from torch import Tensor

from .mala_triton_kernels import key_value_grad_kernel, output_kernel, query_grad_kernel, state_kernel

# programs the state reduction aims for, over all chunks, batch items and heads: a few per SM of a large GPU, so
# that one head of 64,000 tokens (MALA-T's first stage at 1333 x 800) spreads over the GPU
TARGET_PROGRAMS = 512


# whether the kernels run in Triton's interpreter (TRITON_INTERPRET=1 when this module was imported), which runs
# them on CPU tensors
INTERPRETED = not isinstance(state_kernel, triton.runtime.JITFunction)


def padded_head_dims(head_dims: int) -> int:
    """The head width a kernel's tile holds: the next power of two, at least 16 (``tl.dot``'s smallest tile)."""
    return max(16, triton.next_power_of_2(head_dims))


def _tiles(head_dims: int) -> Tuple[int, int, dict]:
    """BLOCK_N (tokens a tile), BLOCK_D (padded head width) and the launch options: a d x d fp32 state and its
    gradient stay in registers up to d = 64; wider heads (96 in MALA-B and -L) take half as many tokens a tile,
    twice the warps and no software pipelining: pipelined, the query gradient's kernel asks for 240 KiB of shared
    memory (Triton 3.6, d = 96), more than an H200's 227 KiB."""
    block_d = padded_head_dims(head_dims)
    if block_d <= 64:
        return 64, block_d, dict(num_warps=4)
    return 32, block_d, dict(num_warps=8, num_stages=1)


def _chunks(num_tokens: int, batch_heads: int, block_n: int) -> Tuple[int, int]:
    """(tokens a chunk, number of chunks) for the reductions over tokens: about TARGET_PROGRAMS programs in all."""
    blocks = triton.cdiv(num_tokens, block_n)
    wanted = max(1, min(blocks, TARGET_PROGRAMS // batch_heads))
    blocks_a_chunk = triton.cdiv(blocks, wanted)
    return blocks_a_chunk * block_n, triton.cdiv(blocks, blocks_a_chunk)


def strides(t: Tensor) -> Tuple[int, int, int]:
    """The batch, head and token strides of a (B, h, N, d) tensor, as the kernels take them."""
    return t.stride(0), t.stride(1), t.stride(2)


def heads_of_channels_last_map(like: Tensor) -> Tensor:
    """An empty (B, h, N, d) tensor like ``like``, laid out as the heads of a channels-last (B, h d, H, W) map: the
    skeleton turns it back into that map without a copy."""
    batch, heads, num_tokens, head_dims = like.shape
    return like.new_empty((batch, num_tokens, heads, head_dims)).transpose(1, 2)


def unit_stride(t: Tensor) -> Tensor:
    """t, or a copy of it, whose channels are adjacent in memory, as the kernels address them."""
    return t if t.stride(-1) == 1 else t.contiguous()


class _Plan:
    """How the kernels of one call split (B, h, N, d) features: tiles, chunks, grids and launch options."""

    def __init__(self, q: Tensor, cos: Optional[Tensor], sin: Optional[Tensor]):
        batch, self.heads, self.num_tokens, self.head_dims = q.shape
        self.scale = self.head_dims ** -0.5
        block_n, self.block_d, launch = _tiles(self.head_dims)
        self.batch_heads = batch * self.heads
        self.chunk_tokens, self.num_chunks = _chunks(self.num_tokens, self.batch_heads, block_n)
        self.chunk_grid = (self.num_chunks, self.batch_heads)
        self.tile_grid = (triton.cdiv(self.num_tokens, block_n), self.batch_heads)
        self.rope = (cos.contiguous(), sin.contiguous()) if cos is not None else (q, q)  # unread without RoPE
        self.options = dict(HAS_ROPE=cos is not None, BLOCK_N=block_n, BLOCK_D=self.block_d, **launch)
        self._like = q

    def partial_states(self) -> Tensor:
        """Room for each chunk's (d + 2) x d fp32 state."""
        return self._like.new_empty((self.batch_heads, self.num_chunks, self.block_d + 2, self.block_d),
                                    dtype=torch.float32)


class _FusedMALAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, cos: Optional[Tensor], sin: Optional[Tensor], eps: float):
        q, k, v = (unit_stride(t) for t in (q, k, v))
        plan = _Plan(q, cos, sin)
        partial = plan.partial_states()
        state_kernel[plan.chunk_grid](k, v, *plan.rope, partial, *strides(k), *strides(v), plan.heads,
                                      plan.num_tokens, plan.head_dims, plan.chunk_tokens, **plan.options)
        state = partial.sum(1)
        out = heads_of_channels_last_map(v)
        output_kernel[plan.tile_grid](q, state, *plan.rope, out, *strides(q), *strides(out), plan.heads,
                                      plan.num_tokens, plan.head_dims, plan.scale, eps, **plan.options)
        ctx.save_for_backward(q, k, v, cos, sin, state)
        ctx.eps = eps
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, cos, sin, state = ctx.saved_tensors
        grad = unit_stride(grad)
        plan = _Plan(q, cos, sin)
        dq, dk, dv = (heads_of_channels_last_map(t) for t in (q, k, v))
        partial = plan.partial_states()
        query_grad_kernel[plan.chunk_grid](
            q, grad, state, *plan.rope, dq, partial, *strides(q), *strides(grad), *strides(dq), plan.heads,
            plan.num_tokens, plan.head_dims, plan.chunk_tokens, plan.scale, ctx.eps, **plan.options)
        key_value_grad_kernel[plan.tile_grid](
            k, v, partial.sum(1), *plan.rope, dk, dv, *strides(k), *strides(v), *strides(dk), *strides(dv),
            plan.heads, plan.num_tokens, plan.head_dims, **plan.options)
        return dq, dk, dv, None, None, None


def fused_mala_attention(q: Tensor, k: Tensor, v: Tensor, rope=None, eps: float = 1e-6) -> Tensor:
    """:func:`~mala_mm.ops.attention.mala_attention` in Triton kernels, with the same arguments.

    Args:
        q, k, v: (B, h, N, d) fp32, bf16 or fp16 on one device, any strides (a view of a channels-last map's heads
            is read in place).
        rope: the (N, d) :class:`~mala_mm.ops.rope.RotaryTables`, or None.
        eps: keeps ``1 / z`` finite.

    Returns:
        (B, h, N, d) in v's dtype, laid out as the heads of a channels-last map.
    """
    cos, sin = (None, None) if rope is None else rope
    return _FusedMALAttention.apply(q, k, v, cos, sin, eps)
