_base_ = ['./_base_/mask_rcnn_mala_3x.py', '../_base_/mala_l.py']

model = dict(backbone=_base_.mala_variant, neck=dict(in_channels=_base_.mala_channels))

# the release trains MALA-L 3x with 1 image per GPU (8 in all) at lr 2e-4
train_dataloader = dict(batch_size=1)
optim_wrapper = dict(optimizer=dict(lr=2e-4))
auto_scale_lr = dict(base_batch_size=8)
