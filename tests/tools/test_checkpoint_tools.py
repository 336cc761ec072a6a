"""tools/convert_checkpoint.py and tools/verify_checkpoint.py on release-format checkpoints."""
import argparse
import os
from pathlib import Path

import pytest
import torch

from mala_mm import MALA
from mala_mm.checkpoint import load_backbone_weights
from tests.helpers import DATA_DIR, ROOT, call_tool

REPO = Path(ROOT)
DET_CKPT = os.path.join(DATA_DIR, 'official_det_ckpt.pth')
DET_IO = os.path.join(DATA_DIR, 'official_det_io.pth')


def checkpoint_tool(name, *args):
    return call_tool([name, *map(str, args)], REPO)


def outputs(model, images):
    with torch.no_grad():
        return model.eval()(images)


@pytest.fixture(scope='module')
def release_io():
    return torch.load(DET_IO, weights_only=True)


@pytest.fixture
def classification_ckpt(tmp_path, small_arch):
    """A checkpoint as the release's ImageNet trainer writes it, its EMA weights differing from the model's."""
    def backbone_weights():
        model = MALA(arch=small_arch)
        model.init_weights()
        return {k: v for k, v in model.state_dict().items() if not k.startswith('extra_norms.')}

    head = {'proj.weight': torch.randn(128, 64, 1, 1), 'norm.weight': torch.ones(128),
            'head.weight': torch.randn(1000, 128), 'head.bias': torch.zeros(1000)}
    path = tmp_path / 'mala_in1k.pth'
    torch.save({'model': {**backbone_weights(), **head}, 'model_ema': {**backbone_weights(), **head},
                'optimizer': {'state': {}, 'param_groups': []}, 'epoch': 299,
                'args': argparse.Namespace(model='MALA_T', lr=1e-3)}, path)
    return path


def test_dense_checkpoint_converts_to_a_plain_state_dict_giving_the_same_outputs(tmp_path, release_io):
    converted = tmp_path / 'backbone.pth'
    result = checkpoint_tool('convert_checkpoint.py', DET_CKPT, converted)
    assert result.returncode == 0, result.stderr
    assert 'kept: 181 tensors' in result.stdout
    assert "renamed: 181 keys 'backbone.*' -> '*'" in result.stdout
    assert 'dropped tensors: 1: neck.* (1)' in result.stdout
    assert 'dropped entries: meta' in result.stdout

    state = torch.load(converted, weights_only=True)  # no allow-list needed
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    model = MALA(arch=release_io['arch'])
    missing, unexpected = model.load_state_dict(state, strict=True)
    assert not missing and not unexpected

    original = MALA(arch=release_io['arch'])
    load_backbone_weights(original, DET_CKPT)
    images = release_io['input']
    for ours, theirs, released in zip(outputs(model, images), outputs(original, images), release_io['outputs']):
        assert torch.equal(ours, theirs)
        assert (ours - released).abs().max() < 1e-4


@pytest.mark.parametrize('ema', [False, True])
def test_classification_checkpoint_converts_without_its_head(tmp_path, small_arch, classification_ckpt, ema):
    converted = tmp_path / 'backbone.pth'
    result = checkpoint_tool('convert_checkpoint.py', classification_ckpt, converted, *['--ema'] * ema)
    assert result.returncode == 0, result.stderr
    assert 'dropped tensors: 4: head.* (2), norm.* (1), proj.* (1)' in result.stdout
    assert 'renamed' not in result.stdout

    state = torch.load(converted, weights_only=True)
    source = torch.load(classification_ckpt, weights_only=False)['model_ema' if ema else 'model']
    assert state.keys() == {k for k in source if not k.startswith(('proj.', 'norm.', 'head.'))}
    assert all(torch.equal(state[k], source[k]) for k in state)
    missing, unexpected = MALA(arch=small_arch).load_state_dict(state, strict=False)
    assert not unexpected and missing and all(k.startswith('extra_norms.') for k in missing)


