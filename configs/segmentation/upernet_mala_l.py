_base_ = ['./_base_/upernet_mala_160k.py', '../_base_/mala_l.py']

model = dict(
    backbone=_base_.mala_variant,
    decode_head=dict(in_channels=_base_.mala_channels),
    auxiliary_head=dict(in_channels=_base_.mala_channels[2]))

# the release trains MALA-L on ADE20K with 1 image per GPU (8 in all) at the same lr
train_dataloader = dict(batch_size=1)
auto_scale_lr = dict(base_batch_size=8)
