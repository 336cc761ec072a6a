# Cascade Mask R-CNN with a MALA backbone; the leaf config names the variant and the neck's input widths.
_base_ = ['mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py', '../../../_base_/mala_backbone.py']

model = dict(
    backbone=_base_.mala_backbone,
    # three stages of 4conv1fc box heads with SyncBN, regressing decoded boxes under a GIoU loss
    roi_head=dict(bbox_head=[
        dict(
            type='Shared4Conv1FCBBoxHead',
            in_channels=256,
            conv_out_channels=256,
            fc_out_channels=1024,
            roi_feat_size=7,
            num_classes=80,
            bbox_coder=dict(
                type='DeltaXYWHBBoxCoder',
                target_means=[0., 0., 0., 0.],
                target_stds=stage_stds),
            reg_class_agnostic=False,
            reg_decoded_bbox=True,
            norm_cfg=dict(type='SyncBN', requires_grad=True),
            loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
            loss_bbox=dict(type='GIoULoss', loss_weight=10.0))
        for stage_stds in ([0.1, 0.1, 0.2, 0.2], [0.05, 0.05, 0.1, 0.1], [0.033, 0.033, 0.067, 0.067])
    ]))
