# MALA-L in every paper config: its settings, its ImageNet-1K weights and the widths of its four outputs.
# the release's classification checkpoint, downloaded to this local path
pretrained = 'checkpoints/mala_l_in1k.pth'
mala_variant = dict(arch='large', drop_path_rate=0.55, init_cfg=dict(type='Pretrained', checkpoint=pretrained))
mala_channels = [96, 192, 448, 640]
