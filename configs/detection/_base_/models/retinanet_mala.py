_base_ = ['mmdet::_base_/models/retinanet_r50_fpn.py', '../../../_base_/mala_s_backbone.py']

model = dict(
    backbone={{_base_.mala_s_backbone}},
    # FPN from stage 2 with the extra levels convolved from the last backbone output, as released
    neck=dict(in_channels=[64, 128, 320, 512], start_level=1, add_extra_convs='on_input'))

# stage 1's output norm feeds no FPN level (start_level=1), so DDP must tolerate its unused parameters
find_unused_parameters = True
