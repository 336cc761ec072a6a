"""mala_mm.ops.depthwise: the residual and the gated depth-wise convolutions in each implementation against the naive
formulas in fp64, the kernels' launches, and the torch operators' residual stream."""
import pytest
import torch
import torch.nn.functional as F

from mala_mm.ops import TRITON_AVAILABLE
from mala_mm.ops.depthwise import naive
from tests.helpers.launches import LaunchRecord
from tests.helpers.low_precision import (IMPL_MARKS, IMPLS, NAMES, NEEDS_CPU_FP16, NEEDS_TRITON, TRITON_DEVICE,
                                         assert_matches_fp64, channels_last_map, device_of, fp64_copies, implementation,
                                         outputs_and_gradients)

if TRITON_AVAILABLE:  # a Triton the kernels run on; else IMPL_MARKS skips these tests
    from mala_mm.ops.depthwise import triton_ops as depthwise_triton
    from mala_mm.ops.triton_launch import gpu_of
else:
    depthwise_triton = None

# borders, pixel counts that are not multiples of the tile, channel counts that are not multiples of the channel
# tile, a single pixel, and tiles across two batch items; the low precisions, which the kernels take outside
# autocast, on fewer maps, since rounding is checked element by element
SHAPES = [(2, 48, 5, 7), (1, 20, 1, 1), (1, 3, 9, 13), (2, 224, 3, 5)]
LOW_PRECISION_SHAPES = [(1, 3, 9, 13), (2, 20, 3, 5)]
DTYPES = {'torch': [torch.float64, torch.float32], 'triton': [torch.float32, torch.bfloat16, torch.float16]}
CASES = [pytest.param(impl, shape, dtype, id=f"{impl}-{'x'.join(map(str, shape))}-{NAMES[dtype]}",
                      marks=IMPL_MARKS.get(impl, ()))
         for impl, dtypes in DTYPES.items() for dtype in dtypes
         for shape in (SHAPES if dtype in (torch.float64, torch.float32) else LOW_PRECISION_SHAPES)]


def conv_parameters(channels: int, kernel_size: int, dtype=torch.float32, device=TRITON_DEVICE):
    """A (C, 1, k, k) weight with the channels-last strides that the backbone stores, and a (C,) bias, fp32 (fp64
    for fp64 maps)."""
    dtype = torch.promote_types(dtype, torch.float32)
    weight = torch.randn(channels, kernel_size, kernel_size, 1, dtype=dtype, device=device).permute(0, 3, 1, 2) / 3
    return weight.requires_grad_(), torch.randn(channels, dtype=dtype, device=device).requires_grad_()


