"""A single-stage detector's detections in exportable operations: box decoding, score threshold, and NMS as ONNX's
``NonMaxSuppression``."""
import inspect
import math
from typing import Sequence, Tuple

import torch
from torch import Tensor, nn

from .errors import ExportError


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
        # the head decodes with the coder's default wh_ratio_clip, which is an argument of decode, not a field
        wh_ratio_clip = inspect.signature(coder.decode).parameters['wh_ratio_clip'].default
        self.max_ratio = abs(math.log(wh_ratio_clip))
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
