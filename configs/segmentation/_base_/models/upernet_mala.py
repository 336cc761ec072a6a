_base_ = ['mmseg::_base_/models/upernet_r50.py', '../../../_base_/mala_s_backbone.py']

model = dict(
    data_preprocessor=dict(size=(512, 512)),  # pad to the training crop
    pretrained=None,
    backbone={{_base_.mala_s_backbone}},
    decode_head=dict(in_channels=[64, 128, 320, 512], channels=512, num_classes=150),
    # auxiliary FCN head on stage 3
    auxiliary_head=dict(
        in_channels=320, in_index=2, num_classes=150,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=0.4)))
