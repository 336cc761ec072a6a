"""A two-stage detector's detections in standard ONNX operators: the box heads (one, or a cascade's stages) on the
proposals' pooled features (:mod:`.regions`), per-class NMS and the instance masks pasted into the image.

Each step computes what mmdet's ``predict`` computes for one image, in the same order of operations; what mmdet
does with mmcv's compiled ops (``nms``, ``roi_align``) or with Python control flow (per-level loops over a
variable number of boxes, early exits when no box is left) is written in operations that tracing keeps:
ONNX's ``NonMaxSuppression`` and ``RoiAlign``, and masks pasted with matmuls.
"""
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .detections import BoxDecoder, NonMaxSuppression, nms_iou_threshold
from .errors import ExportError
from .regions import RegionProposals, RoIFeatures


def roi_head_parts(roi_head: nn.Module, branch: str) -> Tuple[List[nn.Module], List[nn.Module]]:
    """The RoI extractors and heads of ``branch`` ('bbox' or 'mask'), one per stage."""
    extractors, heads = getattr(roi_head, f'{branch}_roi_extractor'), getattr(roi_head, f'{branch}_head')
    if branch == 'mask' and getattr(roi_head, 'share_roi_extractor', False):
        extractors = roi_head.bbox_roi_extractor
    if isinstance(heads, nn.ModuleList):
        return list(extractors), list(heads)
    return [extractors], [heads]


def check_roi_head(roi_head: nn.Module):
    kind = type(roi_head).__name__
    if kind not in ('StandardRoIHead', 'CascadeRoIHead'):
        raise ExportError(f'the RoI head is {kind}; the export supports StandardRoIHead (Mask R-CNN, Faster R-CNN) '
                          f'and CascadeRoIHead')
    if getattr(roi_head, 'with_shared_head', False):
        raise ExportError(f'{kind} has a shared head ({type(roi_head.shared_head).__name__}); the export supports '
                          f'RoI heads without one')


class RoIBoxes(nn.Module):
    """The box heads' detections, as ``StandardRoIHead`` and ``CascadeRoIHead`` predict them.

    Each stage pools its boxes' features and scores them; every stage but the last moves each box by the deltas
    of its best class (``regress_by_class``). The class scores are the softmax of the stages' mean logits; the
    last stage's deltas give each class its box; scores above ``score_thr``, per-class NMS, the best
    ``max_per_img``.
    """

    def __init__(self, roi_head: nn.Module):
        super().__init__()
        extractors, heads = roi_head_parts(roi_head, 'bbox')
        self.extractors = nn.ModuleList(RoIFeatures(extractor) for extractor in extractors)
        self.heads = nn.ModuleList(heads)
        self.decoders = []
        for head in heads:
            owner = type(head).__name__
            if getattr(head, 'custom_cls_channels', False) or not getattr(head, 'with_reg', True):
                raise ExportError(f'{owner} has custom class scores or no box regression; the export supports '
                                  f'softmax scores with box deltas')
            self.decoders.append(BoxDecoder(head.bbox_coder, owner))
        cfg = roi_head.test_cfg
        self.iou_threshold = nms_iou_threshold(cfg, type(roi_head).__name__)
        self.score_thr, self.max_per_img = cfg.score_thr, cfg.max_per_img

    def class_boxes(self, stage: int, boxes: Tensor, deltas: Tensor, height, width) -> Tensor:
        """(K, 4) boxes moved by the stage's (K, 4) or (K, 4 classes) deltas -> (K, 1 or classes, 4)."""
        return self.decoders[stage](boxes, deltas, height, width).reshape(boxes.shape[0], -1, 4)

    def forward(self, features: Sequence[Tensor], proposals: Tensor, height, width
                ) -> Tuple[Tensor, Tensor, Tensor]:
        """The neck's maps and (P, 4) proposals -> (K, 4) boxes, (K,) scores, (K,) labels, best first."""
        boxes, logits = proposals, []
        for stage, (extract, head) in enumerate(zip(self.extractors, self.heads)):
            cls_score, deltas = head(extract(features, boxes))
            logits.append(cls_score)
            if stage < len(self.heads) - 1:
                moved = self.class_boxes(stage, boxes, deltas, height, width)
                if moved.shape[1] > 1:  # class-specific deltas: the box of the best class
                    best = cls_score[:, :-1].argmax(dim=1)
                    moved = moved[torch.arange(moved.shape[0]), best][:, None]
                boxes = moved[:, 0]
        scores = (sum(logits) / float(len(logits))).softmax(dim=-1)[:, :-1]  # the last column is background
        classes = scores.shape[1]
        boxes = self.class_boxes(len(self.heads) - 1, boxes, deltas, height, width).expand(-1, classes, -1)
        # NMS class by class, as mmcv's batched_nms does from 10,000 candidates on. Below that mmcv shifts the
        # classes apart and runs one NMS, whose cost grows with the square of the boxes: a COCO image has up to
        # 80,000, and their one NMS took 4.2 s in ONNX Runtime
        kept = NonMaxSuppression.apply(boxes.transpose(0, 1), scores.t(), self.iou_threshold, self.score_thr)
        labels, proposal = kept[:, 0], kept[:, 1]
        scores = scores[proposal, labels]
        best = scores.argsort(descending=True)[:self.max_per_img]
        return boxes[proposal[best], labels[best]], scores[best], labels[best]


