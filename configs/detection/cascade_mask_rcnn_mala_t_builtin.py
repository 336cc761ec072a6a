# MALA-T Cascade Mask R-CNN on the built-in shapes dataset, trained from scratch.
_base_ = ['mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py', './_base_/builtin_detectors.py']

norm_cfg = _base_.norm_cfg
# the three stages as in mmdet's base: each regresses finer offsets and takes a higher IoU as positive
stage_target_stds = [[0.1, 0.1, 0.2, 0.2], [0.05, 0.05, 0.1, 0.1], [0.033, 0.033, 0.067, 0.067]]
stage_ious = [0.5, 0.6, 0.7]
model = dict(
    _base_.builtin_two_stage,
    roi_head=dict(
        _base_.builtin_roi_head,
        bbox_head=[
            dict(type='Shared2FCBBoxHead', in_channels=128, fc_out_channels=256, roi_feat_size=7, num_classes=4,
                 bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0.0] * 4, target_stds=stds),
                 reg_class_agnostic=True,
                 loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
                 loss_bbox=dict(type='SmoothL1Loss', beta=1.0, loss_weight=1.0))
            for stds in stage_target_stds]),
    train_cfg=dict(
        _base_.builtin_rpn_train_cfg,
        rcnn=[
            dict(assigner=dict(type='MaxIoUAssigner', pos_iou_thr=iou, neg_iou_thr=iou, min_pos_iou=iou,
                               match_low_quality=False, ignore_iof_thr=-1),
                 sampler=dict(type='RandomSampler', num=64, pos_fraction=0.25, neg_pos_ub=-1,
                              add_gt_as_proposals=True),
                 mask_size=28, pos_weight=-1, debug=False)
            for iou in stage_ious]),
    test_cfg=_base_.builtin_two_stage_test_cfg)
