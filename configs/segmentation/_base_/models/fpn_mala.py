_base_ = ['mmseg::_base_/models/fpn_r50.py', '../../../_base_/mala_s_backbone.py']

model = dict(
    data_preprocessor=dict(size=(512, 512)),  # pad to the training crop
    pretrained=None,
    backbone={{_base_.mala_s_backbone}},
    neck=dict(in_channels=[64, 128, 320, 512], out_channels=256),
    decode_head=dict(channels=128, num_classes=150))
