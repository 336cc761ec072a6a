# Mask R-CNN with a MALA backbone; the leaf config names the variant and the neck's input widths.
_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py', '../../../_base_/mala_backbone.py']

model = dict(backbone=_base_.mala_backbone)
