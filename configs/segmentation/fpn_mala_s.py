_base_ = ['./_base_/fpn_mala_80k.py', '../_base_/mala_s.py']

model = dict(backbone=_base_.mala_variant, neck=dict(in_channels=_base_.mala_channels))
