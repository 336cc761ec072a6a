# What the built-in detectors share beyond ../../_base_/builtin_mala_t.py: the built-in shapes data in COCO format,
# necks and heads for it, and a 500-iteration schedule.
_base_ = ['./datasets/builtin_instance.py', './default_runtime.py', '../../_base_/builtin_mala_t.py']

norm_cfg = _base_.builtin_norm_cfg
# necks and heads narrower than COCO's: at this resolution they, the mask head above all, would cost more than
# the backbone; BN in them lets them learn from scratch within a few hundred iterations
builtin_neck = dict(in_channels=_base_.mala_channels, out_channels=128, norm_cfg=norm_cfg)
builtin_rpn_head = dict(in_channels=128, feat_channels=128, anchor_generator=dict(scales=[4]))  # objects: 33-67 px
# the two-stage detectors: backbone, neck and RPN, and their RoI heads' widths and mask branch; each adds its box
# heads and their training settings
builtin_two_stage = dict(backbone=_base_.builtin_backbone, neck=builtin_neck, rpn_head=builtin_rpn_head)
builtin_roi_head = dict(
    bbox_roi_extractor=dict(out_channels=128),
    mask_roi_extractor=dict(out_channels=128),
    mask_head=dict(in_channels=128, num_convs=2, conv_out_channels=64, norm_cfg=norm_cfg, num_classes=4))
# a few shapes per image need far fewer proposals and samples than COCO
builtin_rpn_train_cfg = dict(rpn=dict(sampler=dict(num=64)), rpn_proposal=dict(nms_pre=500, max_per_img=200))
builtin_two_stage_test_cfg = dict(rpn=dict(nms_pre=300, max_per_img=100), rcnn=dict(max_per_img=20))

max_iters = 500
train_cfg = dict(max_iters=max_iters, val_interval=max_iters)
# at 1e-3 the RoI head from scratch oscillates instead of settling
optim_wrapper = dict(optimizer=dict(lr=3e-4, weight_decay=0.05))
# warm-up, then the full rate until the last fifth: a short run needs every step at full speed
param_scheduler = [
    dict(_base_.builtin_warmup, end=50),
    dict(type='MultiStepLR', by_epoch=False, begin=0, end=max_iters, milestones=[int(0.8 * max_iters)], gamma=0.1),
]

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=_base_.log_interval),
    checkpoint=dict(_base_.builtin_checkpoint, interval=max_iters))
log_processor = dict(window_size=_base_.log_interval, by_epoch=False)
