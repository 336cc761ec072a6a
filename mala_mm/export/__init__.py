"""ONNX export of mmdet/mmseg models (MALA or any other backbone) and its check in ONNX Runtime.

The exported graph takes an image batch as the config's pipeline loads it (B, 3, H, W) float32, pixel values
0-255, channels in the loaded order (BGR for ``LoadImageFromFile``), and applies the model's own normalisation
(mean, std, channel flip) inside the graph. What comes out depends on the model (see :class:`ImageToTensors`):

- ``backbone``: the backbone's feature maps.
- a segmentor: the decode head's logits (B, classes, H, W), resized to the input's size as mmseg's
  ``predict`` does, before the arg-max.
- a single-stage detector (RetinaNet, ...): its dense head's per-level class scores and box deltas, then the
  backbone-and-neck features; boxes follow from ``model.bbox_head.predict_by_feat`` in PyTorch. With ``nms``
  the graph goes on to the detections themselves (:class:`DenseDetections`: box decoding, score threshold,
  ONNX's ``NonMaxSuppression``), as ``predict_by_feat`` computes them.
- a two-stage detector (Mask R-CNN, Cascade): the neck's features and the RPN head's per-level scores and box
  deltas. The RoI heads need mmcv's RoIAlign, which has no standard ONNX operator, so proposals and RoI heads
  run after the graph in PyTorch (``rpn_head.predict_by_feat`` then ``roi_head.predict``).
"""
from .detections import DenseDetections, NonMaxSuppression
from .errors import ExportError, check_shape
from .exportable import make_exportable
from .onnx_export import EXPORTERS, export_onnx
from .onnxruntime_check import compare_in_onnxruntime, pair_detections
from .wrapper import ImageToTensors

__all__ = ['EXPORTERS', 'DenseDetections', 'ExportError', 'ImageToTensors', 'NonMaxSuppression', 'check_shape',
           'compare_in_onnxruntime', 'export_onnx', 'make_exportable', 'pair_detections']
