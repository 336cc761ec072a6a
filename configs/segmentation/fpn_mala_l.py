_base_ = './_base_/fpn_mala_80k.py'

# ImageNet-1K MALA-L classification checkpoint of the authors' release, downloaded to this local path
pretrained = 'checkpoints/mala_l_in1k.pth'

model = dict(
    backbone=dict(arch='large', drop_path_rate=0.55, init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[96, 192, 448, 640]))
