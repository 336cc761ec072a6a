"""The backbone's 2-D convolution (:func:`conv2d`), which a compiled graph calls as one opaque operator.

Under ``torch.compile`` with dynamic sizes, torch 2.13's inductor turns the strides of every convolution's gradient
into constants of the input size (``convolution_backward``'s lowering guards them as ints), so each new training
size recompiles the backward; and with its channels-last layout forced it fails outright. The convolutions here
run the same ATen kernels as eager, inside a custom operator whose gradient is another: inductor fuses everything
around them and leaves them, as it leaves library convolutions anyway, to the kernels. Eager and exported graphs
(``torch.export``, ONNX) see the plain ``nn.Conv2d``.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .torch_compat import HAS_CUSTOM_OPS, autocast_dtype, autocast_enabled, compiling_to_run, in_graph
from .weight_casts import low_precision


def _channels_last_strides_of(shape) -> Tuple[int, int, int, int]:
    _, channels, height, width = shape
    return height * width * channels, 1, width * channels, channels


def channels_last_strides(t: Tensor) -> Tensor:
    """t itself where it has the channels-last strides of its (N, C, H, W) shape, size-1 dimensions included, else
    such a copy. ``contiguous(memory_format=torch.channels_last)`` would leave a (C, 1, 3, 3) depth-wise kernel or an
    (O, I, 1, 1) kernel as it is, since it counts as channels-last already, yet its gradient's strides differ; and
    the real and the fake (compile-time) results of each operator below must have the very same strides."""
    strides = _channels_last_strides_of(t.shape)
    if t.stride() == strides:
        return t
    return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)


def _strided_like(t: Tensor, like: Tensor) -> Tensor:
    """t itself where its strides are those of ``like`` (of the same shape), else such a copy."""
    return t if t.stride() == like.stride() else torch.empty_like(like).copy_(t)


def _gradients_like(grads, x: Tensor, weight: Tensor, output_mask: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
    """The gradients of x, weight and bias with the strides of what each is the gradient of; one that
    ``output_mask`` leaves out is an empty tensor."""
    like = (x, weight, weight.new_empty(weight.shape[0]))
    return tuple(_strided_like(g, ref) if needed else x.new_empty(0)
                 for g, ref, needed in zip(grads, like, output_mask))


def _save_for_gradient(ctx, inputs, output):
    x, weight, _, stride, padding, groups = inputs
    ctx.save_for_backward(x, weight)
    ctx.conv = (stride, padding, groups)


def _gradient(ctx, grad):
    x, weight = ctx.saved_tensors
    mask = list(ctx.needs_input_grad[:3])
    grads = conv2d_backward(grad, x, weight, *ctx.conv, mask)
    return tuple(g if needed else None for g, needed in zip(grads, mask)) + (None, None, None)


if HAS_CUSTOM_OPS:  # torch >= 2.4; MALA(compile=...) asks for it
    @torch.library.custom_op('mala_mm::conv2d', mutates_args=())
    def conv2d_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: List[int], padding: List[int],
                  groups: int) -> Tensor:
        """``F.conv2d`` (dilation 1), the result channels-last."""
        return channels_last_strides(F.conv2d(x, weight, bias, stride, padding, 1, groups))

    @conv2d_op.register_fake
    def _conv2d_fake(x, weight, bias, stride, padding, groups):
        # the result's shape worked out here: F.conv2d on fake tensors would choose its kernel by the input's size,
        # and that choice would be a guard on the size, so one more graph
        batch, _, height, width = x.shape
        out_channels, _, kernel_height, kernel_width = weight.shape
        shape = (batch, out_channels, (height + 2 * padding[0] - kernel_height) // stride[0] + 1,
                 (width + 2 * padding[1] - kernel_width) // stride[1] + 1)
        return x.new_empty_strided(shape, _channels_last_strides_of(shape))

    @torch.library.custom_op('mala_mm::conv2d_backward', mutates_args=())
    def conv2d_backward(grad: Tensor, x: Tensor, weight: Tensor, stride: List[int], padding: List[int], groups: int,
                        output_mask: List[bool]) -> Tuple[Tensor, Tensor, Tensor]:
        """The gradients of :func:`conv2d_op` (see :func:`_gradients_like`)."""
        grads = torch.ops.aten.convolution_backward(grad, x, weight, [weight.shape[0]], stride, padding, [1, 1],
                                                    False, [0, 0], groups, output_mask)
        return _gradients_like(grads, x, weight, output_mask)

    @conv2d_backward.register_fake
    def _conv2d_backward_fake(grad, x, weight, stride, padding, groups, output_mask):
        grads = (torch.empty_like(x), torch.empty_like(weight), weight.new_empty(weight.shape[0]))
        return _gradients_like(grads, x, weight, output_mask)

    conv2d_op.register_autograd(_gradient, setup_context=_save_for_gradient)


def conv2d(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: Sequence[int] = (1, 1),
           padding: Sequence[int] = (0, 0), groups: int = 1) -> Tensor:
    """``F.conv2d`` (zero padding, dilation 1): inside a graph torch.compile runs, :func:`conv2d_op`; in eager mode
    with the low-precision copies of weight and bias that the backbone made for the forward
    (:func:`~mala_mm.ops.weight_casts.low_precision`) where there are some."""
    if HAS_CUSTOM_OPS and compiling_to_run():
        device = x.device.type
        if autocast_enabled(device):  # autocast casts for F.conv2d, but knows nothing of the custom operator
            dtype = autocast_dtype(device)
            x, weight, bias = x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)
        return conv2d_op(x, weight, bias, list(stride), list(padding), groups)
    return F.conv2d(x, low_precision(weight), low_precision(bias), stride, padding, 1, groups)


class ConvChunks(torch.autograd.Function):
    """A 1x1 conv whose output channels split into ``chunks`` dense maps, one conv each, whose backward is one: the
    chunks' gradients side by side, and one conv backward for the whole weight. Apart, autograd would run a conv
    backward a chunk, add their gradients of x, and gather the weight's and the bias's; and under autocast each conv
    would cast x, and keep its own cast. Here x is cast once, and that cast kept."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor], chunks: int) -> Tuple[Tensor, ...]:
        device = x.device.type
        dtype = autocast_dtype(device) if autocast_enabled(device) else torch.promote_types(x.dtype, weight.dtype)
        x, weight = x.to(dtype), weight.to(dtype)
        biases = (None,) * chunks if bias is None else bias.to(dtype).chunk(chunks)
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return tuple(F.conv2d(x, w, b) for w, b in zip(weight.chunk(chunks), biases))

    @staticmethod
    def backward(ctx, *grads: Tensor):  # autograd hands zeros for a chunk that took no gradient
        x, weight = ctx.saved_tensors
        grad = torch.cat([g.to(x.dtype) for g in grads], dim=1)
        grad_x, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
            grad, x, weight, [weight.shape[0]], [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
            [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]])
        return grad_x, grad_weight, grad_bias, None


def conv1x1_chunks(x: Tensor, weight: Tensor, bias: Optional[Tensor], chunks: int) -> Tuple[Tensor, ...]:
    """A 1x1 conv of (B, C_in, H, W) x by an (n C, C_in, 1, 1) weight as ``chunks`` = n dense (B, C, H, W) maps, one
    conv each (elementwise operators run several times faster on dense maps than on channel slices of one); in eager
    training through :class:`ConvChunks`, whose backward is one conv's. Weight and bias as the convs read them (the
    backbone's low-precision copies under autocast)."""
    if torch.is_grad_enabled() and not in_graph():
        return ConvChunks.apply(x, weight, bias, chunks)
    biases = (None,) * chunks if bias is None else bias.chunk(chunks)
    return tuple(conv2d(x, w, b) for w, b in zip(weight.chunk(chunks), biases))
