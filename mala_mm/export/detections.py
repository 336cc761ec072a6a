"""A detector's post-processing in exportable operations: box decoding, NMS as ONNX's ``NonMaxSuppression``, and
a single-stage detector's detections."""
import inspect
import math
from typing import Sequence, Tuple

import torch
from torch import Tensor, nn

from .errors import ExportError


class NonMaxSuppression(torch.autograd.Function):
    """NMS within each of G groups: mmcv's ``nms`` when run, ONNX's ``NonMaxSuppression`` when exported (both
    suppress a box whose IoU with a kept one exceeds the threshold).

    (G, N, 4) boxes x1 y1 x2 y2 and (G, N) scores; only boxes scoring above ``score_threshold`` take part.
    Returns (M, 2) int64 rows (group, box index): the boxes kept, group by group, each group's by descending score.
    """

    @staticmethod
    def forward(ctx, boxes: Tensor, scores: Tensor, iou_threshold: float, score_threshold: float) -> Tensor:
        from mmcv.ops import nms
        rows = [boxes.new_zeros((0, 2), dtype=torch.int64)]
        for group in range(boxes.shape[0]):
            candidates = (scores[group] > score_threshold).nonzero()[:, 0]
            if len(candidates):
                kept = candidates[nms(boxes[group, candidates], scores[group, candidates], iou_threshold)[1]]
                rows.append(torch.stack([torch.full_like(kept, group), kept], dim=1))
        return torch.cat(rows)

    @staticmethod
    def symbolic(g, boxes, scores, iou_threshold, score_threshold):
        def constant(value, dtype=torch.int64):
            return g.op('Constant', value_t=torch.tensor(value, dtype=dtype))

        # ONNX's operator takes (batch, boxes, 4) and (batch, classes, boxes): the groups as its batch, one class
        selected = g.op('NonMaxSuppression', boxes, g.op('Unsqueeze', scores, constant([1])),
                        constant([2 ** 31 - 1]), constant([iou_threshold], torch.float32),
                        constant([score_threshold], torch.float32))
        return g.op('Gather', selected, constant([0, 2]), axis_i=1)  # its rows are (batch, class, box)


def batched_nms(boxes: Tensor, scores: Tensor, groups: Tensor, iou_threshold: float) -> Tensor:
    """NMS within each group (class or level) as mmcv's ``batched_nms`` does it below its ``split_thr``: each
    group's boxes shifted by the group index times the largest coordinate, so that groups never overlap, and one
    NMS. (N, 4), (N,), (N,) -> indices kept, best first."""
    # the largest coordinate, -inf (and no offsets) where there is no box
    largest = nn.functional.pad(boxes.reshape(-1), (0, 1), value=-math.inf).max()
    offsets = groups.to(boxes.dtype) * (largest + 1)
    return NonMaxSuppression.apply((boxes + offsets[:, None])[None], scores[None], iou_threshold, -math.inf)[:, 1]


def nms_iou_threshold(cfg, owner: str) -> float:
    """The IoU threshold of a test config's plain per-group ``nms``, or an :class:`ExportError` naming ``owner``."""
    nms = cfg.get('nms') or {}
    if nms.get('type', 'nms') != 'nms' or nms.get('class_agnostic') or nms.get('offset'):
        raise ExportError(f'{owner} test_cfg.nms is {dict(nms)}; the export has plain per-class nms only')
    return nms['iou_threshold']


class BoxDecoder:
    """mmdet's ``DeltaXYWHBBoxCoder.decode`` with the image's size as ``max_shape``, in exportable operations.

    Args:
        coder: the head's ``bbox_coder``.
        owner: the head, as messages name it.
    """

    def __init__(self, coder, owner: str):
        if type(coder).__name__ != 'DeltaXYWHBBoxCoder':
            raise ExportError(f'{owner} codes its boxes with {type(coder).__name__}; the export decodes '
                              f'DeltaXYWHBBoxCoder only')
        self.means, self.stds = coder.means, coder.stds
        self.clip_border, self.ctr_clamp = coder.clip_border, coder.ctr_clamp if coder.add_ctr_clamp else None
        # the heads decode with the coder's default wh_ratio_clip, which is an argument of decode, not a field
        wh_ratio_clip = inspect.signature(coder.decode).parameters['wh_ratio_clip'].default
        self.max_ratio = abs(math.log(wh_ratio_clip))

    def __call__(self, priors: Tensor, deltas: Tensor, height, width) -> Tensor:
        """(N, 4) priors x1 y1 x2 y2 and (N, 4 k) deltas (k boxes per prior) -> (N, 4 k) boxes, in
        ``delta2bbox``'s order of operations."""
        per_prior = deltas.shape[1] // 4
        priors = priors.repeat(1, per_prior).reshape(-1, 4)
        deltas = deltas.reshape(-1, 4) * deltas.new_tensor(self.stds) + deltas.new_tensor(self.means)
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
        return boxes.reshape(-1, 4 * per_prior)


