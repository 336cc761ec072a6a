"""The fused depth-wise convolutions' launchers and autograd functions: how a call splits its maps into tiles, and
the one launch of its forward and of its backward (:mod:`.kernels`, :mod:`.grad_kernels`)."""
from typing import Callable, Iterator, Optional, Tuple

import torch
import triton
from torch import Tensor

from ..torch_compat import autocast_dtype, autocast_enabled, autocast_of
from ..triton_helpers import MAX_PARTIAL_ROWS, channel_tile_shape
from ..triton_launch import (GPU, INTERPRETER_GPU, gpu_of, in_kernels_or_torch, launch, registers_a_thread,
                             torch_gradients)
from .grad_kernels import gated_conv_grad_kernel, residual_conv_grad_kernel
from .kernels import gated_conv_kernel, residual_conv_kernel


def _channels_adjacent(t: Tensor) -> Tensor:
    """t, or a channels-last copy where its channels are not adjacent in memory, as the kernels address them."""
    return t if t.stride(1) == 1 else t.contiguous(memory_format=torch.channels_last)


def _map_strides(t: Tensor) -> Tuple[int, int, int]:
    """The batch, row and column strides of a (B, C, H, W) map, as the kernels take them."""
    return t.stride(0), t.stride(2), t.stride(3)


def _check_shapes(name: str, like: Tensor, weight: Tensor, bias: Tensor):
    kernel = weight.shape[-1]
    if (like.dim() != 4 or weight.shape != (like.shape[1], 1, kernel, kernel) or kernel % 2 == 0
            or bias.shape != (like.shape[1],)):
        raise ValueError(f'{name}: expected (B, C, H, W) maps, a (C, 1, k, k) weight with k odd and a (C,) bias, got '
                         f'{tuple(like.shape)}, {tuple(weight.shape)} and {tuple(bias.shape)}')


def residual_depthwise_conv_variants(gpu: GPU) -> Iterator[Tuple[object, dict]]:
    """(kernel, its options) of each variant the launcher makes (the same on every GPU): the position encoding's
    and the FFN's 3x3 convs."""
    plan = DepthwisePlan(torch.empty(1, 64, 8, 8), torch.empty(64, 1, 3, 3), gpu)
    for gelu, copy in ((False, False), (False, True), (True, False)):  # the copy: of the fp32 stream, under autocast
        yield residual_conv_kernel, dict(plan.options, GELU=gelu, COPY=copy)
    for gelu in (False, True):
        yield residual_conv_grad_kernel, dict(plan.grad_options, GELU=gelu)


def gated_depthwise_conv_variants(gpu: GPU) -> Iterator[Tuple[object, dict]]:
    """(kernel, its options) of each variant the launcher makes (the same on every GPU): LePE's 5x5 conv."""
    plan = DepthwisePlan(torch.empty(1, 64, 8, 8), torch.empty(64, 1, 5, 5), gpu)
    yield gated_conv_kernel, dict(plan.options)
    yield gated_conv_grad_kernel, dict(plan.grad_options)


class DepthwisePlan:
    """How the kernels of one call split (B, C, H, W) maps: tiles of pixels by channels, for the forward one
    program a tile, for the backward one program a chunk of tiles_per_program tiles."""

    def __init__(self, like: Tensor, weight: Tensor, gpu: GPU):
        batch, self.channels, height, width = like.shape
        num_pixels = batch * height * width
        self.kernel = weight.shape[-1]
        block_p, block_c = channel_tile_shape(self.channels)  # over 8 warps: 4 elements a thread
        if gpu is INTERPRETER_GPU:
            # Triton's interpreter pays for each operation as well as for each element: there a backbone's maps take
            # at most about eight tiles of pixels (the tests' small maps keep the GPU's tiles and cross their
            # boundaries), which takes its tests' time through these kernels to a third
            block_p = max(block_p, triton.next_power_of_2(triton.cdiv(num_pixels, 8)))
        tiles, channel_tiles = triton.cdiv(num_pixels, block_p), triton.cdiv(self.channels, block_c)
        self.tiles_per_program = max(1, triton.cdiv(tiles, MAX_PARTIAL_ROWS))  # an empty batch has no tiles
        self.num_chunks = triton.cdiv(tiles, self.tiles_per_program)
        self.tile_grid = (tiles, channel_tiles)
        self.chunk_grid = (self.num_chunks, channel_tiles)
        self.sizes = (self.channels, height, width, num_pixels)
        self.options = dict(KERNEL=self.kernel, BLOCK_P=block_p, BLOCK_C=block_c, num_warps=8,
                            maxnreg=registers_a_thread(8))
        # the weight's gradient of a program, one row of taps per channel, padded to a power of two
        self.grad_options = dict(self.options, BLOCK_T=triton.next_power_of_2(self.kernel ** 2))
        self._device = like.device

    def partial_sums(self) -> Tensor:
        """Room for each chunk's sums of the weight's gradient (C k^2 values) and the bias's (C), side by side."""
        return torch.empty((self.num_chunks, self.channels * (self.kernel ** 2 + 1)), dtype=torch.float32,
                           device=self._device)


