"""The module that is exported: the image in, the model's own normalisation, and the part of the model an ONNX
graph can hold, as a flat tuple of tensors."""
import copy
from typing import List, Sequence, Tuple

import torch
from torch import Tensor, nn

from mala_mm.sample_inputs import data_samples

from .detections import DenseDetections
from .errors import ExportError
from .exportable import make_exportable
from .two_stage import TwoStageDetections


class ImageToTensors(nn.Module):
    """``image -> normalise -> part of the model``, returning a flat tuple of tensors (ONNX outputs).

    Args:
        model: an mmdet/mmseg model (with a ``data_preprocessor``) or a backbone.
        backbone_only: stop after the backbone.
        exportable: run on a copy of ``model`` whose size-dependent modules are swapped for exportable
            equivalents (:func:`make_exportable`); False runs ``model`` itself, as the reference to compare with.
        nms: a detector returns its detections of one image (boxes, scores, labels, and masks where it has a mask
            head) instead of its heads' raw outputs. The image is padded as the detector's data preprocessor
            pads it; exportable computes the detections with :class:`DenseDetections` (single-stage) or
            :class:`TwoStageDetections`, the reference with mmdet itself: its data preprocessor and ``predict``.
    """

    def __init__(self, model: nn.Module, backbone_only: bool = False, exportable: bool = True,
                 nms: bool = False):
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
        self.nms, self.exportable, self.detections = nms, exportable, None
        if nms:
            if not self.kind.endswith('detector'):
                raise ExportError(f'`nms=True` applies to detectors, not to a {self.kind}')
            self.pad_size_divisor = getattr(preprocessor, 'pad_size_divisor', 1)
            self.pad_value = float(getattr(preprocessor, 'pad_value', 0))
            if exportable:
                self.detections = (DenseDetections(self.model.bbox_head) if self.kind == 'single-stage detector'
                                   else TwoStageDetections(self.model))

    def normalise(self, image: Tensor) -> Tensor:
        """image: (B, 3, H, W) float32, 0-255, channels in the loaded order -> the model's input, as its
        data preprocessor makes it."""
        if self.flip_channels:
            image = image.flip(1)
        return (image - self.mean) / self.std

    def pad(self, x: Tensor) -> Tensor:
        """The normalised image padded at the bottom and right to multiples of ``pad_size_divisor``, as the
        detector's data preprocessor pads a batch."""
        divisor = self.pad_size_divisor
        right, bottom = (divisor - x.shape[3] % divisor) % divisor, (divisor - x.shape[2] % divisor) % divisor
        return nn.functional.pad(x, (0, right, 0, bottom), value=self.pad_value)

    def forward(self, image: Tensor) -> Tuple[Tensor, ...]:
        """image: (B, 3, H, W) float32, 0-255, channels in the loaded order."""
        if self.nms and not self.exportable:
            return self._mmdet_predict(image)
        x = self.normalise(image)
        model = self.model
        if self.nms:
            return self.detections(model.extract_feat(self.pad(x)), x.shape[2], x.shape[3])
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

    def _mmdet_predict(self, image: Tensor) -> Tuple[Tensor, ...]:
        """mmdet's own detections of one image: its data preprocessor (channel order, normalisation, padding) and
        ``predict``, given the image as a test pipeline gives it (neither resized nor flipped)."""
        if image.shape[0] != 1:
            raise ExportError(f'the detections are those of one image; got a batch of {image.shape[0]}')
        samples = data_samples('mmdet', image.shape[2], image.shape[3])
        data = self.model.data_preprocessor(dict(inputs=[image[0]], data_samples=samples), False)
        found = self.model.predict(data['inputs'], data['data_samples'], rescale=True)[0].pred_instances
        return tuple(found[name] for name in ['bboxes', 'scores', 'labels', 'masks'] if name in found)

    def describe_outputs(self, outputs: Sequence[Tensor]) -> List[str]:
        """One name per output, in order, for the graph and for messages."""
        if self.kind == 'segmentor':
            return ['logits']
        if self.nms:
            return ['boxes', 'scores', 'labels', 'masks'][:len(outputs)]
        if self.kind == 'backbone':
            return [f'stage{i}' for i in range(len(outputs))]
        levels = len(outputs) // 3  # scores, deltas and features of each level
        return ([f'cls_score_{i}' for i in range(levels)] + [f'bbox_pred_{i}' for i in range(levels)]
                + [f'feature_{i}' for i in range(len(outputs) - 2 * levels)])


def _kind(model: nn.Module) -> str:
    if hasattr(model, 'decode_head'):
        return 'segmentor'
    if getattr(model, 'bbox_head', None) is not None:
        return 'single-stage detector'
    if getattr(model, 'rpn_head', None) is not None:
        return 'two-stage detector'
    raise ExportError(f'{type(model).__name__} is neither an mmseg segmentor with a decode_head nor an mmdet '
                      f'detector with a bbox_head or rpn_head; export its backbone with `backbone_only=True`')
