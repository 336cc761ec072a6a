_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py', '../../../_base_/mala_s_backbone.py']

model = dict(
    backbone={{_base_.mala_s_backbone}},
    neck=dict(in_channels=[64, 128, 320, 512]))
