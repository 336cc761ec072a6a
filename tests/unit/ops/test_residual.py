"""mala_mm.ops.residual: the residual branch with and without the LayerNorm after it in each implementation against
the naive formulas in fp64, the kernels' launches, stochastic depth's factors, and add_branch."""
import pytest
import torch
import torch.nn.functional as F

from mala_mm.ops import residual
from mala_mm.ops.residual import add_branch, drop_path_factors, naive
from tests.helpers.launches import LaunchRecord
from tests.helpers.low_precision import (IMPLS, NEEDS_TRITON, TRITON_DEVICE, assert_matches_fp64, channels_last_map,
                                         device_of, fp64_copies, impl_dtypes, implementation, outputs_and_gradients)

# channel counts that are not powers of two, a single pixel, tiles across batch items
SHAPES = [(2, 48, 5, 7), (1, 20, 1, 1), (3, 64, 4, 6)]
EPS = 1e-6
OPERATORS = ('scaled_residual', 'scaled_residual_norm')


def residual_inputs(shape, dtype=torch.float32, branch_dtype=None, device=TRITON_DEVICE):
    """The stream x, the branch, gamma (1, C, 1, 1) and the norm's (C,) weight and bias, all requiring gradients:
    x, gamma and the norm's parameters in fp32 (fp64 for fp64 maps), the branch in branch_dtype or the same."""
    channels = shape[1]
    dtype = torch.promote_types(dtype, torch.float32)
    tensors = [channels_last_map(shape, dtype, device), channels_last_map(shape, branch_dtype or dtype, device),
               torch.randn(1, channels, 1, 1, dtype=dtype, device=device),
               torch.randn(channels, dtype=dtype, device=device), torch.randn(channels, dtype=dtype, device=device)]
    return [t.requires_grad_() for t in tensors]


def stochastic_depth(batch, dtype=torch.float32, device=TRITON_DEVICE):
    """Factors of a batch with a dropped sample where there are two or more (0 and 1 / keep)."""
    return torch.tensor([2.0, 0.0, 2.0][:batch] if batch > 1 else [2.0], dtype=dtype, device=device).view(-1, 1, 1, 1)


def arguments(name, inputs, factors, as_output=False):
    """The reference's arguments of operator ``name``."""
    x, branch, gamma, weight, bias = inputs
    if name == 'scaled_residual':
        return [x, branch, gamma, factors]
    return [x, branch, gamma, factors, weight, bias, EPS, as_output]


def check_against_naive(name, impl, args, autocast=None):
    """The implementation's outputs (under ``autocast``, a dtype, where it is given) and the gradients of its inputs
    against the naive formula's in fp64 on the same values, each gradient in its input's dtype and shape. Returns
    the outputs and the gradients."""
    outputs, grads, weights = outputs_and_gradients(implementation(name, impl), args, autocast=autocast)
    exact, exact_grads, _ = outputs_and_gradients(getattr(naive, name), fp64_copies(args), weights)
    for index, (out, expected) in enumerate(zip(outputs, exact)):
        assert_matches_fp64(out, expected, f'output {index}')
    leaves = [t for t in args if isinstance(t, torch.Tensor) and t.requires_grad]
    for grad, expected, leaf in zip(grads, exact_grads, leaves):
        assert grad.dtype == leaf.dtype
        assert_matches_fp64(grad, expected, f'gradient of a {tuple(leaf.shape)} input')
    return outputs, grads


@pytest.mark.parametrize('name', OPERATORS)
@pytest.mark.parametrize('dropping', [False, True], ids=['no drop', 'stochastic depth'])
@pytest.mark.parametrize('shape', SHAPES, ids=lambda shape: 'x'.join(map(str, shape)))
@pytest.mark.parametrize('impl, dtype', impl_dtypes([torch.float64, torch.float32], [torch.float32]))
def test_matches_naive_in_fp64(impl, dtype, shape, dropping, name):
    device = device_of(impl)
    factors = stochastic_depth(shape[0], dtype, device) if dropping else None
    outputs, _ = check_against_naive(name, impl, arguments(name, residual_inputs(shape, dtype, device=device),
                                                           factors))
    for out in outputs:  # the next conv's input
        assert out.dtype == dtype and out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize('impl', IMPLS)
