"""The regions a two-stage detector looks at, in standard ONNX operators: the RPN's proposals, and each proposal's
features pooled by multi-level RoIAlign (ONNX's ``RoiAlign``: opset 16's ``half_pixel`` mode is mmcv's
``aligned=True``). The heads that score them: :mod:`.two_stage`."""
from typing import Sequence, Tuple

import torch
from torch import Tensor, nn

from .detections import AnchorHeadOutputs, batched_nms, large_boxes
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
