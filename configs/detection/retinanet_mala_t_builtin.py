# MALA-T RetinaNet on the built-in shapes dataset, trained from scratch.
_base_ = ['mmdet::_base_/models/retinanet_r50_fpn.py', './_base_/builtin_runtime.py']

model = dict(
    backbone={{_base_.builtin_backbone}},
    neck={{_base_.builtin_neck}},  # from stage 2 (mmdet's start_level=1), as in the paper's RetinaNet
    # GN, not BN: the head is shared by the pyramid levels, whose statistics BN would mix; from scratch it then
    # learns many times slower
    bbox_head=dict(in_channels=128, feat_channels=128, norm_cfg=dict(type='GN', num_groups=32), num_classes=4),
    test_cfg=dict(max_per_img=20))
# stage 1's output norm feeds no FPN level (start_level=1), so DDP must tolerate its unused parameters
find_unused_parameters = True

val_evaluator = dict(metric='bbox')
test_evaluator = val_evaluator
