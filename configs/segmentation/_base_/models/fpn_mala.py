# Semantic FPN with a MALA backbone; the leaf config names the variant and the neck's input widths.
_base_ = ['mmseg::_base_/models/fpn_r50.py', '../../../_base_/mala_backbone.py']

model = dict(
    data_preprocessor=dict(size=(512, 512)),  # pad to the training crop
    pretrained=None,
    backbone=_base_.mala_backbone,
    decode_head=dict(num_classes=150))  # ADE20K
