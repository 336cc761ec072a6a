"""The depth-wise convolutions with their neighbours in torch operators, through the backbone's
:func:`~mala_mm.ops.conv2d.conv2d` (one opaque operator in compiled graphs, the low-precision weight copies under
autocast)."""
from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from ..conv2d import conv2d
from ..torch_compat import autocast_enabled


def depthwise_conv(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """The size-preserving depth-wise conv of an odd (C, 1, k, k) kernel."""
    padding = weight.shape[-1] // 2
    return conv2d(x, weight, bias, padding=(padding, padding), groups=weight.shape[0])


def residual_depthwise_conv(x: Tensor, weight: Tensor, bias: Tensor, gelu: bool,
                            centre_tap: Optional[Tensor] = None) -> Tensor:
    """``a + DWConv(a)``, ``a = GELU(x)`` or x. With ``centre_tap`` (weight's shape, 1 at the centre, 0 elsewhere)
    added to the kernel, one pass over the map instead of a conv and an add; not under autocast, where the conv runs
    in low precision and the sum keeps x's."""
    a = F.gelu(x) if gelu else x
    if centre_tap is None or autocast_enabled(x.device.type):
        return a + depthwise_conv(a, weight, bias)
    return depthwise_conv(a, weight + centre_tap, bias)


def gated_depthwise_conv(y: Tensor, v: Tensor, o: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``(y + DWConv(v)) * o``."""
    return (y + depthwise_conv(v, weight, bias)) * o
