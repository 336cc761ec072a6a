"""The MALA backbone: fidelity to the release, variants, registries, shapes, gradients and freezing."""
import ast
import copy
import math
import os
import subprocess
import sys

import pytest
import torch
from torch.nn.modules.batchnorm import _BatchNorm

from mala_mm import MALA
from mala_mm.checkpoint import load_backbone_weights
from mala_mm.models import MALAConfigError
from tests.helpers import DATA_DIR, feature_loss
from tests.helpers.low_precision import IMPLS, TRITON_DEVICE

VARIANT_PARAMS = {'tiny': 13_347_328, 'small': 24_040_896, 'base': 46_691_296, 'large': 93_561_760}


@pytest.mark.parametrize('impl', IMPLS)
def test_matches_release_outputs(impl):
    io = torch.load(os.path.join(DATA_DIR, 'official_det_io.pth'), weights_only=True)
    model = MALA(arch=io['arch'], impl=impl)
    load_backbone_weights(model, os.path.join(DATA_DIR, 'official_det_ckpt.pth'))
    device = TRITON_DEVICE if impl == 'triton' else torch.device('cpu')
    model.eval().to(device)
    # cuDNN's convolutions round fp32 to TF32 unless told not to; the bound is fp32's
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        outputs = model(io['input'].to(device))
    assert len(outputs) == len(io['outputs']) == 4
    for ours, release in zip(outputs, io['outputs']):
        assert ours.shape == release.shape
        assert (ours.cpu() - release).abs().max().item() < 1e-4


@pytest.mark.parametrize('arch', list(VARIANT_PARAMS))
def test_variant_parameter_counts(arch):
    model = MALA(arch=arch)
    assert sum(p.numel() for p in model.parameters()) == VARIANT_PARAMS[arch]
    assert MALA(arch=arch[0]).embed_dims == model.embed_dims


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
@pytest.mark.parametrize('arch', list(VARIANT_PARAMS))
def test_builds_through_registries(scope, arch):
    registry = __import__(f'{scope}.registry', fromlist=['MODELS']).MODELS
    model = registry.build(dict(type='MALA', arch=arch, out_indices=(1, 2, 3)))
    assert isinstance(model, MALA)
    # without stage 1's output norm: its weight and bias, one value per channel each
    first_width = MALA.arch_zoo[arch]['embed_dims'][0]
    assert sum(p.numel() for p in model.parameters()) == VARIANT_PARAMS[arch] - 2 * first_width


def test_config_with_custom_imports_builds_in_both_libraries(tmp_path):
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    for scope in ('mmdet', 'mmseg'):
        cfg_file = tmp_path / f'{scope}.py'
        cfg_file.write_text("custom_imports = dict(imports=['mala_mm'], allow_failed_imports=False)\n"
                            f"default_scope = '{scope}'\n"
                            "backbone = dict(type='MALA', arch='small', attn_types='mala')\n")
        cfg = Config.fromfile(str(cfg_file))
        init_default_scope(scope)
        registry = __import__(f'{scope}.registry', fromlist=['MODELS']).MODELS
        model = registry.build(cfg.backbone)
        assert model.attn_types == ['mala'] * 4


def test_importing_the_package_loads_the_model_and_its_weight_loading_only():
    """``import mala_mm`` is what a config with the backbone imports: MALA, registered in mmengine's root registry
    where mmdet's and mmseg's find it, the operators it runs, the loading of weights and the version. Not the
    training hooks, the datasets' parts, the command-line parts or export, nor mmdet's and mmseg's model packages
    (every detector, segmentor and head), which they import when they build."""
    code = ('import sys, mala_mm\n'
            "print(sorted(m for m in sys.modules if m.startswith(('mala_mm', 'mmdet.models', 'mmseg.models'))))\n"
            'from mmengine.registry import MODELS as root, init_default_scope\n'
            'from mmdet.registry import MODELS as det\n'
            'from mmseg.registry import MODELS as seg\n'
            "print(root.module_dict['MALA'] is det.get('MALA') is seg.get('MALA') is mala_mm.MALA)")
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    modules, registered = result.stdout.strip().splitlines()[-2:]
    modules = ast.literal_eval(modules)
    assert registered == 'True'
    assert 'mala_mm.models.backbones.mala' in modules
    beyond_the_model = [m for m in modules if not m.startswith(('mala_mm.models', 'mala_mm.ops', 'mala_mm.checkpoint'))
                        and m not in ('mala_mm', 'mala_mm.version')]
    assert beyond_the_model == [] and not any(m.startswith(('mmdet.models', 'mmseg.models')) for m in modules)


