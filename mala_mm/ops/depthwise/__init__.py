"""The block's depth-wise convolutions with the elementwise work around them: the plain formulas (:mod:`.naive`),
torch operators (:mod:`.torch_ops`) and, for each, one Triton kernel forward and one backward
(:mod:`.triton_ops`), chosen by the functions here.

- :func:`residual_depthwise_conv`: ``a + DWConv(a)``, ``a = x`` (the position encoding) or ``a = GELU(x)`` (the
  FFN's activation and depth-wise conv);
- :func:`gated_depthwise_conv`: ``(y + LePE(v)) * o``, the attention's LePE and output gate.

In the kernels the arithmetic is fp32 and the fp32 weights are read as they are, under autocast too.
"""
from typing import Optional

from torch import Tensor

from ..dispatch import Operator
from . import naive, torch_ops

RESIDUAL_DEPTHWISE_CONV = Operator('residual_depthwise_conv', naive.residual_depthwise_conv,
                                   torch_ops.residual_depthwise_conv, f'{__name__}.triton_ops')
GATED_DEPTHWISE_CONV = Operator('gated_depthwise_conv', naive.gated_depthwise_conv, torch_ops.gated_depthwise_conv,
                                f'{__name__}.triton_ops')


def residual_depthwise_conv(x: Tensor, weight: Tensor, bias: Tensor, gelu: bool = False,
                            centre_tap: Optional[Tensor] = None, impl: str = 'torch') -> Tensor:
    """``a + DWConv(a)`` with ``a = GELU(x)`` where ``gelu``, else ``a = x``.

    Args:
        x: (B, C, H, W), channels-last.
        weight: (C, 1, k, k), k odd; bias: (C,).
        gelu: apply (erf) GELU first.
        centre_tap: weight's shape, 1 at the centre and 0 elsewhere, or None: the torch operators add it to the
            kernel, one pass over the map instead of a conv and an add (except under autocast).
        impl: 'auto', 'triton' or 'torch' (:func:`~mala_mm.ops.dispatch.uses_triton`).

    Returns:
        (B, C, H, W) channels-last, in x's dtype.
    """
    return RESIDUAL_DEPTHWISE_CONV.run(impl, x, x, weight, bias, gelu, centre_tap)


def gated_depthwise_conv(y: Tensor, v: Tensor, o: Tensor, weight: Tensor, bias: Tensor,
                         impl: str = 'torch') -> Tensor:
    """``(y + DWConv(v)) * o``: the attention result y, its locally-enhanced position encoding (LePE) of v, and
    the output gate o.

    Args:
        y, v, o: (B, C, H, W), each with adjacent channels (v and o may be channel slices of one channels-last map).
        weight: (C, 1, k, k), k odd; bias: (C,).
        impl: 'auto', 'triton' or 'torch' (:func:`~mala_mm.ops.dispatch.uses_triton`).

    Returns:
        (B, C, H, W) channels-last; in the kernels o's dtype, in torch operators the promoted one.
    """
    return GATED_DEPTHWISE_CONV.run(impl, v, y, v, o, weight, bias)
