_base_ = ['./_base_/upernet_mala_160k.py', '../_base_/mala_b.py']

model = dict(
    backbone=_base_.mala_variant,
    decode_head=dict(in_channels=_base_.mala_channels),
    auxiliary_head=dict(in_channels=_base_.mala_channels[2]))
