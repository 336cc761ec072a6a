"""GELU of a training BatchNorm, as written: the reference of :mod:`.torch_ops` and :mod:`.triton_ops`."""
from typing import Optional

import torch.nn.functional as F
from torch import Tensor


def batch_norm_gelu(x: Tensor, weight: Tensor, bias: Tensor, running_mean: Optional[Tensor],
                    running_var: Optional[Tensor], momentum: float, eps: float) -> Tensor:
    """``GELU((x - mean) / sqrt(var + eps) * weight + bias)``, mean and (biased) var over each channel of the batch's
    (B, C, H, W) map; the running statistics are not read (the implementations update them)."""
    mean = x.mean((0, 2, 3), keepdim=True)
    variance = (x - mean).square().mean((0, 2, 3), keepdim=True)
    normed = (x - mean) / (variance + eps).sqrt() * weight.view(1, -1, 1, 1) + bias.view(1, -1, 1, 1)
    return F.gelu(normed)