def test_a_low_precision_branch_under_autocast(impl):
    """The stream stays fp32 and the branch's gradient takes the branch's dtype and strides; the normalised map
    comes in fp32 from torch's layer_norm under autocast, in autocast's dtype from the kernel, as the next conv
    would cast it."""
    inputs = residual_inputs((2, 48, 5, 7), branch_dtype=torch.bfloat16, device=device_of(impl))
    factors = stochastic_depth(2, device=device_of(impl))
    normed_dtype = {'torch': torch.float32, 'triton': torch.bfloat16}[impl]
    for name in OPERATORS:
        outputs, grads = check_against_naive(name, impl, arguments(name, inputs, factors), torch.bfloat16)
        assert [out.dtype for out in outputs] == [torch.float32, normed_dtype][:len(outputs)]
        assert grads[1].stride() == inputs[1].stride()


@pytest.mark.parametrize('impl', IMPLS)
def test_a_stage_output_is_contiguous_in_the_stream_dtype_and_takes_a_contiguous_gradient(impl):
    """As the backbone's output: contiguous for mmcv's operators, fp32 under autocast as layer_norm's; the necks
    hand back a contiguous gradient, which the kernel reads as it is."""
    inputs = residual_inputs((2, 48, 5, 7), branch_dtype=torch.bfloat16, device=device_of(impl))
    outputs, _ = check_against_naive('scaled_residual_norm', impl,
                                     arguments('scaled_residual_norm', inputs, None, as_output=True), torch.bfloat16)
    assert outputs[1].is_contiguous() and outputs[1].dtype == torch.float32


@pytest.mark.parametrize('as_output', [False, True], ids=['FFN input', 'stage output'])
@pytest.mark.parametrize('dropping', [False, True], ids=['no drop', 'stochastic depth'])
@NEEDS_TRITON
def test_the_kernel_keeps_one_map_of_the_stream_that_a_neighbour_keeps(as_output, dropping):
    """For the norm's backward: the stream before the branch, which the block's first norm keeps, or at a stage's
    output the sum, which the downsample's conv keeps (in fp32); the gradients as the naive formula's in fp64."""
    inputs = residual_inputs((3, 64, 4, 6))
    factors = stochastic_depth(3) if dropping else None
    args = arguments('scaled_residual_norm', inputs, factors, as_output)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        outputs = implementation('scaled_residual_norm', 'triton')(*args)
    kept = [t for t in saved if t.shape == inputs[0].shape and t.dtype == torch.float32]
    assert len(kept) == 2  # and the branch, for gamma's gradient
    assert kept[0] is (outputs[0] if as_output else inputs[0])
    check_against_naive('scaled_residual_norm', 'triton', args)


@NEEDS_TRITON
def test_a_backward_program_sums_several_tiles(monkeypatch):
    """With 2 rows of partial sums, a map of 3 x 11 x 13 pixels at 64 channels (32 pixels a tile) makes programs of
    7 tiles, the last past the map."""
    from mala_mm.ops.residual import triton_ops
    monkeypatch.setattr(triton_ops, 'MAX_PARTIAL_ROWS', 2)
    inputs = residual_inputs((3, 64, 11, 13))
    assert triton_ops.ResidualPlan(inputs[0]).programs == 2
    check_against_naive('scaled_residual_norm', 'triton', arguments('scaled_residual_norm', inputs,
                                                                    stochastic_depth(3)))


@NEEDS_TRITON
def test_the_kernels_take_one_launch_a_forward_and_two_a_backward(monkeypatch):
    record = LaunchRecord(monkeypatch)
    x, branch, gamma, weight, bias = residual_inputs((2, 48, 5, 7), branch_dtype=torch.bfloat16)
    factors = stochastic_depth(2)
    with torch.autocast(TRITON_DEVICE.type, dtype=torch.bfloat16), record:
        out, normed = residual.scaled_residual_norm(x, branch, gamma, factors, weight, bias, EPS, impl='triton')
    assert record.take() == ['residual_kernel']
    upstream = [torch.randn_like(out), torch.randn_like(normed)]
    with record:
        torch.autograd.grad([out, normed], [x, branch, gamma, weight, bias], upstream)
    assert record.take() == ['residual_grad_kernel', 'aten.sum']
    with record:
        out = residual.scaled_residual(x, branch, gamma, factors, impl='triton')
        torch.autograd.grad(out, [x, branch, gamma], upstream[0])
    assert record.take() == ['residual_kernel', 'residual_grad_kernel', 'aten.sum']