def paste_weights(start: Tensor, end: Tensor, length, size: int) -> Tensor:
    """Bilinear weights that sample a ``size``-cell mask spanning [start, end) of the image at each of ``length``
    pixel centres: (K, 1), (K, 1) -> (K, length, size).

    This is ``grid_sample`` (zeros padding, ``align_corners=False``) along one axis, as mmdet's ``_do_paste_mask``
    calls it: a pixel centre maps to ``u`` in the mask's cells, and cell ``j`` weighs ``max(0, 1 - |u - j|)``.
    """
    centres = torch.arange(length, dtype=start.dtype, device=start.device) + 0.5
    grid = (centres - start) / (end - start) * 2 - 1
    grid = torch.where(torch.isinf(grid), torch.zeros_like(grid), grid)  # a box of no width: the mask's centre
    cell = ((grid + 1) * size - 1) / 2
    cells = torch.arange(size, dtype=start.dtype, device=start.device)
    # on CPU mmdet pastes only from a pixel before the box's first to one after its last (skip_empty)
    inside = (centres >= torch.floor(start) - 1) & (centres < torch.ceil(end) + 1)
    return torch.relu(1 - (cell[..., None] - cells).abs()) * inside[..., None].to(start.dtype)


class InstanceMasks(nn.Module):
    """The mask heads' masks of the detections, pasted into the image as ``FCNMaskHead.predict_by_feat`` does.

    Each stage's mask head scores the detections' pooled features; the probabilities (sigmoid) are averaged over
    the stages (a cascade's ``merge_aug_masks``); each detection's class map is resampled over its box, and the
    image's pixels at or above ``mask_thr_binary`` are the mask (bool), or, with a negative threshold, the
    probability times 255 (uint8). Sampling over the box is separable (mmdet's ``grid_sample`` with bilinear
    weights), so it is two matmuls per mask here, not a sampling grid of the image's size.
    """

    def __init__(self, roi_head: nn.Module):
        super().__init__()
        extractors, heads = roi_head_parts(roi_head, 'mask')
        for head in heads:
            if not hasattr(head, 'class_agnostic') or not hasattr(head, 'conv_logits'):
                raise ExportError(f'the mask head is {type(head).__name__}; the export supports FCNMaskHead')
        self.extractors = nn.ModuleList(RoIFeatures(extractor) for extractor in extractors)
        self.heads = nn.ModuleList(heads)
        self.threshold = roi_head.test_cfg.mask_thr_binary

    def forward(self, features: Sequence[Tensor], boxes: Tensor, labels: Tensor, height, width) -> Tensor:
        """The neck's maps, (K, 4) boxes and (K,) labels -> (K, height, width) masks."""
        probabilities = torch.stack([head(extract(features, boxes)).sigmoid()
                                     for extract, head in zip(self.extractors, self.heads)]).mean(dim=0)
        if probabilities.shape[1] > 1:  # a map per class: the detection's
            probabilities = probabilities[torch.arange(boxes.shape[0]), labels]
        else:
            probabilities = probabilities[:, 0]
        x0, y0, x1, y1 = boxes.split(1, dim=1)
        rows = paste_weights(y0, y1, height, probabilities.shape[-2])
        columns = paste_weights(x0, x1, width, probabilities.shape[-1])
        pasted = rows @ probabilities @ columns.transpose(1, 2)
        if self.threshold >= 0:
            return pasted >= self.threshold
        return (pasted * 255).to(torch.uint8)


class TwoStageDetections(nn.Module):
    """A two-stage detector's detections for one image: proposals, boxes, and masks where it has a mask head.

    Args:
        model: an mmdet two-stage detector (Faster / Mask R-CNN, Cascade (Mask) R-CNN) whose RPN and box heads
            use ``DeltaXYWHBBoxCoder``, RoI features from ``SingleRoIExtractor`` with ``RoIAlign``, and plain NMS.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        check_roi_head(model.roi_head)
        self.proposals = RegionProposals(model.rpn_head)
        self.boxes = RoIBoxes(model.roi_head)
        self.masks: Optional[InstanceMasks] = InstanceMasks(model.roi_head) if model.roi_head.with_mask else None

    def forward(self, features: Sequence[Tensor], height, width) -> Tuple[Tensor, ...]:
        """The neck's (1, C, h, w) maps and the image's height and width (before padding) -> (K, 4) boxes,
        (K,) scores, (K,) int64 labels and, with a mask head, (K, height, width) masks; best first."""
        proposals = self.proposals(features, height, width)
        boxes, scores, labels = self.boxes(features, proposals, height, width)
        if self.masks is None:
            return boxes, scores, labels
        return boxes, scores, labels, self.masks(features, boxes, labels, height, width)
