"""mala_mm.ops.batch_norm_gelu: GELU after a training BatchNorm in each implementation against the naive formula in
fp64, the running statistics, the launches and what the backward keeps; the stem through it."""
import pytest
import torch

from mala_mm.models.layers.blocks import ConvStem
from mala_mm.ops.batch_norm_gelu import naive
from tests.helpers.launches import LaunchRecord
from tests.helpers.low_precision import (NEEDS_TRITON, assert_matches_fp64, channels_last_map, device_of, fp64_copies,
                                         impl_dtypes, implementation, outputs_and_gradients)

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
SHAPE = (2, 40, 5, 7)  # channels past one tile of 32, pixels not a multiple of the tile's


def inputs(dtype, device, shape=SHAPE):
    """x (shifted and scaled, as a conv's output is), the norm's parameters and running statistics, momentum 0.1 and
    eps 1e-5."""
    channels = shape[1]
    x = (3 + 2 * channels_last_map(shape, torch.float32, device)).to(dtype).requires_grad_()
    weight = (1 + torch.randn(channels, device=device) / 4).requires_grad_()
    bias = torch.randn(channels, device=device).requires_grad_()
    return [x, weight, bias, torch.zeros(channels, device=device), torch.ones(channels, device=device), 0.1, 1e-5]


@pytest.mark.parametrize('impl, dtype', impl_dtypes([torch.float64, torch.float32], FLOATS))
def test_batch_norm_gelu_matches_naive_in_fp64(impl, dtype):
    """Within one rounding to x's dtype; x's gradient in x's dtype, the parameters' in theirs."""
    args = inputs(dtype, device_of(impl))
    if dtype == torch.float64:
        args = fp64_copies(args)
    outputs, grads, weights = outputs_and_gradients(implementation('batch_norm_gelu', impl), args)
    exact, exact_grads, _ = outputs_and_gradients(naive.batch_norm_gelu, fp64_copies(args), weights)
    assert outputs[0].dtype == dtype
    for ours, expected, name in zip([*outputs, *grads], [*exact, *exact_grads], ['output', 'x', 'weight', 'bias']):
        if dtype in (torch.float64, torch.float32):
            assert_matches_fp64(ours, expected, name)
        else:  # the norm's output rounded, then GELU's, and sums of rounded terms: within a step of the dtype (the
            # relative error of the whole, each element's error about half a step at most)
            error = (ours.double().cpu() - expected).norm() / expected.norm()
            assert error <= torch.finfo(dtype).eps, name
    for grad, leaf in zip(grads, args):
        assert grad.dtype == leaf.dtype


@NEEDS_TRITON
def test_the_running_statistics_are_the_norms():
    """Updated as torch's BatchNorm updates them: the batch's mean, and its unbiased variance."""
    device = device_of('triton')
    ours, theirs = inputs(torch.float32, device), inputs(torch.float32, device)
    theirs[0] = ours[0]
    implementation('batch_norm_gelu', 'triton')(*ours)
    implementation('batch_norm_gelu', 'torch')(*theirs)
    for name, a, b in zip(['mean', 'variance'], ours[3:5], theirs[3:5]):
        torch.testing.assert_close(a, b, msg=name)
    assert not torch.equal(ours[3], torch.zeros_like(ours[3]))


@NEEDS_TRITON
def test_the_backward_keeps_the_norms_input_alone_in_the_launches_of_the_torch_operators(monkeypatch):
    """The forward is the norm's and GELU's operators; the backward's kernel stands for GELU's backward, so the
    launches are as many as torch's, and no map but x is kept."""
    record = LaunchRecord(monkeypatch)
    args = inputs(torch.bfloat16, device_of('triton'))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t), record:
        out = implementation('batch_norm_gelu', 'triton')(*args)
    assert record.take() == ['aten.native_batch_norm', 'aten.gelu']
    assert [t for t in saved if t.dim() == 4] == [args[0]]
    grad = torch.randn_like(out)
    with record:
        out.backward(grad)
    assert record.take() == ['gelu_grad_kernel', 'aten.native_batch_norm_backward']


@NEEDS_TRITON
def test_the_stem_trains_alike_through_either_implementation():
    """Outputs, gradients, running statistics and counted batches; BatchNorm's momentum None (a cumulative average)
    too."""
    device = device_of('triton')
    x = torch.randn(2, 3, 16, 20, device=device).contiguous(memory_format=torch.channels_last)
    stems = {impl: ConvStem(3, 64, dict(type='BN', momentum=None), impl).to(device) for impl in ('torch', 'triton')}
    stems['triton'].load_state_dict(stems['torch'].state_dict())
    results = {}
    for impl, stem in stems.items():
        out = stem(x)
        out.square().mean().backward()
        results[impl] = [out, *(p.grad for p in stem.parameters()), *stem.buffers()]
    for ours, theirs in zip(results['triton'], results['torch']):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
