"""A residual branch added back, and the LayerNorm of the sum, as written: the reference of :mod:`.torch_ops` and
:mod:`.triton_ops`."""
from typing import Optional, Tuple

from torch import Tensor


def scaled_residual(x: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor] = None) -> Tensor:
    """``x + factors * gamma * branch``: (B, C, H, W) maps, (1, C, 1, 1) gamma, (B, 1, 1, 1) factors or None."""
    scale = gamma if factors is None else factors * gamma
    return x + scale * branch


def scaled_residual_norm(x: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor], weight: Tensor,
                         bias: Tensor, eps: float, as_output: bool = False) -> Tuple[Tensor, Tensor]:
    """:func:`scaled_residual` and ``(out - mean) / sqrt(var + eps) * weight + bias`` over each pixel's channels."""
    out = scaled_residual(x, branch, gamma, factors)
    mean = out.mean(1, keepdim=True)
    variance = (out - mean).square().mean(1, keepdim=True)
    normed = (out - mean) / (variance + eps).sqrt() * weight.view(1, -1, 1, 1) + bias.view(1, -1, 1, 1)
    return out, normed
