"""Magnitude-aware linear attention in Triton kernels (:mod:`.kernels`, :mod:`.grad_kernels`) as an autograd
function: how one call splits its (B, h, N, d) features into blocks, tiles and chunks on the GPU it runs on, and the
four launches, two for the forward and two for the backward.
"""
from typing import Callable, Iterator, Optional, Tuple

import torch
import triton
from torch import Tensor

from ..dispatch import release
from ..torch_compat import autocast_of
from ..triton_helpers import heads_of_channels_last_map, strides, unit_stride
from ..triton_launch import (GPU, INTERPRETER_GPU, gpu_of, in_kernels_or_torch, launch, registers_a_thread,
                             torch_gradients)
from .grad_kernels import key_value_grad_kernel, query_grad_kernel
from .kernels import output_kernel, state_kernel
from .shapes import check_shapes

# programs the state reduction aims for, over all chunks, batch items and heads: a few per SM of a large GPU, so
# that one head of 64,000 tokens (MALA-T's first stage at 1333 x 800) spreads over the GPU
TARGET_PROGRAMS = 512

KERNELS = (state_kernel, output_kernel, query_grad_kernel, key_value_grad_kernel)

# (tokens a tile, warps) of each kernel by the width of the state's blocks: the largest tiles that compile without
# spilling registers to local memory on every GPU Triton serves (tools/compile_kernels.py checks each GPU's plan)
TILES = {
    64: {'state_kernel': (32, 8), 'output_kernel': (16, 8), 'query_grad_kernel': (16, 8),
         'key_value_grad_kernel': (16, 8)},
    32: {'state_kernel': (32, 4), 'output_kernel': (32, 4), 'query_grad_kernel': (32, 8),
         'key_value_grad_kernel': (32, 4)},
}
# The query gradient of 96-wide heads (three 32-wide blocks) is at the registers' limit: with 32 tokens a tile,
# Triton 3.3 and 3.4 spill 24 to 176 bytes a thread on sm_80 with RoPE; with 16, Triton 3.9 spills 8 to 16 bytes
# on sm_90 and sm_100. Each takes the tile that it compiles without spilling.
if (3, 3) <= release(triton.__version__) < (3, 5):
    TILES[32]['query_grad_kernel'] = (16, 8)
TILES[16] = TILES[32]  # heads of 16 channels or fewer (tests, custom archs), with less in registers than 32
# Triton's interpreter pays for each operation as well as for each element, and has no registers to spill: there
# every kernel takes tiles of this many tokens
INTERPRETER_TOKENS = 64


def block_width(head_dims: int) -> int:
    """The width of the state's blocks for heads of ``head_dims`` channels: of 64, 32 and 16 (``tl.dot``'s
    smallest), the one that pads the head width least, the widest of those (96 takes three blocks of 32)."""
    return min((64, 32, 16), key=lambda width: (triton.cdiv(head_dims, width) * width, -width))


def kernel_options(kernel_name: str, head_dims: int, has_rope: bool, gpu: GPU) -> dict:
    """The constexprs and launch options of a kernel for heads of ``head_dims`` channels on ``gpu``."""
    block_d = block_width(head_dims)
    block_n, num_warps = TILES[block_d][kernel_name]
    if gpu is INTERPRETER_GPU:
        block_n = INTERPRETER_TOKENS
    return dict(HAS_ROPE=has_rope, BLOCK_N=block_n, BLOCK_D=block_d, NUM_BLOCKS=triton.cdiv(head_dims, block_d),
                num_warps=num_warps, num_stages=1, maxnreg=registers_a_thread(num_warps))


def mala_attention_variants(gpu: GPU) -> Iterator[Tuple[object, dict]]:
    """(kernel, its options) of each variant the launcher makes on ``gpu``: MALA-T/S's 64-wide heads and MALA-B/L's
    96-wide ones, with and without RoPE."""
    for head_dims in (64, 96):
        for has_rope in (False, True):
            for kernel in KERNELS:
                yield kernel, kernel_options(kernel.__name__, head_dims, has_rope, gpu)


