# RetinaNet with a MALA backbone; the leaf config names the variant and the neck's input widths (stages 2-4).
_base_ = ['mmdet::_base_/models/retinanet_r50_fpn.py', '../../../_base_/mala_backbone.py']

model = dict(
    # the release's FPN starts at stage 2 (start_level=1 over four outputs); leaving stage 1 out of the
    # backbone's outputs gives the same network with no unused parameters, as mmdet's Swin RetinaNet does
    backbone=dict(_base_.mala_backbone, out_indices=(1, 2, 3)),
    # extra levels convolved from the last backbone output, as released
    neck=dict(start_level=0, add_extra_convs='on_input'))