class AnchorHeadOutputs(nn.Module):
    """The base of an anchor head's post-processing: the head, its box decoder and its test config's settings.

    Args:
        head: an mmdet anchor head with sigmoid class scores and ``DeltaXYWHBBoxCoder`` boxes.
    """

    def __init__(self, head: nn.Module):
        super().__init__()
        owner = type(head).__name__
        problems = []
        if not getattr(head, 'use_sigmoid_cls', False):
            problems.append('softmax class scores')
        if not hasattr(head.prior_generator, 'base_anchors'):
            problems.append(f'priors from {type(head.prior_generator).__name__}, not an anchor generator')
        if problems:
            raise ExportError(f'{owner} has ' + ', '.join(problems) + '; the export supports anchor heads with '
                              'sigmoid scores')
        self.head, self.decode = head, BoxDecoder(head.bbox_coder, owner)
        cfg = head.test_cfg
        self.iou_threshold = nms_iou_threshold(cfg, owner)
        self.score_thr, self.nms_pre = cfg.get('score_thr', 0), cfg.get('nms_pre', -1)
        self.min_bbox_size, self.max_per_img = cfg.get('min_bbox_size', -1), cfg.max_per_img

    def anchors(self, cls_scores: Sequence[Tensor]) -> Sequence[Tensor]:
        """The anchors of each level's (1, A * C, h, w) map, as (h * w * A, 4) x1 y1 x2 y2."""
        return self.head.prior_generator.grid_priors([score.shape[-2:] for score in cls_scores],
                                                     dtype=cls_scores[0].dtype, device=cls_scores[0].device)


class DenseDetections(AnchorHeadOutputs):
    """An anchor head's detections for one image, computed as its ``predict_by_feat`` does, in exportable ops.

    Per level, the class scores above ``score_thr`` (at most ``nms_pre`` of them, the highest); their anchors'
    deltas decoded to boxes clipped to the image; boxes no wider or taller than ``min_bbox_size`` dropped; NMS
    per class; the best ``max_per_img``. The head's ``predict_by_feat`` takes shortcuts that tracing would freeze
    (no box at all, ``min(nms_pre, count)``) and an NMS that ONNX has no lowering of; these steps take none.

    Args:
        head: an mmdet anchor head with sigmoid class scores and ``DeltaXYWHBBoxCoder`` boxes (RetinaNet's).
    """

    def __init__(self, head: nn.Module):
        super().__init__(head)
        self.num_classes = head.cls_out_channels

    def forward(self, features: Sequence[Tensor], height, width) -> Tuple[Tensor, Tensor, Tensor]:
        """The neck's (1, C, h, w) maps and the image's height and width (before padding).

        Returns (K, 4) boxes x1 y1 x2 y2 in the input's pixels, (K,) scores and (K,) int64 labels, best first.
        """
        outputs = self.head(features)
        if len(outputs) != 2:
            raise ExportError(f'the export supports heads that return class scores and box deltas; '
                              f'{type(self.head).__name__} also returns {len(outputs) - 2} more (score factors)')
        cls_scores, bbox_preds = outputs
        boxes, scores, labels = [], [], []
        for level_scores, level_deltas, level_priors in zip(cls_scores, bbox_preds, self.anchors(cls_scores)):
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
            boxes, scores, labels = large_boxes(self.min_bbox_size, boxes, scores, labels)
        kept = batched_nms(boxes, scores, labels, self.iou_threshold)[:self.max_per_img]
        return boxes[kept], scores[kept], labels[kept]


def large_boxes(min_size: float, boxes: Tensor, *others: Tensor) -> Tuple[Tensor, ...]:
    """The boxes wider and taller than ``min_size``, and the same rows of ``others``."""
    size = boxes[:, 2:] - boxes[:, :2]
    large = ((size[:, 0] > min_size) & (size[:, 1] > min_size)).nonzero()[:, 0]
    return (boxes[large], *(other[large] for other in others))
