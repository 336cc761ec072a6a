"""ONNX export of mmdet/mmseg models (MALA or any other backbone) and its check in ONNX Runtime.

The exported graph takes an image batch as the config's pipeline loads it (B, 3, H, W) float32, pixel values
0-255, channels in the loaded order (BGR for ``LoadImageFromFile``), and applies the model's own normalisation
(mean, std, channel flip) inside the graph. What comes out depends on the model (see :class:`ImageToTensors`):

- ``backbone``: the backbone's feature maps.
- a segmentor: the decode head's logits (B, classes, H, W), resized to the input's size as mmseg's
  ``predict`` does, before the arg-max.
- a single-stage detector (RetinaNet, ...): its dense head's per-level class scores and box deltas, then the
  backbone-and-neck features; boxes follow from ``model.bbox_head.predict_by_feat`` in PyTorch.
- a two-stage detector (Mask R-CNN, Cascade): the neck's features and the RPN head's per-level scores and box
  deltas. Proposal NMS and the RoI heads need mmcv's compiled ops (nms, RoIAlign), which ONNX has no standard
  operators for, so they run after the graph in PyTorch (``rpn_head.predict_by_feat`` then ``roi_head.predict``).
"""
import copy
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

EXPORTERS = ('dynamo', 'torchscript')


class ExportError(RuntimeError):
    """The model cannot be exported, or the exported graph does not compute what the model does."""


class ImageToTensors(nn.Module):
    """``image -> normalise -> part of the model``, returning a flat tuple of tensors (ONNX outputs).

    Args:
        model: an mmdet/mmseg model (with a ``data_preprocessor``) or a backbone.
        backbone_only: stop after the backbone.
        exportable: run on a copy of ``model`` whose size-dependent modules are swapped for exportable
            equivalents (:func:`make_exportable`); False runs ``model`` itself, as the reference to compare with.
    """

    def __init__(self, model: nn.Module, backbone_only: bool = False, exportable: bool = True):
        super().__init__()
        self.model = make_exportable(copy.deepcopy(model)) if exportable else model
        preprocessor = getattr(model, 'data_preprocessor', None)
        mean = getattr(preprocessor, 'mean', None)
        std = getattr(preprocessor, 'std', None)
        self.register_buffer('mean', torch.zeros(1, 3, 1, 1) if mean is None else mean.reshape(1, -1, 1, 1).float())
        self.register_buffer('std', torch.ones(1, 3, 1, 1) if std is None else std.reshape(1, -1, 1, 1).float())
        # mmengine's (and mmdet's) preprocessors name it _channel_conversion, mmseg's channel_conversion
        self.flip_channels = bool(getattr(preprocessor, '_channel_conversion',
                                          getattr(preprocessor, 'channel_conversion', False)))
        self.kind = 'backbone' if backbone_only or not hasattr(model, 'extract_feat') else _kind(model)

    def forward(self, image: Tensor) -> Tuple[Tensor, ...]:
        """image: (B, 3, H, W) float32, 0-255, channels in the loaded order."""
        if self.flip_channels:
            image = image.flip(1)
        x = (image - self.mean) / self.std
        model = self.model
        if self.kind == 'backbone':
            backbone = getattr(model, 'backbone', model)
            return tuple(backbone(x))
        if self.kind == 'segmentor':
            logits = model.decode_head.forward(model.extract_feat(x))
            return (nn.functional.interpolate(logits, size=x.shape[2:], mode='bilinear',
                                              align_corners=model.decode_head.align_corners), )
        features = model.extract_feat(x)
        head = model.bbox_head if self.kind == 'single-stage detector' else model.rpn_head
        scores, deltas = head(features)[:2]
        return (*scores, *deltas, *features)

    def describe_outputs(self, outputs: Sequence[Tensor]) -> List[str]:
        """One name per output, in order, for the graph and for messages."""
        if self.kind == 'segmentor':
            return ['logits']
        if self.kind == 'backbone':
            return [f'stage{i}' for i in range(len(outputs))]
        levels = len(outputs) // 3  # scores, deltas and features of each level
        return ([f'cls_score_{i}' for i in range(levels)] + [f'bbox_pred_{i}' for i in range(levels)]
                + [f'feature_{i}' for i in range(len(outputs) - 2 * levels)])


