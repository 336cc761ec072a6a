"""GELU of a training BatchNorm whose backward keeps only the norm's input.

Apart, the norm keeps its input for its backward and GELU keeps the norm's output: two maps, where the stem's maps
are the backbone's largest. Here the forward runs the same two torch operators, and the backward recomputes the
norm's output inside GELU's gradient, one Triton launch as GELU's own backward is, from the input and the batch's
statistics that the norm keeps anyway; then the norm's backward as torch runs it.
"""
from typing import Callable, Iterator, Optional, Tuple

import torch
import torch.nn.functional as F
import triton
from torch import Tensor

from ..torch_compat import autocast_of
from ..triton_helpers import channel_tile_shape, dense_channels_last
from ..triton_launch import GPU, in_kernels_or_torch, launch, torch_gradients
from .kernels import gelu_grad_kernel


def batch_norm_gelu_variants(gpu: GPU) -> Iterator[Tuple[object, dict]]:
    """(kernel, its options) of each variant the launcher makes (the same on every GPU): MALA's stems have 32 or 48
    channels."""
    block_p, block_c = channel_tile_shape(32)
    yield gelu_grad_kernel, dict(BLOCK_P=block_p, BLOCK_C=block_c)


class _BatchNormGELU(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, running_mean: Optional[Tensor],
                running_var: Optional[Tensor], momentum: float, eps: float, torch_fallback: Optional[Callable]):
        x = dense_channels_last(x)
        normed, mean, invstd = torch.native_batch_norm(x, weight, bias, running_mean, running_var, True, momentum,
                                                       eps)
        ctx.save_for_backward(x, weight, bias, mean, invstd)
        ctx.eps, ctx.momentum, ctx.torch_fallback, ctx.autocast = eps, momentum, torch_fallback, autocast_of(x)
        return F.gelu(normed)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight, bias, mean, invstd = ctx.saved_tensors
        grad = dense_channels_last(grad)

        def in_kernels():
            batch, channels, height, width = x.shape
            grad_normed = torch.empty_like(x)
            block_p, block_c = channel_tile_shape(channels)
            num_pixels = batch * height * width
            launch(gelu_grad_kernel, (triton.cdiv(num_pixels, block_p), triton.cdiv(channels, block_c)), x, grad, mean,
                   invstd, weight, bias, grad_normed, channels, num_pixels, BLOCK_P=block_p, BLOCK_C=block_c)
            return torch.ops.aten.native_batch_norm_backward(grad_normed, x, weight, None, None, mean, invstd, True,
                                                             ctx.eps, [True, True, True])

        def in_torch():  # the batch's statistics, as the forward took them; the running ones not updated again
            return torch_gradients(lambda *args: ctx.torch_fallback(*args, None, None, ctx.momentum, ctx.eps),
                                   (x, weight, bias), (grad,), ctx.autocast)
        grads = in_kernels_or_torch(in_kernels, ctx.torch_fallback, in_torch)
        return (*grads, None, None, None, None, None)


def batch_norm_gelu(x: Tensor, weight: Tensor, bias: Tensor, running_mean: Optional[Tensor],
                    running_var: Optional[Tensor], momentum: float, eps: float,
                    torch_fallback: Optional[Callable] = None) -> Tensor:
    """``GELU(BatchNorm(x))`` with the batch's statistics, keeping x alone for the backward.

    Args:
        x: (B, C, H, W), channels-last (other layouts are copied to it first), more than one value a channel.
        weight, bias: (C,) the norm's.
        running_mean, running_var: (C,) updated with ``momentum``, or None.
        eps: the norm's.
        torch_fallback: where the backward's kernel fails on the GPU, the :class:`~mala_mm.ops.dispatch.Operator`
            that gives the gradients in torch operators instead; None: the error stops the backward.

    Returns:
        (B, C, H, W) channels-last in x's dtype; its backward gives x's gradient in x's dtype and the parameters'
        in theirs.
    """
    return _BatchNormGELU.apply(x, weight, bias, running_mean, running_var, momentum, eps, torch_fallback)