def test_converter_explains_what_it_cannot_convert(tmp_path):
    truncated = tmp_path / 'truncated.pth'
    data = Path(DET_CKPT).read_bytes()
    truncated.write_bytes(data[:len(data) // 2])
    result = checkpoint_tool('convert_checkpoint.py', truncated, tmp_path / 'out.pth')
    assert result.returncode != 0
    assert 'cannot read checkpoint' in result.stderr and 'Traceback' not in result.stderr

    result = checkpoint_tool('convert_checkpoint.py', DET_CKPT, tmp_path / 'out.pth', '--ema')
    assert result.returncode != 0
    assert 'no `model_ema` state dict' in result.stderr and 'Traceback' not in result.stderr
    assert not (tmp_path / 'out.pth').exists()


@pytest.fixture
def release_arch_config(tmp_path, release_io):
    config = tmp_path / 'release_arch.py'
    config.write_text(f"model = dict(backbone=dict(type='MALA', arch={release_io['arch']!r}, "
                      f"init_cfg=dict(type='Pretrained', checkpoint='unused.pth')))\n")
    return config


def test_verify_accepts_the_checkpoint_of_its_arch(release_arch_config):
    result = checkpoint_tool('verify_checkpoint.py', DET_CKPT, '--config', release_arch_config)
    assert result.returncode == 0, result.stderr
    assert ': fits (181 keys matched)' in result.stdout


def test_verify_rejects_another_arch_naming_the_shapes():
    result = checkpoint_tool('verify_checkpoint.py', DET_CKPT, '--arch', 'tiny')
    assert result.returncode == 2
    assert 'tiny: does not fit' in result.stdout
    assert 'patch_embed.proj.0.weight: checkpoint (16, 3, 3, 3), model (32, 3, 3, 3)' in result.stdout
    assert 'fits none of the variants tried' in result.stderr


@pytest.mark.parametrize('backbone, message', [
    ("dict(type='ResNet', depth=18)", "error: the backbone of {config} is 'ResNet', not MALA"),
    ("dict(type='MALA', arch='huge')", "error: MALA: unknown arch 'huge'; choose one of"),
    ("dict(type='MALA', arch='tiny', out_indice=(3, ))", "error: MALA.__init__() got an unexpected keyword argument "
     "'out_indice'"),
], ids=['not MALA', 'unknown arch', 'unknown argument'])
def test_verify_explains_a_config_backbone_it_cannot_build(tmp_path, backbone, message):
    config = tmp_path / 'backbone.py'
    config.write_text(f'model = dict(backbone={backbone})\n')
    result = checkpoint_tool('verify_checkpoint.py', DET_CKPT, '--config', config)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith('error: ')]
    # Python 3.10 and newer name the class in a TypeError of __init__'s arguments
    assert len(errors) == 1 and errors[0].replace(' __init__()', ' MALA.__init__()').startswith(
        message.format(config=config))
    assert 'Traceback' not in result.stderr


def test_verify_reports_missing_blocks(tmp_path, release_arch_config):
    state = torch.load(DET_CKPT, weights_only=False)['state_dict']
    truncated = {k: v for k, v in state.items() if not k.startswith('backbone.layers.1.blocks.1.')}
    path = tmp_path / 'truncated.pth'
    torch.save(truncated, path)
    result = checkpoint_tool('verify_checkpoint.py', path, '--config', release_arch_config)
    assert result.returncode == 2
    assert 'does not fit' in result.stdout
    assert 'missing from the checkpoint' in result.stdout and 'layers.1.blocks.1.' in result.stdout


def test_verify_accepts_an_imagenet_checkpoint_missing_only_the_output_norms(tmp_path):
    weights = {k: v for k, v in MALA(arch='tiny').state_dict().items() if not k.startswith('extra_norms.')}
    path = tmp_path / 'mala_t_in1k.pth'
    torch.save({'model': {**weights, 'head.weight': torch.zeros(1000, 2048)}}, path)
    result = checkpoint_tool('verify_checkpoint.py', path)
    assert result.returncode == 0, result.stderr
    assert 'tiny: fits' in result.stdout and 'small: does not fit' in result.stdout
    assert 'missing from the checkpoint (8): extra_norms.0.norm.weight' in result.stdout
    assert 'start at their initialisation' in result.stdout
    assert result.stdout.strip().endswith('fits: tiny')