@pytest.mark.parametrize('size', [(37, 53), (1, 1), (64, 33), (129, 200)])
def test_any_input_size(small_arch, size):
    model = MALA(arch=small_arch).eval()
    with torch.no_grad():
        outputs = model(torch.randn(1, 3, *size))
    for stride, channels, out in zip((4, 8, 16, 32), small_arch['embed_dims'], outputs):
        expected = [1, channels] + [math.ceil(s / stride) for s in size]
        assert list(out.shape) == expected and torch.isfinite(out).all()


def test_outputs_are_contiguous_nchw_for_compiled_roi_ops(small_arch):
    """mmcv's RoIAlign reads its input as contiguous NCHW memory whatever the strides; channels-last outputs
    (what LayerNorm2d's permutes leave) reached it through the FPN and gave Mask R-CNN's RoI heads scrambled
    features. The RoI features of the detector's FPN outputs must equal those of their contiguous copies."""
    from mmcv.ops import roi_align
    from mmdet.models.necks import FPN
    model = MALA(arch=small_arch).train()
    outputs = model(torch.randn(2, 3, 64, 96))
    assert all(out.is_contiguous() for out in outputs)
    neck = FPN(in_channels=small_arch['embed_dims'], out_channels=16, num_outs=4)
    rois = torch.tensor([[0, 3., 5., 40., 30.], [1, 10., 2., 60., 50.]])
    for level, (stride, feature) in enumerate(zip((4, 8, 16, 32), neck(outputs))):
        pooled = roi_align(feature, rois, (7, 7), 1 / stride, 2, 'avg', True)
        assert torch.equal(pooled, roi_align(feature.contiguous(), rois, (7, 7), 1 / stride, 2, 'avg', True)), level


def test_all_mala_is_one_argument_away(small_arch):
    model = MALA(arch=small_arch, attn_types='mala')
    kinds = {type(block.attn).__name__ for stage in model.layers for block in stage.blocks}
    assert kinds == {'MALAttention'}
    released = MALA(arch=small_arch)
    assert [type(stage.blocks[0].attn).__name__ for stage in released.layers] == \
        ['MALAttention', 'MALAttention', 'SoftmaxAttention', 'SoftmaxAttention']


@pytest.mark.parametrize('arch', ['large', None])
def test_gradients_flow_and_are_finite(small_arch, arch):
    # `large` starts every layer scale at 1e-6: gradients must still reach every parameter. Drop path skips a
    # block for one image at a time; with 4 images a block is skipped for all of them with chance 1e-4 at most.
    model = MALA(arch=arch or small_arch, drop_path_rate=0.1)
    model.init_weights()
    model.train()
    outputs = model(torch.randn(4, 3, 64, 64))
    feature_loss(outputs).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all() and (param.grad != 0).any(), name


def test_every_gradient_arrives_in_its_parameters_layout(small_arch):
    """The gradient autograd hands each parameter (before accumulating it) has the parameter's own strides, so
    neither autograd nor DDP copies it into another layout; DDP compares the strides exactly and warns ("Grad
    strides do not match bucket view strides") at the first that differ."""
    model = MALA(arch=small_arch)
    model.init_weights()
    arrived = {}
    for name, param in model.named_parameters():
        param.register_hook(lambda grad, name=name: arrived.__setitem__(name, grad.stride()))
    model.train()
    feature_loss(model(torch.randn(2, 3, 48, 40))).backward()
    params = dict(model.named_parameters())
    assert arrived.keys() == params.keys()
    assert [(name, params[name].stride(), strides) for name, strides in arrived.items()
            if strides != params[name].stride()] == []


