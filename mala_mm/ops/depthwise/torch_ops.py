"""The depth-wise convolutions with their neighbours in torch operators, through the backbone's
:func:`~mala_mm.ops.conv2d.conv2d` (one opaque operator in compiled graphs, the low-precision weight copies under
autocast)."""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..conv2d import conv2d
from ..torch_compat import autocast_dtype, autocast_enabled, in_graph
from ..weight_casts import low_precision


def depthwise_conv(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """The size-preserving depth-wise conv of an odd (C, 1, k, k) kernel."""
    padding = weight.shape[-1] // 2
    return conv2d(x, weight, bias, padding=(padding, padding), groups=weight.shape[0])


def residual_depthwise_conv(x: Tensor, weight: Tensor, bias: Tensor, gelu: bool,
                            centre_tap: Optional[Tensor] = None) -> Tensor:
    """``a + DWConv(a)``, ``a = GELU(x)`` or x. With ``centre_tap`` (weight's shape, 1 at the centre, 0 elsewhere)
    added to the kernel, one pass over the map instead of a conv and an add; not under autocast, where the conv runs
    in low precision and the sum keeps x's. With GELU, in eager training, the backward keeps x alone
    (:class:`GELUResidualConv`)."""
    folded = centre_tap is not None and not autocast_enabled(x.device.type)
    if gelu and torch.is_grad_enabled() and not in_graph():
        return GELUResidualConv.apply(x, low_precision(weight), low_precision(bias), centre_tap if folded else None)
    a = F.gelu(x) if gelu else x
    if not folded:
        return a + depthwise_conv(a, weight, bias)
    return depthwise_conv(a, weight + centre_tap, bias)


class GELUResidualConv(torch.autograd.Function):
    """``a + DWConv(a)``, ``a = GELU(x)``, whose backward keeps x and not a: it takes a again from x, one GELU more
    than autograd's backward, which would keep both (GELU's input and the conv's), the FFN's two widest maps. The
    operators are those of :func:`residual_depthwise_conv`; weight and bias come as the conv reads them."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor], centre_tap: Optional[Tensor]) -> Tensor:
        a = F.gelu(x)
        device = a.device.type
        # the conv's operands as autocast would cast them, so that the backward runs the conv's own precision
        dtype = autocast_dtype(device) if autocast_enabled(device) else a.dtype
        kernel = (weight if centre_tap is None else weight + centre_tap).to(dtype)
        bias = None if bias is None else bias.to(dtype)
        out = F.conv2d(a.to(dtype), kernel, bias, padding=weight.shape[-1] // 2, groups=weight.shape[0])
        if centre_tap is None:
            out = a + out
        ctx.save_for_backward(x, kernel)
        ctx.residual, ctx.has_bias = centre_tap is None, bias is not None
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tuple[Tensor, Tensor, Optional[Tensor], None]:
        x, kernel = ctx.saved_tensors
        padding = kernel.shape[-1] // 2
        grad_a, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
            grad.to(kernel.dtype), F.gelu(x).to(kernel.dtype), kernel, [kernel.shape[0]], [1, 1],
            [padding, padding], [1, 1], False, [0, 0], kernel.shape[0], [True, True, ctx.has_bias])
        if ctx.residual:
            grad_a = grad_a + grad
        return torch.ops.aten.gelu_backward(grad_a.to(x.dtype), x), grad_weight, grad_bias, None


def gated_depthwise_conv(y: Tensor, v: Tensor, o: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``(y + DWConv(v)) * o``."""
    return (y + depthwise_conv(v, weight, bias)) * o