def centre_tap(weight):
    """weight's shape and strides, 1 at the centre and 0 elsewhere: what ResidualDWConv hands the operator."""
    tap = torch.zeros_like(weight).detach()
    tap[..., weight.shape[-2] // 2, weight.shape[-1] // 2] = 1
    return tap


def residual_inputs(shape, dtype=torch.float32, gelu=False, device=TRITON_DEVICE):
    x = channels_last_map(shape, dtype, device).requires_grad_()
    weight, bias = conv_parameters(shape[1], 3, dtype, device)
    return [x, weight, bias, gelu, centre_tap(weight)]


def gated_inputs(shape, dtype=torch.float32, y_dtype=None, device=TRITON_DEVICE):
    """y, and v and o as channel slices of one channels-last (B, 4C, H, W) map, as the attention hands them over;
    LePE's 5x5 weight and its bias."""
    batch, channels, height, width = shape
    qkvo = channels_last_map((batch, 4 * channels, height, width), dtype, device)
    v, o = (qkvo[:, i * channels:(i + 1) * channels].detach().requires_grad_() for i in (2, 3))
    y = channels_last_map(shape, y_dtype or dtype, device).requires_grad_()
    return [y, v, o, *conv_parameters(channels, 5, dtype, device)]


def check_against_naive(name: str, impl: str, inputs):
    """The implementation's output and the gradients of its inputs against the naive formula's in fp64 on the same
    values, each gradient in its input's dtype; from the kernels, the output and the maps' gradients are
    channels-last maps and the weight's gradient has the weight's strides. Returns the output."""
    outputs, grads, weights = outputs_and_gradients(implementation(name, impl), inputs)
    exact, exact_grads, _ = outputs_and_gradients(getattr(naive, name), fp64_copies(inputs), weights)
    assert_matches_fp64(outputs[0], exact[0], 'output')
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    for grad, expected, leaf in zip(grads, exact_grads, leaves):
        assert grad.dtype == leaf.dtype
        assert_matches_fp64(grad, expected, f'gradient of a {tuple(leaf.shape)} input')
        if impl == 'triton' and grad.dim() == 4:
            assert grad.is_contiguous(memory_format=torch.channels_last)
    if impl == 'triton':
        assert outputs[0].is_contiguous(memory_format=torch.channels_last)
        weight = leaves[-2]
        assert grads[-2].stride() == weight.stride()
    return outputs[0]


@pytest.mark.parametrize('gelu', [False, True], ids=['identity', 'GELU'])
@pytest.mark.parametrize('impl, shape, dtype', CASES)
def test_residual_depthwise_conv_matches_naive_in_fp64(impl, shape, dtype, gelu):
    out = check_against_naive('residual_depthwise_conv', impl, residual_inputs(shape, dtype, gelu, device_of(impl)))
    assert out.dtype == dtype


@pytest.mark.parametrize('impl, shape, dtype', CASES)
def test_gated_depthwise_conv_matches_naive_in_fp64(impl, shape, dtype):
    out = check_against_naive('gated_depthwise_conv', impl, gated_inputs(shape, dtype, device=device_of(impl)))
    assert out.dtype == dtype


@NEEDS_TRITON
def test_the_gated_kernel_takes_y_in_another_dtype_and_gives_o_dtype():
    out = check_against_naive('gated_depthwise_conv', 'triton', gated_inputs((2, 20, 3, 5), torch.float16,
                                                                             y_dtype=torch.float32))
    assert out.dtype == torch.float16


@pytest.mark.parametrize('impl', IMPLS)
def test_maps_whose_channels_are_not_adjacent_give_the_same(impl):
    """An NCHW map: the kernels copy it to channels-last first."""
    x, *rest = residual_inputs((1, 3, 9, 13), device=device_of(impl))
    x = x.detach().contiguous().requires_grad_()
    check_against_naive('residual_depthwise_conv', impl, [x, *rest])


@pytest.mark.parametrize('impl', IMPLS)
def test_an_empty_batch_gives_empty_maps_and_zero_parameter_grads(impl):
    device = device_of(impl)
    for name, inputs in (('residual_depthwise_conv', residual_inputs((0, 20, 3, 4), gelu=True, device=device)),
                         ('gated_depthwise_conv', gated_inputs((0, 20, 3, 4), device=device))):
        outputs, grads, _ = outputs_and_gradients(implementation(name, impl), inputs)
        assert outputs[0].shape == grads[0].shape == (0, 20, 3, 4), name
        assert not grads[-2].any() and not grads[-1].any(), name


@NEEDS_TRITON
def test_a_backward_program_sums_several_tiles(monkeypatch):
    """With 2 rows of partial sums, 65 pixels (3 tiles of 32) make chunks of 2 tiles, the last one past the map."""
    monkeypatch.setattr(depthwise_triton, 'MAX_PARTIAL_ROWS', 2)
    shape = (1, 20, 5, 13)
    inputs = residual_inputs(shape, gelu=True)
    assert depthwise_triton.DepthwisePlan(inputs[0], inputs[1], gpu_of(inputs[0])).chunk_grid == (2, 1)
    check_against_naive('residual_depthwise_conv', 'triton', inputs)
    check_against_naive('gated_depthwise_conv', 'triton', gated_inputs(shape))


@NEEDS_TRITON
def test_the_kernels_check_their_shapes():
    x, weight, bias, *_ = residual_inputs((1, 4, 5, 5))
    with pytest.raises(ValueError, match='k odd'):
        implementation('residual_depthwise_conv', 'triton')(x, weight[..., :2, :2], bias, False)
    with pytest.raises(ValueError, match='one shape'):
        implementation('gated_depthwise_conv', 'triton')(x, x, x[:, :, :4], weight, bias)


@NEEDS_TRITON
def test_the_kernels_take_one_launch_a_forward_and_two_a_backward(monkeypatch):
    """Under autocast too: the kernels read the fp32 parameters as they are. The residual op's backward runs into
    its leaves' .grad, where autograd would copy a gradient whose strides differ from its parameter's."""
    record = LaunchRecord(monkeypatch)
    x, weight, bias, *_ = residual_inputs((1, 20, 3, 4), torch.bfloat16)
    with torch.autocast(TRITON_DEVICE.type, dtype=torch.bfloat16), record:
        out = implementation('residual_depthwise_conv', 'triton')(x, weight, bias, True)
    assert record.take() == ['residual_conv_kernel']
    grad = torch.randn_like(out)
    with record:
        out.backward(grad)
    assert record.take() == ['residual_conv_grad_kernel', 'aten.sum']
    assert weight.grad.stride() == weight.stride() and x.grad.stride() == x.stride()

    # v and o read in place; their gradients are separate maps, which autograd.grad returns as they are
    inputs = gated_inputs((1, 20, 3, 4), torch.bfloat16)
    with torch.autocast(TRITON_DEVICE.type, dtype=torch.bfloat16), record:
        out = implementation('gated_depthwise_conv', 'triton')(*inputs)
    assert record.take() == ['gated_conv_kernel']
    grad = torch.randn_like(out)
    with record:
        grads = torch.autograd.grad(out, inputs, grad)
    assert record.take() == ['gated_conv_grad_kernel', 'aten.sum']
    assert grads[3].stride() == inputs[3].stride()


@NEEDS_TRITON
def test_under_autocast_the_kernel_keeps_the_fp32_stream_in_autocast_dtype():
    """The position encoding on the fp32 stream: its output from x in fp32, and for the weight's gradient the backward
    keeps x rounded to bf16 (half the bytes), as autocast's conv keeps its cast of x: the gradients are the naive
    formula's on that rounding."""
    inputs = residual_inputs((2, 20, 5, 6))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        outputs, grads, weights = outputs_and_gradients(implementation('residual_depthwise_conv', 'triton'), inputs,
                                                        autocast=torch.bfloat16)
    x = inputs[0]
    kept = [t for t in saved if t.shape == x.shape and t.dtype != torch.float64]  # not the loss's
    assert [t.dtype for t in kept] == [torch.bfloat16]
    assert_matches_fp64(kept[0], x.detach().double(), 'kept x')
    assert outputs[0].dtype == torch.float32
    exact, _, _ = outputs_and_gradients(naive.residual_depthwise_conv, fp64_copies(inputs), weights)
    assert_matches_fp64(outputs[0], exact[0], 'output')
    _, exact_grads, _ = outputs_and_gradients(naive.residual_depthwise_conv,
                                              fp64_copies([kept[0].requires_grad_(), *inputs[1:]]), weights)
    for grad, expected, name in zip(grads, exact_grads, ['x', 'weight', 'bias']):
        assert_matches_fp64(grad, expected, name)


@pytest.mark.parametrize('autocast', [None, torch.bfloat16], ids=['fp32', 'bf16 autocast'])
def test_the_torch_operators_keep_x_alone_through_gelu(monkeypatch, autocast):
    """In training, GELU's output is not kept beside its input: the backward takes it again, one launch more (the
    gradients against the naive formula's: test_residual_depthwise_conv_matches_naive_in_fp64)."""
    record = LaunchRecord(monkeypatch)
    x, weight, bias, _, tap = residual_inputs((2, 20, 5, 6), torch.bfloat16 if autocast else torch.float32,
                                              device=torch.device('cpu'))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t), record, \
            torch.autocast('cpu', dtype=autocast, enabled=autocast is not None):
        out = implementation('residual_depthwise_conv', 'torch')(x, weight, bias, True, tap)
    assert [t for t in saved if t.shape == x.shape] == [x]
    forward = record.take()
    grad = torch.randn_like(out)
    with record:
        out.backward(grad)
    backward = record.take()
    assert backward.count('aten.gelu') == 1 and 'aten.gelu_backward' in backward
    assert forward.count('aten.gelu') == 1


