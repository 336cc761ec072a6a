_base_ = ['./_base_/mask_rcnn_mala_1x.py', '../_base_/mala_b.py']

model = dict(backbone=_base_.mala_variant, neck=dict(in_channels=_base_.mala_channels))
