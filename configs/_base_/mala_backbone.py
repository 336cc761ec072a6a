# What every paper config's MALA backbone shares; a leaf config adds its variant from ./mala_{t,s,b,l}.py.
mala_backbone = dict(
    _delete_=True,  # replaces the ResNet of the mmdet/mmseg model config it goes into
    type='MALA',
    out_indices=(0, 1, 2, 3),
    norm_cfg=dict(type='SyncBN', requires_grad=True),
    # the release's norm_eval skipped SyncBN layers, so they were trained: keep them in train mode
    norm_eval=False)
