"""The module that is exported: the image in, the model's own normalisation, and the part of the model an ONNX
graph can hold, as a flat tuple of tensors."""
import copy
from typing import List, Sequence, Tuple

import torch
from torch import Tensor, nn

from mala_mm.sample_inputs import image_metainfo

from .detections import DenseDetections
from .errors import ExportError
from .exportable import make_exportable


class ImageToTensors(nn.Module):
    """``image -> normalise -> part of the model``, returning a flat tuple of tensors (ONNX outputs).

    Args:
        model: an mmdet/mmseg model (with a ``data_preprocessor``) or a backbone.
        backbone_only: stop after the backbone.
        exportable: run on a copy of ``model`` whose size-dependent modules are swapped for exportable
            equivalents (:func:`make_exportable`); False runs ``model`` itself, as the reference to compare with.
        nms: a single-stage detector returns its detections (boxes, scores, labels of one image) instead of its
            head's raw outputs; exportable computes them with :class:`DenseDetections`, the reference with the
            head's own ``predict_by_feat``.
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
        self.detections = None
        if nms:
            if self.kind != 'single-stage detector':
                raise ExportError(f'`nms=True` applies to single-stage detectors (RetinaNet, ...), not to a '
                                  f'{self.kind}'
                                  + ('; its NMS sits between the RPN and the RoI heads, which need RoIAlign'
                                     if self.kind == 'two-stage detector' else ''))
            self.detections = DenseDetections(self.model.bbox_head) if exportable else self._predict_by_feat

    def normalise(self, image: Tensor) -> Tensor:
        """image: (B, 3, H, W) float32, 0-255, channels in the loaded order -> the model's input, as its
        data preprocessor makes it."""
        if self.flip_channels:
            image = image.flip(1)
        return (image - self.mean) / self.std

    def forward(self, image: Tensor) -> Tuple[Tensor, ...]:
        """image: (B, 3, H, W) float32, 0-255, channels in the loaded order."""
        x = self.normalise(image)
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
        outputs = head(features)
        scores, deltas = outputs[:2]
        if self.detections is not None:
            if len(outputs) != 2:
                raise ExportError(f'`nms=True` supports heads that return class scores and box deltas; '
                                  f'{type(head).__name__} also returns {len(outputs) - 2} more (score factors)')
            return self.detections(scores, deltas, x.shape[2], x.shape[3])
        return (*scores, *deltas, *features)

    def _predict_by_feat(self, scores, deltas, height, width) -> Tuple[Tensor, Tensor, Tensor]:
        found = self.model.bbox_head.predict_by_feat(scores, deltas, batch_img_metas=[image_metainfo(height, width)],
                                                     rescale=False)[0]
        return found.bboxes, found.scores, found.labels

    def describe_outputs(self, outputs: Sequence[Tensor]) -> List[str]:
        """One name per output, in order, for the graph and for messages."""
        if self.kind == 'segmentor':
            return ['logits']
        if self.detections is not None:
            return ['boxes', 'scores', 'labels']
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
