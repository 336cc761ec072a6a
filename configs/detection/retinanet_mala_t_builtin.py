# MALA-T RetinaNet on the built-in shapes dataset, trained from scratch.
_base_ = ['mmdet::_base_/models/retinanet_r50_fpn.py', './_base_/builtin_detectors.py']

model = dict(
    # FPN from stage 2, as in the paper's RetinaNet
    backbone=dict(_base_.builtin_backbone, out_indices=(1, 2, 3)),
    neck=dict(_base_.builtin_neck, in_channels=_base_.mala_channels[1:], start_level=0),
    # GN, not BN: the head is shared by the pyramid levels, whose statistics BN would mix; from scratch it then
    # learns many times slower
    bbox_head=dict(in_channels=128, feat_channels=128, norm_cfg=dict(type='GN', num_groups=32), num_classes=4),
    test_cfg=dict(max_per_img=20))

val_evaluator = dict(metric='bbox')
test_evaluator = val_evaluator
