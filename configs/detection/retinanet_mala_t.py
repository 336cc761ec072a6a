_base_ = './_base_/retinanet_mala_1x.py'

# ImageNet-1K MALA-T classification checkpoint of the authors' release, downloaded to this local path
pretrained = 'checkpoints/mala_t_in1k.pth'

model = dict(
    backbone=dict(arch='tiny', drop_path_rate=0.1, init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 256, 512]))