def _parameter_grads(partial: Tensor, weight: Tensor) -> Tuple[Tensor, Tensor]:
    """The weight's and the bias's gradients: views of the one sum of the chunks' partial sums. The weight's takes
    the weight's strides (those of a contiguous layout, as the kernels read it: channels-last ones are, for one input
    channel), which autograd keeps without a copy."""
    sums = partial.sum(0)
    taps = weight.numel()
    return sums[:taps].as_strided(weight.shape, weight.stride()), sums[taps:]


def _saved_copy_dtype(x: Tensor, gelu: bool) -> Optional[torch.dtype]:
    """The dtype of the copy of x that the backward keeps instead of x, or None to keep x: autocast's, where it is
    on and narrower than x and x is read back only for the weight's gradient (not through GELU), as autocast's conv
    would keep its cast of x."""
    device = x.device.type
    if gelu or not autocast_enabled(device):
        return None
    dtype = autocast_dtype(device)
    return dtype if dtype.itemsize < x.dtype.itemsize else None


def _channels_last_empty(like: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
    """A dense channels-last map of like's shape, dtype (or ``dtype``) and device, unwritten."""
    return torch.empty(like.shape, dtype=dtype or like.dtype, device=like.device, memory_format=torch.channels_last)


class _ResidualDepthwiseConv(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor, gelu: bool, torch_fallback: Optional[Callable]):
        x, weight, bias = _channels_adjacent(x), weight.contiguous(), bias.contiguous()
        plan = DepthwisePlan(x, weight, gpu_of(x))
        out = _channels_last_empty(x)
        copy_dtype = _saved_copy_dtype(x, gelu)
        saved = x if copy_dtype is None else _channels_last_empty(x, copy_dtype)
        launch(residual_conv_kernel, plan.tile_grid, x, weight, bias, out, saved, *_map_strides(x),
               *_map_strides(out), *plan.sizes, GELU=gelu, COPY=copy_dtype is not None, **plan.options)
        ctx.save_for_backward(saved, weight, bias)
        ctx.gelu, ctx.torch_fallback, ctx.x_dtype, ctx.autocast = gelu, torch_fallback, x.dtype, autocast_of(x)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight, bias = ctx.saved_tensors
        grads = in_kernels_or_torch(
            lambda: _residual_conv_grads(x, weight, grad, ctx.gelu, ctx.x_dtype), ctx.torch_fallback,
            lambda: torch_gradients(lambda *args: ctx.torch_fallback(*args, ctx.gelu), (x, weight, bias), (grad,),
                                    ctx.autocast))
        return (*grads, None, None)


def _residual_conv_grads(x: Tensor, weight: Tensor, grad: Tensor, gelu: bool, x_dtype: torch.dtype
                         ) -> Tuple[Tensor, Tensor, Tensor]:
    grad = _channels_adjacent(grad)
    plan = DepthwisePlan(x, weight, gpu_of(x))
    grad_x, partial = _channels_last_empty(x, x_dtype), plan.partial_sums()
    launch(residual_conv_grad_kernel, plan.chunk_grid, x, grad, weight, grad_x, partial, *_map_strides(x),
           *_map_strides(grad), *_map_strides(grad_x), *plan.sizes, plan.tiles_per_program, GELU=gelu,
           **plan.grad_options)
    return (grad_x, *_parameter_grads(partial, weight))


class _GatedDepthwiseConv(torch.autograd.Function):

    @staticmethod
    def forward(ctx, y: Tensor, v: Tensor, o: Tensor, weight: Tensor, bias: Tensor,
                torch_fallback: Optional[Callable]):
        y, v, o = (_channels_adjacent(t) for t in (y, v, o))
        weight, bias = weight.contiguous(), bias.contiguous()
        plan = DepthwisePlan(v, weight, gpu_of(v))
        out = _channels_last_empty(o)
        launch(gated_conv_kernel, plan.tile_grid, y, v, o, weight, bias, out, *_map_strides(y), *_map_strides(v),
               *_map_strides(o), *_map_strides(out), *plan.sizes, **plan.options)
        ctx.save_for_backward(y, v, o, weight, bias)
        ctx.torch_fallback, ctx.autocast = torch_fallback, autocast_of(v)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        inputs = ctx.saved_tensors
        grads = in_kernels_or_torch(lambda: _gated_conv_grads(*inputs, grad), ctx.torch_fallback,
                                    lambda: torch_gradients(ctx.torch_fallback, inputs, (grad,), ctx.autocast))
        return (*grads, None)


def _gated_conv_grads(y: Tensor, v: Tensor, o: Tensor, weight: Tensor, bias: Tensor, grad: Tensor) -> tuple:
    grad = _channels_adjacent(grad)
    plan = DepthwisePlan(v, weight, gpu_of(v))
    grad_y, grad_v, grad_o = (_channels_last_empty(t) for t in (y, v, o))
    partial = plan.partial_sums()
    launch(gated_conv_grad_kernel, plan.chunk_grid, y, v, o, grad, weight, bias, grad_y, grad_v, grad_o, partial,
           *_map_strides(y), *_map_strides(v), *_map_strides(o), *_map_strides(grad), *_map_strides(grad_y),
           *plan.sizes, plan.tiles_per_program, **plan.grad_options)
    return (grad_y, grad_v, grad_o, *_parameter_grads(partial, weight))


def residual_depthwise_conv(x: Tensor, weight: Tensor, bias: Tensor, gelu: bool, centre_tap: Optional[Tensor] = None,
                            torch_fallback: Optional[Callable] = None) -> Tensor:
    """``a + conv2d(a, weight, bias, padding=k // 2, groups=C)`` with ``a = GELU(x)`` (exact, erf) or ``a = x``, in
    one launch; its backward takes two. Under autocast, for ``a = x`` wider than autocast's dtype (the fp32 residual
    stream), the launch also writes x in autocast's dtype, which the backward keeps for the weight's gradient, as
    autocast's conv keeps its cast of x: half the bytes of x.

    Args:
        x: (B, C, H, W) fp32, bf16 or fp16, its channels adjacent in memory (channels-last; other maps are copied
            to channels-last first).
        weight: (C, 1, k, k) depth-wise kernel, k odd, and bias: (C,); both read in their dtype (fp32 parameters,
            under autocast too) and given fp32 gradients, the weight's with its strides.
        gelu: whether the conv and the residual take GELU(x) rather than x.
        centre_tap: not read (the kernel adds the residual itself); the torch operators' argument.
        torch_fallback: where the backward's kernel fails on the GPU, the :class:`~mala_mm.ops.dispatch.Operator`
            that gives the gradients in torch operators instead (called with x, weight, bias and gelu); None: the
            error stops the backward.

    Returns:
        (B, C, H, W) in x's dtype, channels-last. Arithmetic is fp32; x's gradient is channels-last in x's dtype.
    """
    _check_shapes('residual_depthwise_conv', x, weight, bias)
    return _ResidualDepthwiseConv.apply(x, weight, bias, gelu, torch_fallback)


def gated_depthwise_conv(y: Tensor, v: Tensor, o: Tensor, weight: Tensor, bias: Tensor,
                         torch_fallback: Optional[Callable] = None) -> Tensor:
    """``(y + conv2d(v, weight, bias, padding=k // 2, groups=C)) * o`` in one launch; its backward takes two.

    Args:
        y, v, o: (B, C, H, W), fp32, bf16 or fp16 each (not necessarily one dtype), their channels adjacent in memory
            and otherwise any strides: v and o may be channel slices of one channels-last map, read in place (other
            maps are copied to channels-last first).
        weight: (C, 1, k, k) depth-wise kernel, k odd, and bias: (C,); both read in their dtype (fp32 parameters,
            under autocast too) and given fp32 gradients, the weight's with its strides.
        torch_fallback: as in :func:`residual_depthwise_conv` (called with y, v, o, weight and bias).

    Returns:
        (B, C, H, W) in o's dtype, channels-last. Arithmetic is fp32; the gradients of y, v and o take their
        dtypes and are channels-last (B, C, H, W) maps.
    """
    if not y.shape == v.shape == o.shape:
        raise ValueError(f'gated_depthwise_conv: y, v and o must have one shape, got {tuple(y.shape)}, '
                         f'{tuple(v.shape)} and {tuple(o.shape)}')
    _check_shapes('gated_depthwise_conv', v, weight, bias)
    return _GatedDepthwiseConv.apply(y, v, o, weight, bias, torch_fallback)
