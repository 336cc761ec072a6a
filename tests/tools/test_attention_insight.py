"""tools/analysis/attention_insight.py: its score maps (mala_tools.analysis.attention_scores) are the attention
modules' own, and it writes its PNGs."""
import cv2
import numpy as np
import pytest
import torch

from mala_mm import MALA
from mala_tools.analysis import attention_scores as insight
from tests.helpers import ROOT, call_tool


@pytest.fixture
def backbone(small_arch):
    model = MALA(arch=small_arch)
    model.init_weights()
    with torch.no_grad():  # sharper than the initialisation, so that scores differ visibly between tokens
        for block in (model.layers[0].blocks[0], model.layers[2].blocks[1]):
            block.attn.qkvo.weight.mul_(20)
    return model.eval()


def merge_heads(y, like):
    return y.transpose(-2, -1).reshape(like.shape)


@pytest.mark.parametrize('stage, block', [(0, 0), (2, 1)])  # a MALA block and a softmax block
def test_drawn_scores_are_what_the_attention_module_computes(backbone, stage, block):
    images = torch.randn(1, 3, 64, 96)
    attention = insight.capture_block(backbone, images, stage, block)
    module = backbone.layers[stage].blocks[block].attn

    for kind, attend in insight.KINDS.items():
        scores = insight.score_matrix(kind, attention.q, attention.k, attention.rope)
        assert scores.shape[-2:] == (attention.height * attention.width, ) * 2
        # the scores, applied to the block's real values, give that kind of attention's result
        torch.testing.assert_close(scores @ attention.v, attend(attention.q, attention.k, attention.v,
                                                                attention.rope), rtol=1e-4, atol=1e-5)

    # and for the block's own kind they rebuild the module's output: proj((Y + LePE(v)) * o)
    own_kind = {'mala': 'MALA', 'softmax': 'softmax'}[backbone.attn_types[stage]]
    scores = insight.score_matrix(own_kind, attention.q, attention.k, attention.rope)
    _, _, v, o = attention.qkvo
    y = merge_heads(scores @ attention.v, v)
    with torch.no_grad():
        rebuilt = module.proj(module.lepe(v, y, o))
    torch.testing.assert_close(rebuilt, attention.output, rtol=1e-4, atol=1e-5)


def test_score_rows_sum_to_one_without_rope_and_vary(backbone):
    attention = insight.capture_block(backbone, torch.randn(1, 3, 64, 64), 0, 0)
    rows = {kind: insight.score_matrix(kind, attention.q, attention.k, None)[0, 0] for kind in insight.KINDS}
    for kind, scores in rows.items():
        torch.testing.assert_close(scores.sum(-1), torch.ones(scores.shape[0]), rtol=1e-4, atol=1e-4)
        assert scores.std() > 1e-3 / scores.shape[-1], kind


def test_magnitude_sharpens_mala_and_softmax_but_not_linear_attention(backbone):
    attention = insight.capture_block(backbone, torch.randn(1, 3, 64, 64), 0, 0)
    factors = [0.25, 1.0, 4.0]
    curves = insight.magnitude_curves(attention, 0, factors)
    for kind in ('MALA', 'softmax'):
        assert curves[kind]['max'][0] < curves[kind]['max'][1] < curves[kind]['max'][2], kind
        assert curves[kind]['entropy'][0] > curves[kind]['entropy'][2], kind
    assert np.allclose(curves['linear']['max'], curves['linear']['max'][0], rtol=1e-4)
    assert np.allclose(curves['linear']['entropy'], curves['linear']['entropy'][0], rtol=1e-4)


def test_scaled_query_has_the_scaled_feature():
    q = torch.randn(2, 1, 10, 8, dtype=torch.float64) * 3
    phi = torch.nn.functional.elu(q) + 1
    for factor in (0.1, 1.0, 7.0):
        scaled = insight.scale_query('MALA', q, factor)
        torch.testing.assert_close(torch.nn.functional.elu(scaled) + 1, factor * phi)
        torch.testing.assert_close(insight.scale_query('softmax', q, factor), factor * q)


def run_insight(*args):
    return call_tool(['analysis/attention_insight.py', *map(str, args)], ROOT)


def test_cli_writes_the_two_pngs(tmp_path):
    image = np.zeros((64, 80, 3), np.uint8)
    cv2.circle(image, (24, 30), 14, (40, 200, 220), -1)
    cv2.imwrite(str(tmp_path / 'shapes.png'), image)
    result = run_insight(tmp_path / 'shapes.png', '--stage', 1, '--block', 1, '--head', 1, '--query', 30, 24,
                         '--factors', 0.5, 1, 2, '--out-dir', tmp_path / 'out')
    assert result.returncode == 0, result.stderr
    for name in ('scores', 'magnitude'):
        png = tmp_path / 'out' / f'shapes_tiny_stage1_block1_head1_{name}.png'
        assert f'wrote {png}' in result.stdout
        picture = cv2.imread(str(png))
        assert picture is not None and picture.shape[0] > 200 and picture.std() > 10


def test_cli_explains_a_bad_position(tmp_path):
    cv2.imwrite(str(tmp_path / 'image.png'), np.zeros((32, 32, 3), np.uint8))
    result = run_insight(tmp_path / 'image.png', '--stage', 0, '--block', 5, '--out-dir', tmp_path)
    assert result.returncode != 0
    assert 'stage 0 has 2 blocks; --block 5 is not one' in result.stderr and 'Traceback' not in result.stderr
    result = run_insight(tmp_path / 'missing.png', '--out-dir', tmp_path)
    assert result.returncode != 0 and 'cannot read an image' in result.stderr
