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
- a two-stage detector (Mask R-CNN, Cascade): the RPN head's per-level scores and box deltas, then the neck's
  features; proposals and RoI heads follow in PyTorch (``rpn_head.predict_by_feat`` then ``roi_head.predict``).
  With ``nms`` the graph goes on to the detections and masks (:class:`TwoStageDetections`: proposals, ONNX's
  ``RoiAlign`` and ``NonMaxSuppression``, the box and mask heads, masks pasted into the image).

With ``nms`` the graph pads the image as the detector's data preprocessor does, and its detections are compared
with mmdet's own ``predict`` (:func:`compare_detections`, within :data:`DETECTION_BOUNDS`).
"""
from .detections import DenseDetections, NonMaxSuppression
from .errors import ExportError, check_shape
from .exportable import make_exportable
from .onnx_export import DEFAULT_OPSET, EXPORTERS, export_onnx
from .onnxruntime_check import DETECTION_BOUNDS, compare_detections, compare_in_onnxruntime, pair_detections
from .two_stage import TwoStageDetections
from .wrapper import ImageToTensors

__all__ = ['DEFAULT_OPSET', 'DETECTION_BOUNDS', 'EXPORTERS', 'DenseDetections', 'ExportError', 'ImageToTensors',
           'NonMaxSuppression', 'TwoStageDetections', 'check_shape', 'compare_detections', 'compare_in_onnxruntime',
           'export_onnx', 'make_exportable', 'pair_detections']
