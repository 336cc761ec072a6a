# MALA-T Mask R-CNN on the built-in shapes dataset, trained from scratch.
_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py', './_base_/builtin_runtime.py']

norm_cfg = {{_base_.norm_cfg}}
model = dict(
    data_preprocessor=dict(pad_size_divisor=32),
    backbone={{_base_.builtin_backbone}},
    # heads narrower than COCO's: at this resolution they, the mask head above all, would cost more than
    # the backbone; BN in the neck and heads lets them learn from scratch within a few hundred iterations
    neck=dict(in_channels=[64, 128, 256, 512], out_channels=128, norm_cfg=norm_cfg),
    rpn_head=dict(in_channels=128, feat_channels=128, anchor_generator=dict(scales=[4])),  # objects: 33-67 px
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
