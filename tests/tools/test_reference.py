"""The explicit reference (mala_tools.reference), the release comparison's oracle and the benchmarks' baseline: its
two evaluation orders of MALA agree, its RoPE tables are the model's, and its backbone reproduces the release's
outputs and agrees with the model.

Errors are max |ours - expected| / max |expected| per output, as in tests/unit/models/test_mixed_precision.py.
Between the image and the last output of the fixture's arch lie 13 layers computed in fp32 (the stem's 4 convs, 6
blocks, 3 downsamples); each rounds its output to about one fp32 epsilon of its scale, and the residual stream and
the LayerNorms carry these errors on to the outputs. One fp32 evaluation is thus within about 13 epsilons of the
exact function, and two fp32 evaluations (the release's and ours) within 26 of each other.
"""
import os

import pytest
import torch

from mala_mm import MALA
from mala_mm.checkpoint import load_backbone_weights
from mala_mm.models.layers import RoPE2d
from mala_mm.ops.mala_attention import naive
from mala_tools import reference
from mala_tools.reference import relative_error
from tests.helpers import DATA_DIR

FP32_LAYERS = 4 + 6 + 3
ONE_FP32_EVALUATION = FP32_LAYERS * torch.finfo(torch.float32).eps
TWO_FP32_EVALUATIONS = 2 * ONE_FP32_EVALUATION

B, HEADS, H, W, D = 2, 3, 5, 7, 8


def relative_errors(outputs, expected):
    return [relative_error(ours, exact) for ours, exact in zip(outputs, expected)]


@pytest.fixture(scope='module')
def release():
    """The fixture's model with the release checkpoint loaded (eval mode), its input and the release's outputs."""
    io = torch.load(os.path.join(DATA_DIR, 'official_det_io.pth'), weights_only=True)
    model = MALA(arch=io['arch'])
    load_backbone_weights(model, os.path.join(DATA_DIR, 'official_det_ckpt.pth'))
    with torch.no_grad():
        model_outputs = model.eval()(io['input'])
    return model, io['input'], io['outputs'], model_outputs


@pytest.mark.parametrize('order', reference.MALA_ORDERS)
def test_reference_backbone_reproduces_release_outputs_and_the_model(release, order):
    model, image, release_outputs, model_outputs = release
    reference_copy = reference.reference_backbone(model, order)
    with torch.no_grad():
        fp32 = reference_copy(image)
        fp64 = reference_copy.double()(image.double())
    assert [out.shape for out in fp32] == [out.shape for out in release_outputs]
    assert all(out.dtype == torch.float32 for out in fp32) and all(out.dtype == torch.float64 for out in fp64)
    assert max(relative_errors(fp32, release_outputs)) < TWO_FP32_EVALUATIONS
    assert max(relative_errors(fp32, model_outputs)) < TWO_FP32_EVALUATIONS
    # evaluated exactly, the reference is off the release's and the model's fp32 outputs by their rounding alone
    assert max(relative_errors(release_outputs, fp64)) < ONE_FP32_EVALUATION
    assert max(relative_errors(model_outputs, fp64)) < ONE_FP32_EVALUATION


def test_reference_backbone_is_a_copy(release):
    model = release[0]
    reference_copy = reference.reference_backbone(model)
    assert reference_copy is not model and reference_copy.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(reference_copy.state_dict().values(), model.state_dict().values()))
    reference_copy.double()
    assert next(model.parameters()).dtype == torch.float32
    with pytest.raises(ValueError, match='evaluation order'):
        reference.reference_backbone(model, 'linear')


CASES = {
    'random': lambda: [torch.randn(B, HEADS, H * W, D, dtype=torch.float64) for _ in range(3)],
    # phi(q) ~ 6e-6: z ~ 1e-5 near eps, beta ~ 1e5
    'q near -12': lambda: [torch.randn(B, HEADS, H * W, D, dtype=torch.float64) - 12 * (i == 0) for i in range(3)],
    'x 1e3': lambda: [1e3 * torch.randn(B, HEADS, H * W, D, dtype=torch.float64) for _ in range(3)],
}


def spec_angles():
    return reference.rope_angles(reference.rope_frequencies(D, torch.float64), H, W)


@pytest.mark.parametrize('with_rope', [False, True])
@pytest.mark.parametrize('case', list(CASES))
def test_the_two_evaluation_orders_agree(case, with_rope):
    q, k, v = CASES[case]()
    angles = spec_angles() if with_rope else None
    scores = reference.mala_attention(q, k, v, angles, order='scores')
    release_order = reference.mala_attention(q, k, v, angles, order='release')
    close = dict(rtol=1e-10, atol=1e-10 * scores.abs().max().item())
    torch.testing.assert_close(release_order, scores, **close)
    rope = None if angles is None else reference.rope_tables(angles)
    torch.testing.assert_close(naive.mala_scores(q, k, rope) @ v, scores, **close)
    with pytest.raises(ValueError, match='evaluation order'):
        reference.mala_attention(q, k, v, angles, order='linear')


def test_the_spec_angles_give_the_models_tables():
    tables, expected = reference.rope_tables(spec_angles()), RoPE2d(D).tables(H, W, dtype=torch.float64)
    torch.testing.assert_close(tables.cos, expected.cos)
    torch.testing.assert_close(tables.sin, expected.sin)


def test_rope_angles_are_row_then_column_multiples_of_the_frequencies():
    frequencies = reference.rope_frequencies(D, torch.float64)
    torch.testing.assert_close(frequencies[::2], 1 / 10000 ** torch.linspace(0, 1, D // 4, dtype=torch.float64))
    angles = reference.rope_angles(frequencies, H, W)
    assert angles.shape == (H * W, D)
    row, column = 3, 5
    torch.testing.assert_close(angles[row * W + column], torch.cat([row * frequencies, column * frequencies]))
