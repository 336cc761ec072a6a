"""The block's depth-wise convolutions with their neighbours as written: a conv, then the residual or the gate; the
reference of :mod:`.torch_ops` and :mod:`.triton_ops`."""
from typing import Optional

import torch.nn.functional as F
from torch import Tensor


def depthwise_conv(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """The size-preserving depth-wise conv of a (B, C, H, W) map by an odd (C, 1, k, k) kernel."""
    return F.conv2d(x, weight, bias, padding=weight.shape[-1] // 2, groups=weight.shape[0])


def residual_depthwise_conv(x: Tensor, weight: Tensor, bias: Tensor, gelu: bool,
                            centre_tap: Optional[Tensor] = None) -> Tensor:
    """``a + DWConv(a)`` with ``a = GELU(x)`` where ``gelu``, else ``a = x`` (``centre_tap`` unread)."""
    a = F.gelu(x) if gelu else x
    return a + depthwise_conv(a, weight, bias)


def gated_depthwise_conv(y: Tensor, v: Tensor, o: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``(y + DWConv(v)) * o``."""
    return (y + depthwise_conv(v, weight, bias)) * o
