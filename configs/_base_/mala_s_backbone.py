# The MALA-S backbone of every paper config, detection and segmentation; a variant's leaf config sets arch,
# drop_path_rate, its checkpoint and the widths of the neck or head.
custom_imports = dict(imports=['mala_mm'], allow_failed_imports=False)

# ImageNet-1K weights of the released classification model (see the leaf configs)
pretrained = 'checkpoints/mala_s_in1k.pth'

mala_s_backbone = dict(
    _delete_=True,  # replaces the ResNet of the mmdet/mmseg model config it goes into
    type='MALA',
    arch='small',
    drop_path_rate=0.15,
    out_indices=(0, 1, 2, 3),
    norm_cfg=dict(type='SyncBN', requires_grad=True),
    # the release's norm_eval skipped SyncBN layers, so they were trained: keep them in train mode
    norm_eval=False,
    init_cfg=dict(type='Pretrained', checkpoint=pretrained))
