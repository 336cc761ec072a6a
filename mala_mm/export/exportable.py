"""Modules whose ONNX lowering holds only at the export size, and the equivalents that hold at any size."""
from typing import Optional

import torch
from torch import Tensor, nn


class AveragingAdaptivePool2d(nn.Module):
    """``nn.AdaptiveAvgPool2d`` computed as ``A_H x A_W^T`` with averaging matrices built from the input's size.

    Output bin i of an axis of length L averages positions ``floor(i L / s) <= j < ceil((i + 1) L / s)``, as
    torch's adaptive pooling does. ONNX's own adaptive pooling (GlobalAveragePool aside) has no operator, and the
    exporters lower torch's op to gathers whose indices are fixed at the export size; matmuls stay valid at any
    size.
    """

    def __init__(self, output_size):
        super().__init__()
        self.output_size = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)

    @staticmethod
    def averaging_matrix(length, bins: int, like: Tensor) -> Tensor:
        """(bins, length): row i holds 1 / (bin size) on bin i's positions."""
        positions = torch.arange(length, device=like.device, dtype=like.dtype)
        index = torch.arange(bins, device=like.device, dtype=like.dtype)[:, None]
        start = torch.floor(index * length / bins)
        end = torch.ceil((index + 1) * length / bins)
        inside = ((positions >= start) & (positions < end)).to(like.dtype)
        return inside / inside.sum(-1, keepdim=True)

    def forward(self, x: Tensor) -> Tensor:
        rows = self.averaging_matrix(x.shape[-2], self.output_size[0], x)
        cols = self.averaging_matrix(x.shape[-1], self.output_size[1], x)
        return rows @ x @ cols.transpose(0, 1)


class ScaleUpsample(nn.Module):
    """mmseg's ``Upsample`` by a scale factor, as one interpolation by that factor.

    mmseg computes the output size as ``int(size * factor)`` in Python, which tracing freezes at the export size;
    for the integer factors its heads use, interpolating by the factor gives the same size and the same values.
    """

    def __init__(self, scale_factor, mode: str, align_corners: Optional[bool]):
        super().__init__()
        self.scale_factor, self.mode, self.align_corners = scale_factor, mode, align_corners

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.interpolate(x, scale_factor=self.scale_factor, mode=self.mode,
                                         align_corners=self.align_corners)


def _exportable_replacement(module: nn.Module) -> Optional[nn.Module]:
    if isinstance(module, nn.AdaptiveAvgPool2d):
        return AveragingAdaptivePool2d(module.output_size)
    if type(module).__name__ == 'Upsample' and type(module).__module__.startswith('mmseg.'):
        factor = module.scale_factor
        if not module.size and factor is not None and float(factor).is_integer():
            return ScaleUpsample(factor, module.mode, module.align_corners)
    return None


def make_exportable(model: nn.Module) -> nn.Module:
    """Swap, in place, the modules whose ONNX lowering holds only at the export size for ones that hold at any."""
    for name, child in model.named_children():
        replacement = _exportable_replacement(child)
        if replacement is None:
            make_exportable(child)
        else:
            setattr(model, name, replacement)
    return model
