"""RoPE of the softmax stages' queries and keys in one Triton kernel, forward and backward.

The qkvo projection's one conv writes q, k, v and o as channel slices of one map, and the backward keeps that map
alive for v and o (LePE's and the attention's). Rotated into tensors of their own, q and k would be kept twice:
here the kernel rotates them in place in the map, one launch for both (:func:`~mala_mm.ops.rope.apply_rope` takes
about five a tensor: casts, the pair swap, two products). The backward's one launch rotates q's and k's gradients
back and copies v's and o's beside them into the map's gradient, which the chunks' concatenation would otherwise
assemble in a launch of its own. The arithmetic is fp32, as apply_rope's.
"""
from typing import Callable, Iterator, Optional, Tuple

import torch
import triton
from torch import Tensor

from ..torch_compat import autocast_of
from ..triton_helpers import strides, unit_stride
from ..triton_launch import GPU, in_kernels_or_torch, launch, torch_gradients
from .kernels import rotate_qk_kernel
from .naive import split_heads


def kernel_options(head_dims: int, backward: bool) -> dict:
    """The kernel's constexprs and warps for heads of ``head_dims`` channels: a tile of the head width padded to a
    power of two by 4,096 elements' worth of tokens (at least 16) over 4 warps in the forward, which reads q's and
    k's, and by half as many over 8 warps in the backward, which reads all four maps' gradients: each compiles
    without spilling on every GPU Triton serves (with 4 warps, Triton 3.5 spilled 48 bytes a thread in the backward
    on sm_100 with fp16 maps)."""
    block_d = triton.next_power_of_2(head_dims)
    elements = 2048 if backward else 4096
    return dict(TRANSPOSED=backward, COPY_VO=backward, BLOCK_N=max(16, elements // block_d), BLOCK_D=block_d,
                num_warps=8 if backward else 4)


def rotate_qk_variants(gpu: GPU) -> Iterator[Tuple[object, dict]]:
    """(kernel, its options) of each variant the launcher makes (the same on every GPU)."""
    for head_dims in (64, 96):
        for backward in (False, True):
            yield rotate_qk_kernel, kernel_options(head_dims, backward)


def _map_with_heads_in_place(qkvo: Tensor) -> Tensor:
    """qkvo, or a channels-last copy where its heads are not views of it (its channels not adjacent in memory, or
    its rows not a whole number of columns apart), which the kernel could not write in place, or where its elements
    overlap (an expanded map: programs of different batch items or pixels would write one address twice)."""
    batch, channels, height, width = qkvo.shape
    heads_in_place = qkvo.stride(1) == 1 and (height == 1 or qkvo.stride(2) == width * qkvo.stride(3))
    # torch's own check before an in-place write: 0 no overlap, 1 overlap, 2 too involved to tell
    if heads_in_place and torch._debug_has_internal_overlap(qkvo) == 0:
        return qkvo
    return qkvo.contiguous(memory_format=torch.channels_last)


def _heads(maps, num_heads: int) -> list:
    """Each (B, C, H, W) map's (B, h, N, d) heads: views (:func:`_map_with_heads_in_place`)."""
    return [split_heads(m, num_heads) for m in maps]


def _launch(sources: list, outputs: list, cos: Tensor, sin: Tensor, num_heads: int, backward: bool) -> None:
    batch, _, num_tokens, head_dims = outputs[0].shape
    options = kernel_options(head_dims, backward)
    launch(rotate_qk_kernel, (triton.cdiv(num_tokens, options['BLOCK_N']) * batch * num_heads,),
           *sources, cos, sin, *outputs, *(s for t in sources for s in strides(t)), *strides(outputs[0]),
           num_heads, num_tokens, head_dims, **options)


class _RotateQK(torch.autograd.Function):

    @staticmethod
    def forward(ctx, qkvo: Tensor, cos: Tensor, sin: Tensor, num_heads: int, tables_type: type,
                torch_fallback: Optional[Callable]):
        qkvo = _map_with_heads_in_place(qkvo)
        cos, sin = cos.contiguous(), sin.contiguous()
        maps = qkvo.chunk(4, dim=1)
        q, k = _heads(maps[:2], num_heads)
        _launch([q, k, q, k], [q, k, q, k], cos, sin, num_heads, backward=False)
        # the kernel wrote q and k without autograd seeing it: a save of the map before now fails its backward
        torch.autograd.graph.increment_version(qkvo)
        ctx.save_for_backward(cos, sin)
        ctx.num_heads, ctx.tables_type, ctx.torch_fallback = num_heads, tables_type, torch_fallback
        ctx.map_shape, ctx.map_dtype, ctx.autocast = qkvo.shape, qkvo.dtype, autocast_of(qkvo)
        return q, k, maps[2], maps[3]

    @staticmethod
    def backward(ctx, grad_q: Tensor, grad_k: Tensor, grad_v: Tensor, grad_o: Tensor):
        cos, sin = ctx.saved_tensors
        grad_map = torch.empty(ctx.map_shape, dtype=ctx.map_dtype, device=cos.device,
                               memory_format=torch.channels_last)
        outputs = _heads(grad_map.chunk(4, dim=1), ctx.num_heads)
        # autograd hands zeros for an output that took no gradient
        sources = [unit_stride(g) for g in (grad_q, grad_k, *_heads((grad_v, grad_o), ctx.num_heads))]

        def in_kernels():
            _launch(sources, outputs, cos, sin, ctx.num_heads, backward=True)
            return grad_map

        def in_torch():  # the rotation is linear: its gradient does not depend on where it is taken
            tables = ctx.tables_type(cos, sin)
            return torch_gradients(lambda qkvo: ctx.torch_fallback(qkvo, tables, ctx.num_heads),
                                   (torch.zeros_like(grad_map),), (grad_q, grad_k, grad_v, grad_o), ctx.autocast)[0]
        grad_map = in_kernels_or_torch(in_kernels, ctx.torch_fallback, in_torch)
        return grad_map, None, None, None, None, None


def rotate_qk(qkvo: Tensor, tables, num_heads: int, torch_fallback: Optional[Callable] = None
              ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The qkvo map split as softmax attention takes it, q and k rotated in place in it, in one launch.

    Args:
        qkvo: (B, 4C, H, W), q, k, v and o, C channels each; channels-last (other layouts are copied to it first).
            Its q and k channels are overwritten: not a leaf that requires grad.
        tables: the (N, d) :class:`~mala_mm.ops.rope.RotaryTables`.
        num_heads: h, with C = h d.
        torch_fallback: where the backward's kernel fails on the GPU, the :class:`~mala_mm.ops.dispatch.Operator`
            that gives the gradient in torch operators instead; None: the error stops the backward.

    Returns:
        q's and k's (B, h, N, d) heads, rotated, and v's and o's (B, C, H, W) maps: views of the map, in its dtype.
    """
    if qkvo.dim() != 4 or qkvo.shape[1] % (4 * num_heads):
        raise ValueError(f'rotate_qk: expected a (B, 4C, H, W) map with C a multiple of {num_heads} heads, got '
                         f'{tuple(qkvo.shape)}')
    if qkvo.is_leaf and qkvo.requires_grad:
        raise ValueError('rotate_qk: the kernel writes q and k into qkvo, which must not be a leaf that requires '
                         'grad (pass a copy)')
    return _RotateQK.apply(qkvo, tables.cos, tables.sin, num_heads, type(tables), torch_fallback)
