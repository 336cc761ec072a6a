# MALA-S in every paper config: its settings, its ImageNet-1K weights and the widths of its four outputs.
# the release's classification checkpoint, downloaded to this local path
pretrained = 'checkpoints/mala_s_in1k.pth'
mala_variant = dict(arch='small', drop_path_rate=0.15, init_cfg=dict(type='Pretrained', checkpoint=pretrained))
mala_channels = [64, 128, 320, 512]
