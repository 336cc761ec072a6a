# MALA-T RetinaNet on the built-in shapes dataset, trained from scratch.
_base_ = ['mmdet::_base_/models/retinanet_r50_fpn.py', './_base_/builtin_runtime.py']

norm_cfg = {{_base_.norm_cfg}}
model = dict(
    data_preprocessor=dict(pad_size_divisor=32),
    backbone={{_base_.builtin_backbone}},
    # FPN from stage 2 as in the paper's RetinaNet; heads narrower than COCO's, normalised to learn from scratch
    neck=dict(in_channels=[64, 128, 256, 512], out_channels=128, norm_cfg=norm_cfg),
    # GN, not BN: the head is shared by the pyramid levels, whose statistics BN would mix; from scratch it then
    # learns many times slower
    bbox_head=dict(in_channels=128, feat_channels=128, norm_cfg=dict(type='GN', num_groups=32), num_classes=4),
    test_cfg=dict(max_per_img=20))
# stage 1's output norm feeds no FPN level (start_level=1), so DDP must tolerate its unused parameters
find_unused_parameters = True

val_evaluator = dict(metric='bbox')
test_evaluator = val_evaluator
