# MALA-T Mask R-CNN on the built-in shapes dataset, trained from scratch.
_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py', './_base_/builtin_runtime.py']

norm_cfg = _base_.norm_cfg
model = dict(
    backbone=_base_.builtin_backbone,
    neck=_base_.builtin_neck,
    rpn_head=_base_.builtin_rpn_head,
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=128),
        bbox_head=dict(
            type='Shared4Conv1FCBBoxHead', in_channels=128, conv_out_channels=128, fc_out_channels=256,
            norm_cfg=norm_cfg, num_classes=4),
        mask_roi_extractor=dict(out_channels=128),
        mask_head=dict(in_channels=128, num_convs=2, conv_out_channels=64, norm_cfg=norm_cfg, num_classes=4)),
    # a few shapes per image need far fewer proposals and samples than COCO
    train_cfg=dict(
        rpn=dict(sampler=dict(num=64)),
        rpn_proposal=dict(nms_pre=500, max_per_img=200),
        rcnn=dict(sampler=dict(num=64))),
    test_cfg=dict(
        rpn=dict(nms_pre=300, max_per_img=100),
        rcnn=dict(max_per_img=20)))
