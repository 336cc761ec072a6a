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
import copy
import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from mala_mm.sample_inputs import image_metainfo

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


class NonMaxSuppression(torch.autograd.Function):
    """Indices of the boxes that NMS keeps, by descending score: mmcv's ``nms`` when run, ONNX's
    ``NonMaxSuppression`` when exported (both suppress a box whose IoU with a kept one exceeds the threshold)."""

    @staticmethod
    def forward(ctx, boxes: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
        from mmcv.ops import nms
        return nms(boxes, scores, iou_threshold)[1]

    @staticmethod
    def symbolic(g, boxes, scores, iou_threshold):
        def constant(value, dtype=torch.int64):
            return g.op('Constant', value_t=torch.tensor(value, dtype=dtype))

        # ONNX's operator works on (batch, boxes, 4) and (batch, classes, boxes): one of each here
        selected = g.op('NonMaxSuppression', g.op('Unsqueeze', boxes, constant([0])),
                        g.op('Unsqueeze', scores, constant([0, 1])), constant([2 ** 31 - 1]),
                        constant([iou_threshold], torch.float32))
        return g.op('Gather', selected, constant(2), axis_i=1)  # rows are (batch, class, box)


class DenseDetections(nn.Module):
    """An anchor head's detections for one image, computed as its ``predict_by_feat`` does, in exportable ops.

    Per level, the class scores above ``score_thr`` (at most ``nms_pre`` of them, the highest); their anchors'
    deltas decoded to boxes clipped to the image; boxes no wider or taller than ``min_bbox_size`` dropped; NMS
    per class, as mmcv's ``batched_nms`` does it (each class's boxes shifted by the class index times the largest
    coordinate, so that classes never overlap); the best ``max_per_img``. The head's ``predict_by_feat`` takes
    shortcuts that tracing would freeze (no box at all, ``min(nms_pre, count)``) and an NMS that ONNX has no
    lowering of; these steps take none.

    Args:
        head: an mmdet anchor head with sigmoid class scores and ``DeltaXYWHBBoxCoder`` boxes (RetinaNet's).
    """

    def __init__(self, head: nn.Module):
        super().__init__()
        coder, cfg = head.bbox_coder, head.test_cfg
        problems = []
        if type(coder).__name__ != 'DeltaXYWHBBoxCoder':
            problems.append(f'boxes coded by {type(coder).__name__}, not DeltaXYWHBBoxCoder')
        if not getattr(head, 'use_sigmoid_cls', False):
            problems.append('softmax class scores')
        if not hasattr(head.prior_generator, 'base_anchors'):
            problems.append(f'priors from {type(head.prior_generator).__name__}, not an anchor generator')
        nms_cfg = cfg.get('nms') or {}
        if nms_cfg.get('type', 'nms') != 'nms' or nms_cfg.get('class_agnostic') or nms_cfg.get('offset'):
            problems.append(f'test_cfg.nms {dict(nms_cfg)}, not plain per-class nms')
        if problems:
            raise ExportError(f'`nms=True` supports anchor heads like RetinaNet\'s; {type(head).__name__} has '
                              + ', '.join(problems) + '; export without `nms=True` and run predict_by_feat on the '
                              'outputs')
        self.prior_generator, self.num_classes = head.prior_generator, head.cls_out_channels
        self.means, self.stds = coder.means, coder.stds
        self.clip_border, self.ctr_clamp = coder.clip_border, coder.ctr_clamp if coder.add_ctr_clamp else None
        self.max_ratio = abs(math.log(16 / 1000))  # the coder's default wh_ratio_clip, which the head uses
        self.score_thr, self.nms_pre = cfg.get('score_thr', 0), cfg.get('nms_pre', -1)
        self.min_bbox_size, self.max_per_img = cfg.get('min_bbox_size', -1), cfg.max_per_img
        self.iou_threshold = nms_cfg['iou_threshold']

    def decode(self, priors: Tensor, deltas: Tensor, height, width) -> Tensor:
        """(N, 4) anchors x1 y1 x2 y2 and (N, 4) deltas -> (N, 4) boxes, in ``delta2bbox``'s order of operations."""
        deltas = deltas * deltas.new_tensor(self.stds) + deltas.new_tensor(self.means)
        centre, size = (priors[:, :2] + priors[:, 2:]) * 0.5, priors[:, 2:] - priors[:, :2]
        shift, log_scale = size * deltas[:, :2], deltas[:, 2:]
        if self.ctr_clamp is None:
            log_scale = log_scale.clamp(min=-self.max_ratio, max=self.max_ratio)
        else:
            shift, log_scale = shift.clamp(-self.ctr_clamp, self.ctr_clamp), log_scale.clamp(max=self.max_ratio)
        centre, size = centre + shift, size * log_scale.exp()
        boxes = torch.cat([centre - size * 0.5, centre + size * 0.5], dim=-1)
        if self.clip_border:
            x, y = boxes[:, 0::2].clamp(min=0, max=width), boxes[:, 1::2].clamp(min=0, max=height)
            boxes = torch.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], dim=-1)
        return boxes

    def forward(self, cls_scores: Sequence[Tensor], bbox_preds: Sequence[Tensor], height, width
                ) -> Tuple[Tensor, Tensor, Tensor]:
        """Per level (1, A * classes, h, w) scores and (1, A * 4, h, w) deltas; the image's height and width.

        Returns (K, 4) boxes x1 y1 x2 y2 in the input's pixels, (K,) scores and (K,) int64 labels, best first.
        """
        priors = self.prior_generator.grid_priors([score.shape[-2:] for score in cls_scores],
                                                  dtype=cls_scores[0].dtype, device=cls_scores[0].device)
        boxes, scores, labels = [], [], []
        for level_scores, level_deltas, level_priors in zip(cls_scores, bbox_preds, priors):
            level_scores = level_scores[0].permute(1, 2, 0).reshape(-1).sigmoid()
            candidates = (level_scores > self.score_thr).nonzero()[:, 0]
            order = level_scores[candidates].argsort(descending=True)
            if self.nms_pre > 0:
                order = order[:self.nms_pre]
            candidates = candidates[order]
            anchor = candidates // self.num_classes
            deltas = level_deltas[0].permute(1, 2, 0).reshape(-1, 4)[anchor]
            boxes.append(self.decode(level_priors[anchor], deltas, height, width))
            scores.append(level_scores[candidates])
            labels.append(candidates % self.num_classes)
        boxes, scores, labels = torch.cat(boxes), torch.cat(scores), torch.cat(labels)
        if self.min_bbox_size >= 0:
            size = boxes[:, 2:] - boxes[:, :2]
            large = ((size[:, 0] > self.min_bbox_size) & (size[:, 1] > self.min_bbox_size)).nonzero()[:, 0]
            boxes, scores, labels = boxes[large], scores[large], labels[large]
        # the largest coordinate, -inf (and no offsets) where no box is left
        largest = nn.functional.pad(boxes.reshape(-1), (0, 1), value=-math.inf).max()
        offsets = labels.to(boxes.dtype) * (largest + 1)
        kept = NonMaxSuppression.apply(boxes + offsets[:, None], scores, self.iou_threshold)[:self.max_per_img]
        return boxes[kept], scores[kept], labels[kept]


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
                      f'detector with a bbox_head or rpn_head; export its backbone with `backbone_only=True`')