class AveragingAdaptivePool2d(nn.Module):
    """``nn.AdaptiveAvgPool2d`` computed as ``A_H x A_W^T`` with averaging matrices built from the input's size.

    Output bin i of an axis of length L averages positions ``floor(i L / s) <= j < ceil((i + 1) L / s)``, as
    torch's adaptive pooling does. ONNX's own adaptive pooling (GlobalAveragePool aside) has no operator, and the
    exporters lower torch's op to gathers whose indices are fixed at the export size; matmuls stay valid at any
    size.
    """

    def __init__(self, output_size):
        super().__init__()
        self.output_size = nn.modules.utils._pair(output_size)

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


def _kind(model: nn.Module) -> str:
    if hasattr(model, 'decode_head'):
        return 'segmentor'
    if getattr(model, 'bbox_head', None) is not None:
        return 'single-stage detector'
    if getattr(model, 'rpn_head', None) is not None:
        return 'two-stage detector'
    raise ExportError(f'{type(model).__name__} is neither an mmseg segmentor with a decode_head nor an mmdet '
                      f'detector with a bbox_head or rpn_head; export its backbone with --backbone-only')


def export_onnx(module: ImageToTensors, example: Tensor, path: str, dynamic: bool = False, opset: int = 18,
                exporter: str = 'dynamo') -> List[str]:
    """Write ``module`` traced on ``example`` to ``path``; with ``dynamic``, batch, height and width are free.

    Returns the output names.
    """
    if exporter not in EXPORTERS:
        raise ExportError(f'unknown exporter {exporter!r}; choose one of {EXPORTERS}')
    module.eval()
    with torch.no_grad():
        names = module.describe_outputs(module(example))
    options: Dict[str, object] = dict(input_names=['image'], output_names=names, opset_version=opset)
    if exporter == 'dynamo':
        if dynamic:
            options['dynamic_shapes'] = ({0: torch.export.Dim('batch', max=1024),
                                          2: torch.export.Dim('height', min=32, max=16384),
                                          3: torch.export.Dim('width', min=32, max=16384)}, )
    elif dynamic:
        options['dynamic_axes'] = {'image': {0: 'batch', 2: 'height', 3: 'width'}}
    try:
        torch.onnx.export(module, (example, ), path, dynamo=exporter == 'dynamo', **options)
    except Exception as err:  # the exporters raise many types; the first line says which operator failed
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ExportError(f'torch.onnx.export ({exporter}) could not export {type(module.model).__name__}: '
                          f'{first_line}') from err
    return names


def compare_in_onnxruntime(reference: ImageToTensors, path: str, image: Tensor) -> List[Dict[str, float]]:
    """Run ``path`` in ONNX Runtime (CPU) and ``reference`` (best built with ``exportable=False``) in PyTorch on
    ``image``; per output, the largest absolute difference and that over the largest absolute PyTorch value."""
    import onnxruntime
    session = onnxruntime.InferenceSession(path, providers=['CPUExecutionProvider'])
    with torch.no_grad():
        expected = reference.eval()(image)
    try:
        produced = session.run(None, {session.get_inputs()[0].name: image.numpy()})
    except Exception as err:  # onnxruntime's errors (shape mismatch of a static graph, ...) share no base class
        raise ExportError(f'ONNX Runtime could not run {path} on an input of shape {tuple(image.shape)}: '
                          f'{str(err).strip().splitlines()[0]}') from err
    rows = []
    for name, ours, theirs in zip(reference.describe_outputs(expected), expected, produced):
        theirs = torch.from_numpy(theirs)
        if theirs.shape != ours.shape:
            raise ExportError(f'output {name}: ONNX Runtime gives shape {tuple(theirs.shape)}, PyTorch '
                              f'{tuple(ours.shape)}')
        max_abs = (theirs.double() - ours.double()).abs().max().item()
        scale = ours.double().abs().max().item()
        rows.append(dict(output=name, shape=tuple(ours.shape), max_abs=max_abs,
                         max_rel=max_abs / scale if scale else max_abs))
    return rows


def check_shape(shape: Optional[Sequence[int]], minimum: int = 32) -> Tuple[int, int]:
    """The (H, W) of ``--shape``, or a clear :class:`ExportError`."""
    if shape is None or len(shape) != 2 or any(not isinstance(s, int) or s < minimum for s in shape):
        raise ExportError(f'--shape needs two integers H W, each at least {minimum}; got {shape}')
    return tuple(shape)