def test_the_weights_layout_changes_no_number(small_arch):
    """The same weights stored contiguously give the same outputs and gradients: the layout is storage only."""
    model = MALA(arch=small_arch, drop_path_rate=0.)
    model.init_weights()
    contiguous = copy.deepcopy(model)
    for module in contiguous.modules():
        if isinstance(module, torch.nn.Conv2d):
            module.weight = torch.nn.Parameter(module.weight.detach().contiguous())
    assert any(a.stride() != b.stride() for a, b in zip(model.parameters(), contiguous.parameters()))
    x = torch.randn(2, 3, 48, 40)
    for m in (model, contiguous):
        m.train()
        feature_loss(m(x)).backward()
    for (name, a), b in zip(model.named_parameters(), contiguous.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7, msg=name)
    model.eval(), contiguous.eval()
    for a, b in zip(model(x), contiguous(x)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_activation_checkpointing_changes_nothing(small_arch):
    plain = MALA(arch=small_arch, drop_path_rate=0.)
    plain.init_weights()
    checkpointed = MALA(arch=small_arch, drop_path_rate=0., with_cp=True)
    checkpointed.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 48, 40)
    grads = []
    for model in (plain, checkpointed):
        model.train()
        feature_loss(model(x)).backward()  # the sum of the outputs would reach nothing past the output norms
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def _train_one_step(model, x):
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.1)
    model.train()
    feature_loss(model(x)).backward()
    optimizer.step()


def test_frozen_stages_really_freeze(small_arch):
    model = MALA(arch=small_arch, frozen_stages=2)
    model.init_weights()
    before = copy.deepcopy(model.state_dict())
    _train_one_step(model, torch.randn(2, 3, 64, 64))
    after = model.state_dict()
    frozen = ('patch_embed.', 'layers.0.', 'layers.1.', 'extra_norms.0.', 'extra_norms.1.')
    for key in before:
        if key.startswith(frozen):
            assert torch.equal(before[key], after[key]), f'{key} changed although frozen'
        elif key.startswith('layers.2.') and key.endswith(('qkvo.weight', 'fc1.weight')):
            assert not torch.equal(before[key], after[key]), f'{key} did not train'
    assert not any(m.training for m in model.layers[1].modules())
    assert model.layers[2].training


@pytest.mark.parametrize('norm_type', ['BN', 'SyncBN'])
def test_norm_eval_freezes_every_batchnorm(small_arch, norm_type):
    model = MALA(arch=small_arch, norm_eval=True, norm_cfg=dict(type=norm_type, requires_grad=True))
    model.init_weights()
    norms = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    assert len(norms) == 4 + 3  # stem and downsamples
    before = [m.running_mean.clone() for m in norms]
    _train_one_step(model, torch.randn(2, 3, 64, 64))
    assert not any(m.training for m in norms)
    assert all(torch.equal(b, m.running_mean) for b, m in zip(before, norms))


def test_syncbn_trains_in_one_cpu_process(small_arch):
    model = MALA(arch=small_arch, norm_cfg=dict(type='SyncBN', requires_grad=True))
    model.init_weights()
    assert any(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules())
    norm = model.patch_embed.proj[1]
    before = norm.running_mean.clone()
    _train_one_step(model, torch.randn(2, 3, 64, 64))
    assert not torch.equal(before, norm.running_mean)


@pytest.mark.parametrize('kwargs,error,message', [
    (dict(arch='huge'), ValueError, 'unknown arch'),
    (dict(arch=dict(embed_dims=[64, 96, 128, 256], depths=[1] * 4, num_heads=[1, 2, 3, 4])), ValueError,
     'stage 2, 3 heads do not divide 128'),
    (dict(arch=dict(embed_dims=[24, 48, 96, 192], depths=[1] * 4, num_heads=[4, 4, 4, 4])), ValueError,
     'stage 0, the head width 6'),
    (dict(arch=dict(embed_dims=[64, 128], depths=[2], num_heads=[1, 2])), ValueError, 'one entry per stage'),
    (dict(arch=dict(embed_dims=[64], depth=[2], num_heads=[1])), ValueError, 'custom arch needs'),
    (dict(attn_types=('mala', 'flash', 'softmax', 'softmax')), ValueError, 'attn_types'),
    (dict(out_indices=(4,)), ValueError, 'out_indices'),
    (dict(frozen_stages=7), ValueError, 'frozen_stages'),
])
def test_bad_arguments_are_explained(kwargs, error, message):
    with pytest.raises(error, match=message):
        MALA(**kwargs)


