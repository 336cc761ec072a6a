_base_ = './_base_/mask_rcnn_mala_3x.py'

# ImageNet-1K MALA-L classification checkpoint of the authors' release, downloaded to this local path
pretrained = 'checkpoints/mala_l_in1k.pth'

model = dict(
    backbone=dict(arch='large', drop_path_rate=0.55, init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 448, 640]))

# the release trains MALA-L 3x with 1 image per GPU (8 in all) at lr 2e-4
train_dataloader = dict(batch_size=1)
optim_wrapper = dict(optimizer=dict(lr=2e-4))
auto_scale_lr = dict(base_batch_size=8)
