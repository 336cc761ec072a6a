_base_ = './_base_/upernet_mala_160k.py'

# ImageNet-1K MALA-L classification checkpoint of the authors' release, downloaded to this local path
pretrained = 'checkpoints/mala_l_in1k.pth'

model = dict(
    backbone=dict(arch='large', drop_path_rate=0.55, init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[96, 192, 448, 640]),
    auxiliary_head=dict(in_channels=448))

# the release trains MALA-L on ADE20K with 1 image per GPU (8 in all) at the same lr
train_dataloader = dict(batch_size=1)
auto_scale_lr = dict(base_batch_size=8)
