"""RoPE of the softmax stages' queries and keys in one Triton kernel, forward and backward.

:func:`~mala_mm.ops.rope.torch_ops.apply_rope` takes about five launches a tensor (casts, the pair swap, two
products); here one launch rotates a tile of q and the same tile of k, reading them in place (strided views of a
map's heads) and writing the results in their dtype, laid out as (B, N, h, d), as flash attention reads them. The
arithmetic is fp32, as apply_rope's.
"""
from typing import Callable, Iterator, Optional, Tuple

import torch
import triton
from torch import Tensor

from ..triton_helpers import heads_of_channels_last_map, strides, unit_stride
from ..triton_launch import GPU, in_kernels_or_torch, launch, torch_gradients
from .kernels import rotate_pair_kernel


def kernel_options(head_dims: int, transposed: bool) -> dict:
    """The kernel's constexprs for heads of ``head_dims`` channels: a tile of 4,096 elements (at least 16 tokens)
    of the head width padded to a power of two, which compiles without spilling on every GPU Triton serves."""
    block_d = triton.next_power_of_2(head_dims)
    return dict(TRANSPOSED=transposed, BLOCK_N=max(16, 4096 // block_d), BLOCK_D=block_d)


def rotate_pair_variants(gpu: GPU) -> Iterator[Tuple[object, dict]]:
    """(kernel, its options) of each variant the launcher makes (the same on every GPU)."""
    for head_dims in (64, 96):
        for transposed in (False, True):
            yield rotate_pair_kernel, kernel_options(head_dims, transposed)


def _rotate(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, transposed: bool) -> Tuple[Tensor, Tensor]:
    q, k = unit_stride(q), unit_stride(k)
    batch, heads, num_tokens, head_dims = q.shape
    # in (B, N, h, d) memory, as flash attention reads its operands without a copy
    q_out, k_out = heads_of_channels_last_map(q), heads_of_channels_last_map(k)
    options = kernel_options(head_dims, transposed)
    launch(rotate_pair_kernel, (triton.cdiv(num_tokens, options['BLOCK_N']) * batch * heads,),
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
        return _rotate(q, k, cos, sin, transposed=False)

    @staticmethod
    def backward(ctx, grad_q: Tensor, grad_k: Tensor):
        cos, sin = ctx.saved_tensors
        tables = ctx.tables_type(cos, sin)
        # the rotation is linear: its gradient does not depend on where it is taken
        grads = in_kernels_or_torch(
            lambda: _rotate(grad_q, grad_k, cos, sin, transposed=True), ctx.torch_fallback,
            lambda: torch_gradients(lambda q, k: ctx.torch_fallback(q, k, tables),
                                    (torch.zeros_like(grad_q), torch.zeros_like(grad_k)), (grad_q, grad_k)))
        return (*grads, None, None, None, None)


def rotate_pair(q: Tensor, k: Tensor, tables, torch_fallback: Optional[Callable] = None) -> Tuple[Tensor, Tensor]:
    """``(apply_rope(q, tables), apply_rope(k, tables))`` in one launch.

    Args:
        q, k: (B, h, N, d) features of one shape, any strides.
        tables: the (N, d) :class:`~mala_mm.ops.rope.RotaryTables`.
        torch_fallback: where the backward's kernel fails on the GPU, the :class:`~mala_mm.ops.dispatch.Operator`
            that gives the gradients in torch operators instead; None: the error stops the backward.

    Returns:
        Two (B, h, N, d) tensors in the dtypes of q and k, laid out as the heads of a channels-last map.
    """
    return _RotatePair.apply(q, k, tables.cos, tables.sin, type(tables), torch_fallback)
