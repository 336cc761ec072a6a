# Which parameters the release's recipes exempt from weight decay, per method, as its paramwise_cfgs say. mmengine,
# like mmcv 1.x, matches a custom key as a substring of a parameter's full name ('backbone.layers.0.norm.weight').
# A method base picks one: optim_wrapper = dict(paramwise_cfg=_base_.<rule>).

# Mask R-CNN (1x and 3x) and UperNet: parameters whose name holds 'norm' (the blocks' and output LayerNorms, the
# downsamples' BatchNorms). The stem's BatchNorms (patch_embed.proj.1, .3, ...) and every head parameter without
# 'norm' in its name (UperNet's ConvModule BatchNorms are named 'bn') are decayed. The release's two other keys,
# absolute_pos_embed and relative_position_bias_table, name no parameter of MALA or of these heads.
no_decay_if_named_norm = dict(custom_keys={'norm': dict(decay_mult=0.)})

# Cascade Mask R-CNN: those, and every norm layer (BN, SyncBN, GN, LN) whatever its name. Its rpe_table key,
# like the two above, names no parameter.
no_decay_if_named_norm_or_norm_layer = dict(custom_keys={'norm': dict(decay_mult=0.)}, norm_decay_mult=0.)

# RetinaNet and Semantic FPN had no paramwise_cfg: every parameter is decayed (the wrapper's default).