class AttentionPlan:
    """How the kernels of one call split (B, h, N, d) features on the GPU they run on: the state's blocks, the
    chunks of the reductions over tokens, the grids and each kernel's options."""

    def __init__(self, q: Tensor, cos: Optional[Tensor], sin: Optional[Tensor]):
        batch, self.heads, self.num_tokens, self.head_dims = q.shape
        self.scale = self.head_dims ** -0.5
        self.batch_heads = batch * self.heads
        gpu = gpu_of(q)
        self.options = {kernel: kernel_options(kernel.__name__, self.head_dims, cos is not None, gpu)
                        for kernel in KERNELS}
        width = self.options[state_kernel]['BLOCK_D'] * self.options[state_kernel]['NUM_BLOCKS']
        self.state_shape = (width + 2, width)
        # the two kernels that reduce chunks share them: a chunk holds whole tiles of both
        chunk_block = max(self.options[kernel]['BLOCK_N'] for kernel in (state_kernel, query_grad_kernel))
        blocks = triton.cdiv(self.num_tokens, chunk_block)
        wanted = max(1, min(blocks, TARGET_PROGRAMS // max(1, self.batch_heads)))
        blocks_a_chunk = max(1, triton.cdiv(blocks, wanted))
        self.chunk_tokens, self.num_chunks = blocks_a_chunk * chunk_block, triton.cdiv(blocks, blocks_a_chunk)
        self.rope = (cos.contiguous(), sin.contiguous()) if cos is not None else (q, q)  # unread without RoPE
        self._like = q

    def chunk_grid(self) -> Tuple[int]:
        return (self.num_chunks * self.batch_heads,)

    def tile_grid(self, kernel) -> Tuple[int]:
        return (triton.cdiv(self.num_tokens, self.options[kernel]['BLOCK_N']) * self.batch_heads,)

    def partial_states(self) -> Tensor:
        """Room for each chunk's state, fp32."""
        return self._like.new_empty((self.batch_heads, self.num_chunks, *self.state_shape), dtype=torch.float32)


class _FusedMALAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, cos: Optional[Tensor], sin: Optional[Tensor], eps: float,
                rope_type: type, torch_fallback: Optional[Callable]):
        q, k, v = (unit_stride(t) for t in (q, k, v))
        plan = AttentionPlan(q, cos, sin)
        partial = plan.partial_states()
        launch(state_kernel, plan.chunk_grid(), k, v, *plan.rope, partial, *strides(k), *strides(v), plan.heads,
               plan.num_tokens, plan.head_dims, plan.chunk_tokens, plan.num_chunks, **plan.options[state_kernel])
        state = partial.sum(1)
        out = heads_of_channels_last_map(v)
        launch(output_kernel, plan.tile_grid(output_kernel), q, state, *plan.rope, out, *strides(q), *strides(out),
               plan.heads, plan.num_tokens, plan.head_dims, plan.scale, eps, **plan.options[output_kernel])
        ctx.save_for_backward(q, k, v, cos, sin, state)
        ctx.eps, ctx.rope_type, ctx.torch_fallback, ctx.autocast = eps, rope_type, torch_fallback, autocast_of(q)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, k, v, cos, sin, state = ctx.saved_tensors
        rope = None if cos is None else ctx.rope_type(cos, sin)
        grads = in_kernels_or_torch(
            lambda: _gradients(q, k, v, cos, sin, state, grad, ctx.eps), ctx.torch_fallback,
            lambda: torch_gradients(lambda *qkv: ctx.torch_fallback(*qkv, rope, ctx.eps), (q, k, v), (grad,),
                                    ctx.autocast))
        return (*grads, None, None, None, None, None)


def _gradients(q: Tensor, k: Tensor, v: Tensor, cos: Optional[Tensor], sin: Optional[Tensor], state: Tensor,
               grad: Tensor, eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    grad = unit_stride(grad)
    plan = AttentionPlan(q, cos, sin)
    dq, dk, dv = (heads_of_channels_last_map(t) for t in (q, k, v))
    partial = plan.partial_states()
    terms = q.new_empty((plan.batch_heads, 2, plan.num_tokens), dtype=torch.float32)  # z and dL/dz of each query
    launch(query_grad_kernel, plan.chunk_grid(), q, grad, state, *plan.rope, dq, partial, terms, *strides(q),
           *strides(grad), *strides(dq), plan.heads, plan.num_tokens, plan.head_dims, plan.chunk_tokens,
           plan.num_chunks, plan.scale, eps, **plan.options[query_grad_kernel])
    launch(key_value_grad_kernel, plan.tile_grid(key_value_grad_kernel), k, v, partial.sum(1), *plan.rope, dk, dv,
           *strides(k), *strides(v), *strides(dk), *strides(dv), plan.heads, plan.num_tokens, plan.head_dims,
           **plan.options[key_value_grad_kernel])
    return dq, dk, dv


def mala_attention(q: Tensor, k: Tensor, v: Tensor, rope=None, eps: float = 1e-6,
                   torch_fallback: Optional[Callable] = None) -> Tensor:
    """:func:`~mala_mm.ops.mala_attention.mala_attention` in Triton kernels, with the same arguments.

    Args:
        q, k, v: (B, h, N, d) fp32, bf16 or fp16 on one device, any strides (a view of a channels-last map's heads
            is read in place).
        rope: the (N, d) :class:`~mala_mm.ops.rope.RotaryTables`, or None.
        eps: keeps ``1 / z`` finite.
        torch_fallback: where a backward kernel fails on the GPU, the :class:`~mala_mm.ops.dispatch.Operator` that
            gives the gradients in torch operators instead; None: the error stops the backward.

    Returns:
        (B, h, N, d) in v's dtype, laid out as the heads of a channels-last map.

    Raises:
        ValueError: as the torch operators' entry (:func:`~.shapes.check_shapes`).
    """
    check_shapes(q, k, v, rope, v_width_of_q=True)
    cos, sin = (None, None) if rope is None else rope
    return _FusedMALAttention.apply(q, k, v, cos, sin, eps, type(rope), torch_fallback)
