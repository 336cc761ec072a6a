"""mala_mm.ops.residual_triton: a residual branch added back, with and without the LayerNorm after it, against the
fp64 torch formula; and their launch budget, one launch a forward and two a backward.

The kernels run on the GPU where there is one, else on the CPU in Triton's interpreter (tests/conftest.py). The
maps: channel counts that are not powers of two, a single pixel, tiles across batch items.
"""
import pytest
import torch
import torch.nn.functional as F

from tests.helpers.launches import LaunchRecord
from tests.helpers.low_precision import IMPL_MARKS, TRITON_DEVICE
from mala_mm.ops import residual
from mala_tools.reference import relative_error

pytestmark = IMPL_MARKS['triton']

SHAPES = [(2, 48, 5, 7), (1, 20, 1, 1), (3, 64, 4, 6)]


def channels_last_map(shape, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(shape, device=TRITON_DEVICE).to(dtype).contiguous(memory_format=torch.channels_last)


def residual_inputs(shape, branch_dtype=torch.float32):
    """The fp32 stream x, the branch, gamma (1, C, 1, 1) and the norm's (C,) weight and bias, all needing grads."""
    channels = shape[1]
    tensors = [channels_last_map(shape), channels_last_map(shape, branch_dtype),
               torch.randn(1, channels, 1, 1, device=TRITON_DEVICE), torch.randn(channels, device=TRITON_DEVICE),
               torch.randn(channels, device=TRITON_DEVICE)]
    return [t.requires_grad_() for t in tensors]


def stochastic_depth(batch):
    """Factors of a batch with a dropped sample where there are two or more (0 and 1 / keep)."""
    return torch.tensor([2.0, 0.0, 2.0][:batch] if batch > 1 else [2.0], device=TRITON_DEVICE).view(-1, 1, 1, 1)


def reference(x, branch, gamma, weight, bias, factors):
    """The stream and its LayerNorm in torch's operators."""
    out = x + (1 if factors is None else factors) * gamma * branch
    return out, F.layer_norm(out.permute(0, 2, 3, 1), weight.shape, weight, bias, 1e-6).permute(0, 3, 1, 2)


def gradients_of(outputs, inputs, upstream):
    return torch.autograd.grad(outputs, inputs, upstream, retain_graph=True)


def assert_matches_fp64(ours, exact):
    """Relative to the largest value, as the kernels' fp32 arithmetic and torch's fp64 differ in rounding only."""
    assert relative_error(ours.cpu(), exact) < 1e-5


@pytest.mark.parametrize('dropping', [False, True], ids=['no drop', 'stochastic depth'])
@pytest.mark.parametrize('shape', SHAPES, ids=lambda shape: 'x'.join(map(str, shape)))
def test_residual_and_its_norm_match_fp64(shape, dropping):
    inputs = residual_inputs(shape)
    exact_inputs = [t.detach().cpu().double().requires_grad_() for t in inputs]
    factors = stochastic_depth(shape[0]) if dropping else None
    exact = reference(*exact_inputs, None if factors is None else factors.cpu().double())
    upstream = [torch.randn_like(t) for t in exact]
    exact_grads = gradients_of(exact, exact_inputs, upstream)
    x, branch, gamma, weight, bias = inputs
    ours = residual.scaled_residual_norm(x, branch, gamma, factors, weight, bias, 1e-6, impl='triton')
    for out, expected in zip(ours, exact):
        assert out.is_contiguous(memory_format=torch.channels_last)
        assert_matches_fp64(out, expected)
    grads = gradients_of(ours, inputs, [u.float().to(TRITON_DEVICE) for u in upstream])
    for name, grad, expected in zip(['x', 'branch', 'gamma', 'weight', 'bias'], grads, exact_grads):
        assert grad.shape == expected.shape, name
        assert_matches_fp64(grad, expected)

    # without the norm: the stream alone, the same gradients as the stream's part of the above
    plain = residual.scaled_residual(x, branch, gamma, factors, impl='triton')
    assert_matches_fp64(plain, exact[0])
    grads = torch.autograd.grad(plain, (x, branch, gamma), upstream[0].float().to(TRITON_DEVICE))
    exact_grads = torch.autograd.grad(exact[0], exact_inputs[:3], upstream[0])
    for grad, expected in zip(grads, exact_grads):
        assert_matches_fp64(grad, expected)


def test_a_low_precision_branch_under_autocast():
    """The stream stays fp32; the normalised map comes in autocast's dtype, as the next conv would cast it; the
    branch's gradient in its own dtype."""
    x, branch, gamma, weight, bias = residual_inputs((2, 48, 5, 7), torch.bfloat16)
    with torch.autocast(TRITON_DEVICE.type, dtype=torch.bfloat16):
        out, normed = residual.scaled_residual_norm(x, branch, gamma, None, weight, bias, 1e-6, impl='triton')
    expected_out, expected_normed = reference(x.double(), branch.double(), gamma.double(), weight.double(),
                                              bias.double(), None)
    assert out.dtype == torch.float32 and normed.dtype == torch.bfloat16
    assert_matches_fp64(out, expected_out)
    # one rounding to bf16 apart: the fp32 result may lie on the other side of a rounding boundary
    torch.testing.assert_close(normed, expected_normed.bfloat16(), rtol=torch.finfo(torch.bfloat16).eps, atol=1e-5)
    (out.sum() + normed.float().sum()).backward()
    assert branch.grad.dtype == torch.bfloat16 and branch.grad.stride() == branch.stride()


def test_a_stage_output_is_contiguous_in_the_stream_dtype_and_takes_a_contiguous_gradient():
    """As the backbone's output: contiguous for mmcv's operators, fp32 under autocast as layer_norm's; the necks
    hand back a contiguous gradient, which the kernel reads as it is."""
    inputs = residual_inputs((2, 48, 5, 7), torch.bfloat16)
    x, branch, gamma, weight, bias = inputs
    exact_inputs = [t.detach().cpu().double().requires_grad_() for t in inputs]
    exact = reference(*exact_inputs, None)
    with torch.autocast(TRITON_DEVICE.type, dtype=torch.bfloat16):
        ours = residual.scaled_residual_norm(x, branch, gamma, None, weight, bias, 1e-6, impl='triton',
                                             as_output=True)
    assert ours[1].is_contiguous() and ours[1].dtype == torch.float32
    assert_matches_fp64(ours[1], exact[1])
    upstream = [torch.randn(exact[0].shape, dtype=torch.float64).contiguous(memory_format=torch.channels_last),
                torch.randn(exact[1].shape, dtype=torch.float64)]
    grads = gradients_of(ours, inputs, [u.float().to(TRITON_DEVICE) for u in upstream])
    for grad, expected in zip(grads, gradients_of(exact, exact_inputs, upstream)):
        assert relative_error(grad.cpu(), expected) < (1e-2 if grad.dtype == torch.bfloat16 else 1e-5)


def test_a_backward_program_sums_several_tiles(monkeypatch):
    """With 2 rows of partial sums, a map of 3 x 11 x 13 pixels at 64 channels (32 pixels a tile) makes programs of
    7 tiles, the last past the map."""
    from mala_mm.ops.residual import triton_ops as residual_triton
    monkeypatch.setattr(residual_triton, 'MAX_PARTIAL_ROWS', 2)
    shape = (3, 64, 11, 13)
    inputs = residual_inputs(shape)
    assert residual_triton.ResidualPlan(inputs[0]).programs == 2
    exact_inputs = [t.detach().cpu().double().requires_grad_() for t in inputs]
    exact = reference(*exact_inputs, stochastic_depth(3).cpu().double())
    ours = residual.scaled_residual_norm(*inputs[:3], stochastic_depth(3), *inputs[3:], 1e-6, impl='triton')
    upstream = [torch.randn_like(t) for t in exact]
    ours_grads = gradients_of(ours, inputs, [u.float().to(TRITON_DEVICE) for u in upstream])
    for grad, expected in zip(ours_grads, gradients_of(exact, exact_inputs, upstream)):
        assert_matches_fp64(grad, expected)


def test_one_launch_a_forward_and_two_a_backward(monkeypatch):
    record = LaunchRecord(monkeypatch)
    x, branch, gamma, weight, bias = residual_inputs((2, 48, 5, 7), torch.bfloat16)
    factors = stochastic_depth(2)
    with torch.autocast(TRITON_DEVICE.type, dtype=torch.bfloat16), record:
        out, normed = residual.scaled_residual_norm(x, branch, gamma, factors, weight, bias, 1e-6, impl='triton')
    assert record.take() == ['residual_kernel']
    upstream = [torch.randn_like(out), torch.randn_like(normed)]
    with record:
        torch.autograd.grad([out, normed], [x, branch, gamma, weight, bias], upstream)
    assert record.take() == ['residual_grad_kernel', 'aten.sum']
    with record:
        out = residual.scaled_residual(x, branch, gamma, factors, impl='triton')
        torch.autograd.grad(out, [x, branch, gamma], upstream[0])
    assert record.take() == ['residual_kernel', 'residual_grad_kernel', 'aten.sum']