def test_drop_path_factors_drop_whole_samples_and_keep_the_mean_of_each_branch():
    keep_probs = torch.tensor([0.75, 1.0, 0.5], dtype=torch.float64)
    factors = drop_path_factors(keep_probs, 20000)
    assert factors.shape == (3, 20000, 1, 1, 1) and factors.dtype == torch.float64
    for row, keep in zip(factors, keep_probs.tolist()):
        assert torch.equal(row.unique(), torch.tensor([0, 1 / keep] if keep < 1 else [1.], dtype=torch.float64))
        assert abs(row.mean().item() - 1) < 0.03


@pytest.mark.parametrize('impl', IMPLS)
def test_add_branch_takes_its_options_to_the_operators(impl):
    """Stochastic depth only where it has a keep probability, the norm where it is given, and without a layer
    scale the plain sum."""
    device = device_of(impl)
    x, branch, gamma, weight, bias = (t.detach() for t in residual_inputs((2, 48, 5, 7), device=device))
    factors = stochastic_depth(2, device=device)

    def close(ours, reference, *args):
        exact = reference(*fp64_copies(args))
        for out, expected in zip(ours if isinstance(ours, tuple) else (ours,), exact if isinstance(exact, tuple)
                                 else (exact,)):
            assert_matches_fp64(out, expected)
    close(add_branch(x, branch, gamma, None, factors, impl=impl), naive.scaled_residual, x, branch, gamma)
    close(add_branch(x, branch, gamma, 0.5, factors, impl=impl), naive.scaled_residual, x, branch, gamma, factors)
    close(add_branch(x, branch, gamma, 0.5, factors, norm=(weight, bias, EPS), impl=impl),
          naive.scaled_residual_norm, x, branch, gamma, factors, weight, bias, EPS)
    out, normed = add_branch(x, branch, gamma, norm=(weight, bias, EPS), as_output=True, impl=impl)
    assert normed.is_contiguous()
    close((out, normed), naive.scaled_residual_norm, x, branch, gamma, None, weight, bias, EPS)
    close(add_branch(x, branch, None, impl=impl), torch.add, x, branch)
    close(add_branch(x, branch, None, 0.5, factors, impl=impl), torch.addcmul, x, factors, branch)


@pytest.mark.parametrize('in_graph', [False, True], ids=['eager', 'in a graph'])
def test_add_branch_draws_whole_samples_where_no_factors_are_given(in_graph, monkeypatch):
    """Each sample is the stream alone or the stream and its branch over the keep probability: in eager mode from
    drop_path_factors, in a graph (traced, compiled or exported) as mmcv's DropPath draws them; the normalised stage
    output contiguous in both."""
    monkeypatch.setattr(residual, 'in_graph', lambda: in_graph)
    x, branch, gamma, weight, bias = (t.detach() for t in residual_inputs((64, 4, 2, 3), device=torch.device('cpu')))
    for norm in (None, (weight, bias, EPS)):
        out = add_branch(x, branch, gamma, 0.5, norm=norm, as_output=True)
        if norm is not None:
            out, normed = out
            assert normed.is_contiguous()
            torch.testing.assert_close(normed, F.layer_norm(out.permute(0, 2, 3, 1), (4,), weight, bias,
                                                            EPS).permute(0, 3, 1, 2))
        kept = (out - x).abs().amax((1, 2, 3)) > 0
        assert 0 < kept.sum() < 64
        torch.testing.assert_close(out[kept], (x + gamma * branch / 0.5)[kept])
        torch.testing.assert_close(out[~kept], x[~kept], rtol=0, atol=0)


def test_naive_norm_is_torchs_layer_norm_over_the_channels():
    x, branch, gamma, weight, bias = (t.detach() for t in residual_inputs((2, 48, 5, 7), torch.float64,
                                                                          device=torch.device('cpu')))
    out, normed = naive.scaled_residual_norm(x, branch, gamma, None, weight, bias, EPS)
    torch.testing.assert_close(out, x + gamma * branch, rtol=0, atol=0)
    expected = F.layer_norm(out.permute(0, 2, 3, 1), (48,), weight, bias, EPS).permute(0, 3, 1, 2)
    torch.testing.assert_close(normed, expected, rtol=1e-12, atol=1e-12)
