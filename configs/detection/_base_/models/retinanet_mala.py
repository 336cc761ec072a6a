_base_ = 'mmdet::_base_/models/retinanet_r50_fpn.py'

custom_imports = dict(imports=['mala_mm'], allow_failed_imports=False)

# ImageNet-1K weights of the released classification model (see the leaf configs)
pretrained = 'checkpoints/mala_s_in1k.pth'

model = dict(
    backbone=dict(
        _delete_=True,
        type='MALA',
        arch='small',
        drop_path_rate=0.15,
        out_indices=(0, 1, 2, 3),
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        # the release's norm_eval skipped SyncBN layers, so they were trained: keep them in train mode
        norm_eval=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    # FPN from stage 2 with the extra levels convolved from the last backbone output, as released
    neck=dict(in_channels=[64, 128, 320, 512], start_level=1, add_extra_convs='on_input'))

# stage 1's output norm feeds no FPN level (start_level=1), so DDP must tolerate its unused parameters
find_unused_parameters = True
