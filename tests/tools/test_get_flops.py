"""tools/get_flops.py: its command line, and a count (mala_tools.analysis.flops) that includes the attention matmuls
as the paper's does."""
import os.path as osp
import re

import pytest
import torch
from torch import nn

from mala_mm import MALA
from mala_tools.analysis.flops import attention_macs, count_macs, count_model_macs
from mala_tools.model import build_model
from tests.helpers import ROOT, call_tool, load_config


def run_get_flops(*args):
    return call_tool(['get_flops.py', *map(str, args)], ROOT)


def test_cli_prints_params_and_flops():
    config = 'configs/detection/mask_rcnn_mala_t.py'
    result = run_get_flops(config, '--shape', 128, 128)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert 'input shape: 1x3x128x128' in out
    params = int(re.search(r'^params: (\d+) ', out, re.M).group(1))
    flops = float(re.search(r'^FLOPs: ([\d.]+) G', out, re.M).group(1))
    attention = float(re.search(r'attention matmuls \(bmm, SDPA\): ([\d.]+) G', out).group(1))
    model = build_model(load_config(osp.join(ROOT, config)))
    assert params == sum(p.numel() for p in model.parameters())
    assert flops > 0 and 0 < attention < flops
    # a two-stage detector says on how many RoIs its heads were counted
    assert re.search(r'roi_head\.bbox_roi_extractor on \d+ RoIs', out)


def test_model_count_names_the_roi_heads_and_leaves_no_hooks_behind():
    model = build_model(load_config(osp.join(ROOT, 'configs/detection/mask_rcnn_mala_t_builtin.py')))
    count = count_model_macs(model, 'mmdet', 64, 96)
    assert [name for name, _ in count.roi_counts] == ['roi_head.bbox_roi_extractor', 'roi_head.mask_roi_extractor']
    assert all(num_rois > 0 for _, num_rois in count.roi_counts)
    assert 0 < count.attention < count.total
    assert not any(module._forward_hooks for module in model.modules())


def test_cli_rejects_a_missing_config():
    result = run_get_flops('configs/detection/no_such_config.py')
    assert result.returncode == 2
    assert "error: config file 'configs/detection/no_such_config.py' does not exist" in result.stderr
    assert 'Traceback' not in result.stderr


def test_cli_rejects_a_config_of_another_library(tmp_path):
    config = tmp_path / 'classifier.py'
    config.write_text("default_scope = 'mmpretrain'\nmodel = dict(type='ImageClassifier')\n")
    result = run_get_flops(config)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {config}: default_scope is 'mmpretrain'; these tools run configs whose default_scope is one of "
        "('mmdet', 'mmseg') (inherit mmdet::/mmseg::_base_/default_runtime.py)")


@pytest.mark.parametrize('attn_type', ['mala', 'softmax'])
def test_count_is_convolutions_plus_attention_matmuls(attn_type):
    # one stage with 2 heads of width d = 8 on an 8 x 8 map (N = 64 tokens) from a 32 x 32 image
    backbone = MALA(arch=dict(embed_dims=[16], depths=[1], num_heads=[2]), attn_types=attn_type,
                    out_indices=(0, )).eval()
    heads, n, d = 2, 64, 8
    if attn_type == 'mala':
        # z_i = q_i . mean_j k_j (N d), KV = k^T v (N d^2), q KV (N d^2)
        attention = heads * (n * d + 2 * n * d * d)
    else:
        # q k^T (N^2 d) and softmax(.) v (N^2 d)
        attention = heads * 2 * n * n * d

    conv_macs = []
    for m in backbone.modules():
        if isinstance(m, nn.Conv2d):  # QKVOProjection returns its output as four maps
            m.register_forward_hook(lambda m, args, out: conv_macs.append(
                sum(o.numel() for o in (out if isinstance(out, tuple) else (out, )))
                * m.in_channels // m.groups * m.kernel_size[0] * m.kernel_size[1]))
    macs = count_macs(lambda: backbone(torch.randn(1, 3, 32, 32)))

    assert attention_macs(macs) == attention
    assert sum(macs.values()) == sum(conv_macs) + attention


# paper: ImageNet-1K FLOPs at 224 x 224 of the classification models
@pytest.mark.parametrize('arch, head_channels, paper_gflops', [
    ('tiny', 2048, 2.5), ('small', 2048, 4.6),
    pytest.param('base', 2048, 9.9, marks=pytest.mark.slow), pytest.param('large', 2560, 16.1, marks=pytest.mark.slow)])
def test_classification_flops_match_the_paper(arch, head_channels, paper_gflops):
    backbone = MALA(arch).eval()
    macs = count_macs(lambda: backbone(torch.randn(1, 3, 224, 224)))
    # the classification head: conv1x1 C_4 -> head_channels on the 7 x 7 map, then a 1000-way classifier
    head = backbone.embed_dims[-1] * head_channels * 7 * 7 + head_channels * 1000
    total = sum(macs.values()) + head
    assert round(total / 2**30, 1) == paper_gflops
    # the paper's numbers need the attention matmuls
    assert round((total - attention_macs(macs)) / 2**30, 1) < paper_gflops
