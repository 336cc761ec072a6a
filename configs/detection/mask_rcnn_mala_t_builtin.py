# MALA-T Mask R-CNN on the built-in shapes dataset, trained from scratch.
_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py', './_base_/builtin_detectors.py']

norm_cfg = _base_.norm_cfg
model = dict(
    _base_.builtin_two_stage,
    roi_head=dict(
        _base_.builtin_roi_head,
        bbox_head=dict(
            type='Shared4Conv1FCBBoxHead', in_channels=128, conv_out_channels=128, fc_out_channels=256,
            norm_cfg=norm_cfg, num_classes=4)),
    train_cfg=dict(_base_.builtin_rpn_train_cfg, rcnn=dict(sampler=dict(num=64))),
    test_cfg=_base_.builtin_two_stage_test_cfg)
