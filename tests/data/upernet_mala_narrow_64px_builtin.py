# The built-in UperNet with a narrow MALA at 64 x 64 pixels, for long runs under bf16 autocast. The backbone keeps
# every structural feature of the released archs (four stages, both attention kinds, RoPE, LePE, layer scale).
# Where bf16 is emulated (CPUs without bf16 units) a bf16 convolution costs many times its fp32 time, growing with
# channels and pixels, hence the narrow widths and small images. The heads keep their width: at 32 channels they
# learn too slowly for a 300-step check.
_base_ = ['../../configs/segmentation/upernet_mala_t_builtin.py']

widths = [32, 64, 96, 128]
size = (64, 64)
model = dict(
    data_preprocessor=dict(size=size),
    backbone=dict(arch=dict(_delete_=True, embed_dims=widths, depths=[1, 1, 2, 1], num_heads=[1, 2, 3, 4])),
    decode_head=dict(in_channels=widths),
    auxiliary_head=dict(in_channels=widths[2]))

# the built-in pipelines with every image size (resize scale, crop size) at 64 x 64
train_pipeline = [dict(t, **{key: size for key in ('scale', 'crop_size') if key in t}) for t in _base_.train_pipeline]
test_pipeline = [dict(t, **{key: size for key in ('scale', 'crop_size') if key in t}) for t in _base_.test_pipeline]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