def export_onnx(module: ImageToTensors, example: Tensor, path: str, dynamic: bool = False, opset: int = 18,
                exporter: str = 'dynamo') -> List[str]:
    """Write ``module`` traced on ``example`` to ``path``; with ``dynamic``, batch, height and width are free.

    Returns the output names.
    """
    if exporter not in EXPORTERS:
        raise ExportError(f'unknown exporter {exporter!r}; choose one of {EXPORTERS}')
    detections = module.detections is not None
    if detections and (exporter != 'torchscript' or example.shape[0] != 1):
        raise ExportError('`nms=True` exports the detections of one image with the TorchScript exporter: pass '
                          "`exporter='torchscript'` (the dynamo exporter has no lowering of NMS)")
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
        free = {2: 'height', 3: 'width'} if detections else {0: 'batch', 2: 'height', 3: 'width'}
        options['dynamic_axes'] = {'image': free, **{name: {0: 'detections'} for name in names if detections}}
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
    produced = [torch.from_numpy(output) for output in produced]
    if reference.detections is not None:
        produced = pair_detections(expected, produced)
    rows = []
    for name, ours, theirs in zip(reference.describe_outputs(expected), expected, produced):
        if theirs.shape != ours.shape:
            raise ExportError(f'output {name}: ONNX Runtime gives shape {tuple(theirs.shape)}, PyTorch '
                              f'{tuple(ours.shape)}')
        if ours.numel() == 0:  # a detector that finds nothing, in both
            max_abs = scale = 0.0
        else:
            max_abs = (theirs.double() - ours.double()).abs().max().item()
            scale = ours.double().abs().max().item()
        rows.append(dict(output=name, shape=tuple(ours.shape), max_abs=max_abs,
                         max_rel=max_abs / scale if scale else max_abs))
    return rows


def pair_detections(expected: Sequence[Tensor], produced: Sequence[Tensor]) -> List[Tensor]:
    """ONNX Runtime's (boxes, scores, labels) reordered to pair with PyTorch's, detection by detection.

    Both list the detections best first, but where two scores differ by less than the engines' rounding (an
    untrained head gives many such near-ties) the order of the two may differ. Each PyTorch detection, best
    first, is paired with the nearest unpaired box of its class; the differences of the pairs are then what the
    comparison measures, so a box that only one engine keeps shows as a large one.
    """
    boxes, _, labels = expected
    their_boxes, _, their_labels = produced
    if len(their_boxes) != len(boxes):
        raise ExportError(f'ONNX Runtime finds {len(their_boxes)} detections, PyTorch {len(boxes)}')
    distance = (boxes[:, None].double() - their_boxes[None].double()).abs().amax(-1)
    distance[labels[:, None] != their_labels[None]] = math.inf
    pairs = []
    for detection, row in enumerate(distance):
        partner = int(row.argmin())
        if math.isinf(row[partner]):
            raise ExportError(f'PyTorch detection {detection} (class {int(labels[detection])}) has no ONNX Runtime '
                              f'detection of its class left to pair with')
        pairs.append(partner)
        distance[:, partner] = math.inf
    index = torch.tensor(pairs, dtype=torch.long)
    return [output[index] for output in produced]


def check_shape(shape: Optional[Sequence[int]], minimum: int = 32) -> Tuple[int, int]:
    """``shape`` as (H, W), or a clear :class:`ExportError`."""
    if shape is None or len(shape) != 2 or any(not isinstance(s, int) or s < minimum for s in shape):
        raise ExportError(f'`shape` needs two integers H W, each at least {minimum}; got {shape}')
    return tuple(shape)
