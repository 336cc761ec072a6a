# MALA-B in every paper config: its arch, its ImageNet-1K weights and the widths of its four outputs.
# The dense runs keep the arch's own drop path rate.
# the release's classification checkpoint, downloaded to this local path
pretrained = 'checkpoints/mala_b_in1k.pth'
mala_variant = dict(arch='base', init_cfg=dict(type='Pretrained', checkpoint=pretrained))
mala_channels = [96, 192, 384, 512]
