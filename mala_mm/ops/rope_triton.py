"""RoPE of the softmax stages' queries and keys in one Triton kernel, forward and backward.

:func:`~mala_mm.ops.rope.apply_rope` takes about five launches a tensor (casts, the pair swap, two
products); here one launch rotates a tile of q and the same tile of k, reading them in place (strided views of a
map's heads) and writing the results in their dtype, laid out as (B, N, h, d), as flash attention reads them. The
arithmetic is fp32, as apply_rope's.
"""
from typing import Callable, Iterator, Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from .mala_triton import heads_of_channels_last_map, strides, unit_stride
from .mala_triton_kernels import SIZE_ARGS, load_tables, load_tile, rotate, rotate_transposed
from .triton_launch import GPU, in_kernels_or_torch, launch, torch_gradients


@triton.jit
def _rotate_tile(x_ptr, out_ptr, cos, sin, rows, cols, stride_xn, stride_on, num_tokens, head_dims,
                 TRANSPOSED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    x, valid = load_tile(x_ptr, stride_xn, rows, cols, num_tokens, head_dims)
    if TRANSPOSED:
        y = rotate_transposed(x, cos, sin, BLOCK_N, BLOCK_D)
    else:
        y = rotate(x, cos, sin, BLOCK_N, BLOCK_D)
    tl.store(out_ptr + rows[:, None] * stride_on + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=valid)


@triton.jit(do_not_specialize=SIZE_ARGS)
def _rotate_pair_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
                        stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                        stride_ob, stride_oh, stride_on,
                        num_heads, num_tokens, head_dims,
                        TRANSPOSED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """R (or R^T) of one tile of q and of k; both outputs have the strides stride_o*. One axis of programs, the
    tiles of a head adjacent."""
    tiles = tl.cdiv(num_tokens, BLOCK_N)
    block, bh = tl.program_id(0) % tiles, tl.program_id(0) // tiles
    batch, head = bh // num_heads, bh % num_heads
    rows = block * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    cos, sin = load_tables(cos_ptr, sin_ptr, rows, cols, num_tokens, head_dims)
    out = batch * stride_ob + head * stride_oh
    _rotate_tile(q_ptr + batch * stride_qb + head * stride_qh, q_out_ptr + out, cos, sin, rows, cols,
                 stride_qn, stride_on, num_tokens, head_dims, TRANSPOSED, BLOCK_N, BLOCK_D)
    _rotate_tile(k_ptr + batch * stride_kb + head * stride_kh, k_out_ptr + out, cos, sin, rows, cols,
                 stride_kn, stride_on, num_tokens, head_dims, TRANSPOSED, BLOCK_N, BLOCK_D)


def kernel_options(head_dims: int, transposed: bool) -> dict:
    """The kernel's constexprs for heads of ``head_dims`` channels: a tile of 4,096 elements (at least 16 tokens)
    of the head width padded to a power of two, which compiles without spilling on every GPU Triton serves."""
    block_d = triton.next_power_of_2(head_dims)
    return dict(TRANSPOSED=transposed, BLOCK_N=max(16, 4096 // block_d), BLOCK_D=block_d)


def variants(gpu: GPU) -> Iterator[Tuple[object, dict]]:
    """(kernel, its options) of each variant the launcher makes (the same on every GPU)."""
    for head_dims in (64, 96):
        for transposed in (False, True):
            yield _rotate_pair_kernel, kernel_options(head_dims, transposed)


def _rotate_pair(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, transposed: bool) -> Tuple[Tensor, Tensor]:
    q, k = unit_stride(q), unit_stride(k)
    batch, heads, num_tokens, head_dims = q.shape
    # in (B, N, h, d) memory, as flash attention reads its operands without a copy
    q_out, k_out = heads_of_channels_last_map(q), heads_of_channels_last_map(k)
    options = kernel_options(head_dims, transposed)
    launch(_rotate_pair_kernel, (triton.cdiv(num_tokens, options['BLOCK_N']) * batch * heads,),
           q, k, cos, sin, q_out, k_out, *strides(q), *strides(k), *strides(q_out), heads, num_tokens, head_dims,
           **options)
    return q_out, k_out


class _RotatePair(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, tables_type: type,
                torch_fallback: Optional[Callable]):
        if q.shape != k.shape:
            raise ValueError(f'rotate_pair: q and k must have one shape, got {tuple(q.shape)} and {tuple(k.shape)}')
        cos, sin = cos.contiguous(), sin.contiguous()
        ctx.save_for_backward(cos, sin)
        ctx.tables_type, ctx.torch_fallback = tables_type, torch_fallback
        return _rotate_pair(q, k, cos, sin, transposed=False)

    @staticmethod
    def backward(ctx, grad_q: Tensor, grad_k: Tensor):
        cos, sin = ctx.saved_tensors
        tables = ctx.tables_type(cos, sin)
        # the rotation is linear: its gradient does not depend on where it is taken
        grads = in_kernels_or_torch(
            lambda: _rotate_pair(grad_q, grad_k, cos, sin, transposed=True), ctx.torch_fallback,
            lambda: torch_gradients(lambda q, k: ctx.torch_fallback(q, k, tables),
                                    (torch.zeros_like(grad_q), torch.zeros_like(grad_k)), (grad_q, grad_k)))
        return (*grads, None, None, None, None)


def rotate_pair(q: Tensor, k: Tensor, tables, torch_fallback: Optional[Callable] = None) -> Tuple[Tensor, Tensor]:
    """``(apply_rope(q, tables), apply_rope(k, tables))`` in one launch.

    Args:
        q, k: (B, h, N, d) features of one shape, any strides.
        tables: the (N, d) :class:`~mala_mm.ops.rope.RotaryTables`.
        torch_fallback: where the backward's kernel fails on the GPU, the :class:`~.dispatch.Operator` that gives
            the gradients in torch operators instead; None: the error stops the backward.

    Returns:
        Two (B, h, N, d) tensors in the dtypes of q and k, laid out as the heads of a channels-last map.
    """
    return _RotatePair.apply(q, k, tables.cos, tables.sin, type(tables), torch_fallback)