def test_wrong_input_is_explained(small_arch):
    model = MALA(arch=small_arch)
    with pytest.raises(ValueError, match=r'expects a \(B, 3, H, W\) batch'):
        model(torch.randn(1, 1, 32, 32))
    with pytest.raises(ValueError, match='empty'):
        model(torch.randn(1, 3, 0, 32))


def test_pretrained_stands_for_a_pretrained_init_cfg_as_in_swin():
    with pytest.warns(UserWarning, match='DeprecationWarning: pretrained is deprecated, please use "init_cfg"'):
        model = MALA(arch='tiny', pretrained='checkpoints/mala_t_in1k.pth')
    assert model.init_cfg == dict(type='Pretrained', checkpoint='checkpoints/mala_t_in1k.pth')
    with pytest.raises(MALAConfigError, match=r"pretrained='a.pth' and init_cfg=\{.*'b.pth'\} are given together"):
        MALA(arch='tiny', pretrained='a.pth', init_cfg=dict(type='Pretrained', checkpoint='b.pth'))
    with pytest.raises(MALAConfigError, match='pretrained must be a path or URL'):
        MALA(arch='tiny', pretrained=True)


def test_a_config_over_mmsegs_own_upernet_base_loads_model_pretrained_and_trains(tmp_path):
    """mmseg's model bases set ``model.pretrained`` (a ResNet's URL), which its EncoderDecoder hands to the
    backbone: a user's config over one names MALA's weights there, without ``pretrained=None``, and trains."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmengine.structures import PixelData
    from mmseg.registry import MODELS

    from mala_mm.sample_inputs import data_samples
    checkpoint = os.path.join(DATA_DIR, 'official_det_ckpt.pth')
    arch = torch.load(os.path.join(DATA_DIR, 'official_det_io.pth'), weights_only=True)['arch']
    config = tmp_path / 'upernet_mala_over_mmseg_base.py'
    config.write_text(
        "_base_ = ['mmseg::_base_/models/upernet_r50.py']\n"
        "custom_imports = dict(imports=['mala_mm'], allow_failed_imports=False)\n"
        "norm_cfg = dict(type='BN', requires_grad=True)  # one process\n"
        f"model = dict(pretrained={checkpoint!r}, data_preprocessor=dict(size=(64, 64)),\n"
        f"             backbone=dict(_delete_=True, type='MALA', arch={arch!r}),\n"
        "             decode_head=dict(in_channels=[32, 64, 96, 128], channels=32, num_classes=3, norm_cfg=norm_cfg),\n"
        "             auxiliary_head=dict(in_channels=96, channels=16, num_classes=3, norm_cfg=norm_cfg))\n")
    cfg = Config.fromfile(str(config))
    init_default_scope('mmseg')
    with pytest.warns(UserWarning, match='pretrained is deprecated'):
        model = MODELS.build(cfg.model)
    model.init_weights()
    released = torch.load(checkpoint, weights_only=True)['state_dict']['backbone.layers.1.blocks.0.attn.qkvo.weight']
    assert torch.equal(model.backbone.layers[1].blocks[0].attn.qkvo.weight, released)

    samples = data_samples('mmseg', 64, 64, 2)
    for sample in samples:
        sample.gt_sem_seg = PixelData(data=torch.randint(0, 3, (1, 64, 64)))
    batch = dict(inputs=[torch.rand(3, 64, 64) * 255 for _ in samples], data_samples=samples)
    model.train()
    loss, _ = model.parse_losses(model(**model.data_preprocessor(batch, True), mode='loss'))
    loss.backward()
    assert torch.isfinite(loss) and model.backbone.layers[1].blocks[0].attn.qkvo.weight.grad is not None


@pytest.mark.parametrize('init_cfg', [dict(type='Normal', layer='Conv2d', std=0.01), dict(type='Pretrained'),
                                      [dict(type='Pretrained', checkpoint='a.pth')]])
def test_an_init_cfg_it_does_not_apply_is_refused(init_cfg):
    with pytest.raises(MALAConfigError, match=r"MALA: init_cfg must be None .* or dict\(type='Pretrained'"):
        MALA(arch='tiny', init_cfg=init_cfg)
