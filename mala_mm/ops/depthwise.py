"""The block's depth-wise convolutions with the elementwise work around them, each in torch operators or in one
Triton kernel forward and two launches backward (:mod:`.depthwise_triton`):

- :func:`residual_depthwise_conv`: ``a + DWConv(a)``, ``a = x`` (the position encoding) or ``a = GELU(x)`` (the
  FFN's activation and depth-wise conv);
- :func:`gated_depthwise_conv`: ``(y + LePE(v)) * o``, the attention's LePE and output gate.

In the kernels the arithmetic is fp32 and the fp32 weights are read as they are, under autocast too.
"""
from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from . import dispatch
from .conv2d import conv2d
from .torch_compat import autocast_enabled


def _depthwise_conv(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """The size-preserving depth-wise conv of an odd (C, 1, k, k) kernel, in torch operators."""
    padding = weight.shape[-1] // 2
    return conv2d(x, weight, bias, padding=(padding, padding), groups=weight.shape[0])


def residual_depthwise_conv(x: Tensor, weight: Tensor, bias: Tensor, centre_tap: Tensor, gelu: bool = False,
                            impl: str = 'torch') -> Tensor:
    """``a + DWConv(a)`` with ``a = GELU(x)`` where ``gelu``, else ``a = x``.

    Args:
        x: (B, C, H, W), channels-last.
        weight: (C, 1, k, k), k odd; bias: (C,).
        centre_tap: weight's shape, 1 at the centre and 0 elsewhere: the torch operators add it to the kernel, one
            pass over the map instead of a conv and an add, except under autocast, where the conv runs in low
            precision and the sum keeps x's.
        gelu: apply (erf) GELU first.
        impl: 'auto', 'triton' or 'torch' (:func:`~.dispatch.uses_triton`).

    Returns:
        (B, C, H, W) channels-last, in x's dtype.
    """
    if impl != 'torch' and dispatch.uses_triton(impl, x, RESIDUAL_DEPTHWISE_CONV):
        return dispatch.run(RESIDUAL_DEPTHWISE_CONV, impl, x, _fused_residual_depthwise_conv, x, weight, bias, gelu)
    a = F.gelu(x) if gelu else x
    if autocast_enabled(x.device.type):
        return a + _depthwise_conv(a, weight, bias)
    return _depthwise_conv(a, weight + centre_tap, bias)


def _fused_residual_depthwise_conv(*args):
    return dispatch.depthwise_triton.residual_depthwise_conv(*args)


def _residual_depthwise_conv(x: Tensor, weight: Tensor, bias: Tensor, gelu: bool) -> Tensor:
    """:func:`residual_depthwise_conv` in plain torch operators, where its kernels fail on a GPU."""
    a = F.gelu(x) if gelu else x
    return a + _depthwise_conv(a, weight, bias)


def gated_depthwise_conv(y: Tensor, v: Tensor, o: Tensor, weight: Tensor, bias: Tensor,
                         impl: str = 'torch') -> Tensor:
    """``(y + DWConv(v)) * o``: the attention result y, its locally-enhanced position encoding (LePE) of v, and
    the output gate o.

    Args:
        y, v, o: (B, C, H, W), each with adjacent channels (v and o may be channel slices of one channels-last map).
        weight: (C, 1, k, k), k odd; bias: (C,).
        impl: 'auto', 'triton' or 'torch' (:func:`~.dispatch.uses_triton`).

    Returns:
        (B, C, H, W) channels-last; in the kernels o's dtype, in torch operators the promoted one.
    """
    if impl == 'torch':
        return _gated_depthwise_conv(y, v, o, weight, bias)
    return dispatch.run(GATED_DEPTHWISE_CONV, impl, v, _fused_gated_depthwise_conv, y, v, o, weight, bias)


def _fused_gated_depthwise_conv(*args):
    return dispatch.depthwise_triton.gated_depthwise_conv(*args)


def _gated_depthwise_conv(y: Tensor, v: Tensor, o: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return (y + _depthwise_conv(v, weight, bias)) * o


RESIDUAL_DEPTHWISE_CONV = dispatch.Operator('residual_depthwise_conv', _residual_depthwise_conv)
GATED_DEPTHWISE_CONV = dispatch.Operator('gated_depthwise_conv', _gated_depthwise_conv)