def test_the_centre_tap_adds_the_residual_in_the_conv_in_fp32():
    """One pass over the map, ``DWConv(x)`` with the centre tap added to the kernel: in fp32 as exact as the conv
    and the add (fp16 would round 1 + 1e-3 t to steps of 2^-10)."""
    x, weight, bias, _, tap = residual_inputs((1, 8, 6, 6), device=torch.device('cpu'))
    x = 1 + 1e-3 * x.detach()
    expected = x + F.conv2d(x, weight, bias, padding=1, groups=8)
    torch.testing.assert_close(implementation('residual_depthwise_conv', 'torch')(x, weight, bias, False, tap),
                               expected, rtol=0, atol=1e-6)


@NEEDS_CPU_FP16
def test_under_autocast_the_torch_operators_keep_the_residual_stream_in_fp32():
    """The conv in fp16, as autocast runs it, and its sum with the fp32 stream in fp32, not folded into the
    kernel."""
    x, weight, bias, _, tap = residual_inputs((1, 8, 6, 6), device=torch.device('cpu'))
    x = 1 + 1e-3 * x.detach()
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.float16):
        y = implementation('residual_depthwise_conv', 'torch')(x, weight, bias, False, tap)
        delta = F.conv2d(x, weight, bias, padding=1, groups=8)
    assert y.dtype == torch.float32
    assert torch.equal(y, x + delta)


def test_naive_conv_is_the_sum_of_its_taps_over_the_zero_padded_map():
    x = torch.randn(2, 3, 6, 7, dtype=torch.float64)
    weight, bias = (t.detach() for t in conv_parameters(3, 5, torch.float64, torch.device('cpu')))
    padded = F.pad(x, (2, 2, 2, 2))
    expected = bias.view(1, 3, 1, 1) + sum(weight[:, 0, i, j].view(1, 3, 1, 1) * padded[..., i:i + 6, j:j + 7]
                                           for i in range(5) for j in range(5))
    torch.testing.assert_close(naive.depthwise_conv(x, weight, bias), expected, rtol=1e-12, atol=1e-12)
