_base_ = 'mmseg::_base_/models/upernet_r50.py'

custom_imports = dict(imports=['mala_mm'], allow_failed_imports=False)

# ImageNet-1K weights of the released classification model (see the leaf configs)
pretrained = 'checkpoints/mala_s_in1k.pth'

model = dict(
    data_preprocessor=dict(size=(512, 512)),  # pad to the training crop
    pretrained=None,
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
    decode_head=dict(in_channels=[64, 128, 320, 512], channels=512, num_classes=150),
    # auxiliary FCN head on stage 3
    auxiliary_head=dict(
        in_channels=320, in_index=2, num_classes=150,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=0.4)))
