"""A two-stage detector's detections in standard ONNX operators: region proposals, multi-level RoIAlign, the box
heads (one, or a cascade's stages), per-class NMS and the instance masks pasted into the image.

Each step computes what mmdet's ``predict`` computes for one image, in the same order of operations; what mmdet
does with mmcv's compiled ops (``nms``, ``roi_align``) or with Python control flow (per-level loops over a
variable number of boxes, early exits when no box is left) is written in operations that tracing keeps:
ONNX's ``NonMaxSuppression`` and ``RoiAlign`` (opset 16's ``half_pixel`` mode is mmcv's ``aligned=True``), and
masks pasted with matmuls.
"""
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .detections import AnchorHeadOutputs, BoxDecoder, NonMaxSuppression, batched_nms, large_boxes, nms_iou_threshold
from .errors import ExportError

# ONNX's RoiAlign takes coordinate_transformation_mode (mmcv's `aligned`) from opset 16
ROI_ALIGN_OPSET = 16


class RoIAlign(torch.autograd.Function):
    """mmcv's ``roi_align`` (average pooling) when run, ONNX's ``RoiAlign`` when exported."""

    @staticmethod
    def forward(ctx, features: Tensor, rois: Tensor, output_size: Tuple[int, int], spatial_scale: float,
                sampling_ratio: int, aligned: bool) -> Tensor:
        from mmcv.ops import roi_align
        return roi_align(features, rois, output_size, spatial_scale, sampling_ratio, 'avg', aligned)

    @staticmethod
    def symbolic(g, features, rois, output_size, spatial_scale, sampling_ratio, aligned):
        def constant(value):
            return g.op('Constant', value_t=torch.tensor(value, dtype=torch.int64))

        # mmcv's rois are (K, 5) rows of batch index, x1, y1, x2, y2; ONNX takes the index apart, as int64
        batch = g.op('Cast', g.op('Gather', rois, constant(0), axis_i=1), to_i=7)
        boxes = g.op('Slice', rois, constant([1]), constant([5]), constant([1]))
        return g.op('RoiAlign', features, boxes, batch, mode_s='avg',
                    coordinate_transformation_mode_s='half_pixel' if aligned else 'output_half_pixel',
                    output_height_i=output_size[0], output_width_i=output_size[1],
                    sampling_ratio_i=sampling_ratio, spatial_scale_f=spatial_scale)


class RoIFeatures(nn.Module):
    """mmdet's ``SingleRoIExtractor``: each box pooled from the level its size maps to.

    Level ``floor(log2(sqrt(w h) / finest_scale + 1e-6))``, clamped to the levels there are. Each level pools its
    own boxes (found with ``nonzero``, as mmdet does), and the pooled features are put back in the boxes' order.
    """

    def __init__(self, extractor: nn.Module):
        super().__init__()
        if type(extractor).__name__ != 'SingleRoIExtractor':
            raise ExportError(f'RoI features come from {type(extractor).__name__}; the export supports '
                              f'SingleRoIExtractor')
        self.finest_scale = extractor.finest_scale
        self.levels = []
        for layer in extractor.roi_layers:
            if type(layer).__name__ != 'RoIAlign' or getattr(layer, 'pool_mode', 'avg') != 'avg':
                raise ExportError(f'RoI features pooled by {type(layer).__name__} '
                                  f'({getattr(layer, "pool_mode", "")}); the export supports RoIAlign, average')
            self.levels.append((tuple(layer.output_size), float(layer.spatial_scale), int(layer.sampling_ratio),
                                bool(layer.aligned)))

    def pool(self, level: int, features: Tensor, rois: Tensor) -> Tensor:
        return RoIAlign.apply(features, rois, *self.levels[level])

    def forward(self, features: Sequence[Tensor], boxes: Tensor) -> Tensor:
        """The neck's (1, C, h, w) maps and (K, 4) boxes -> (K, C, output height, output width)."""
        rois = torch.cat([boxes.new_zeros(boxes.shape[0], 1), boxes], dim=1)
        if len(self.levels) == 1:
            return self.pool(0, features[0], rois)
        scale = torch.sqrt((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]))
        level = torch.floor(torch.log2(scale / self.finest_scale + 1e-6)).clamp(min=0, max=len(self.levels) - 1)
        pooled, order = [], []
        for index in range(len(self.levels)):
            members = (level == index).nonzero()[:, 0]
            pooled.append(self.pool(index, features[index], rois[members]))
            order.append(members)
        return torch.cat(pooled)[torch.cat(order).argsort()]


class RegionProposals(AnchorHeadOutputs):
    """An RPN head's proposals for one image, as its ``predict_by_feat`` computes them.

    Per level, the ``nms_pre`` highest scores; their anchors' deltas decoded to boxes clipped to the image; boxes
    no wider or taller than ``min_bbox_size`` dropped; NMS within each level; the best ``max_per_img``.
    """

    def forward(self, features: Sequence[Tensor], height, width) -> Tensor:
        """The neck's maps -> (P, 4) proposals, best first."""
        cls_scores, bbox_preds = self.head(features)
        boxes, scores, levels = [], [], []
        for level, (level_scores, level_deltas, level_priors) in enumerate(
                zip(cls_scores, bbox_preds, self.anchors(cls_scores))):
            level_scores = level_scores[0].permute(1, 2, 0).reshape(-1).sigmoid()
            order = level_scores.argsort(descending=True)
            if self.nms_pre > 0:
                order = order[:self.nms_pre]
            deltas = level_deltas[0].permute(1, 2, 0).reshape(-1, 4)[order]
            boxes.append(self.decode(level_priors[order], deltas, height, width))
            scores.append(level_scores[order])
            levels.append(torch.full_like(order, level))
        boxes, scores, levels = torch.cat(boxes), torch.cat(scores), torch.cat(levels)
        if self.min_bbox_size >= 0:
            boxes, scores, levels = large_boxes(self.min_bbox_size, boxes, scores, levels)
        return boxes[batched_nms(boxes, scores, levels, self.iou_threshold)[:self.max_per_img]]


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
