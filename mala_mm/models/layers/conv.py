"""The backbone's 2-D convolution module: ``nn.Conv2d`` running :func:`mala_mm.ops.conv2d.conv2d`."""
from typing import Optional

from torch import Tensor, nn

from ...ops.conv2d import conv2d


class Conv2d(nn.Conv2d):
    """``nn.Conv2d`` (zero padding, dilation 1) that runs as one opaque operator inside a graph torch.compile runs,
    and in eager mode reads the low-precision copies of its weight and bias that the backbone made for the forward
    where there are some (:func:`~mala_mm.ops.conv2d.conv2d`). Exported graphs see the plain convolution."""

    def _conv_forward(self, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        return conv2d(x, weight, bias, self.stride, self.padding, self.groups)
