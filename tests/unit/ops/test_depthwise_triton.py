"""mala_mm.ops.depthwise_triton: the fused depth-wise convolutions against the fp64 torch formula, and their launch
budget, one launch a forward and two a backward.

The kernels run on the GPU where there is one, else on the CPU in Triton's interpreter (tests/conftest.py), where a
program takes up to a few tenths of a second. The maps are small: borders, pixel counts that are not multiples of
the tile, channel counts that are not multiples of the channel tile, a single pixel, and tiles across two batch
items; the low precisions on fewer maps, since rounding is checked element by element.
"""
import pytest
import torch
import torch.nn.functional as F

from tests.helpers.launches import LaunchRecord
from tests.helpers.low_precision import IMPL_MARKS, TRITON_DEVICE
from mala_tools.reference import relative_error

try:
    from mala_mm.ops.depthwise import triton_ops as depthwise_triton
    from mala_mm.ops.triton_launch import gpu_of
except ImportError:  # without Triton, whose tests IMPL_MARKS skips
    depthwise_triton = None

pytestmark = IMPL_MARKS['triton']

SHAPES = [(2, 48, 5, 7), (1, 20, 1, 1), (1, 3, 9, 13), (2, 224, 3, 5)]
LOW_PRECISION_SHAPES = [(1, 3, 9, 13), (2, 20, 3, 5)]
NAMES = {torch.float32: 'fp32', torch.bfloat16: 'bf16', torch.float16: 'fp16'}
CASES = [(shape, torch.float32) for shape in SHAPES] + [
    (shape, dtype) for shape in LOW_PRECISION_SHAPES for dtype in (torch.bfloat16, torch.float16)]
CASE_IDS = [f"{'x'.join(map(str, shape))}-{NAMES[dtype]}" for shape, dtype in CASES]


def channels_last_map(shape, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(shape, device=TRITON_DEVICE).to(dtype).contiguous(memory_format=torch.channels_last)


def conv_parameters(channels: int, kernel_size: int):
    """A (C, 1, k, k) weight with the channels-last strides that the backbone stores, and a (C,) bias, fp32."""
    weight = torch.randn(channels, kernel_size, kernel_size, 1, device=TRITON_DEVICE).permute(0, 3, 1, 2) / 3
    return weight.requires_grad_(), torch.randn(channels, device=TRITON_DEVICE).requires_grad_()


def gated_inputs(shape, dtype, y_dtype):
    """y, and v and o as channel slices of one channels-last (B, 4C, H, W) map, as the attention hands them over."""
    batch, channels, height, width = shape
    qkvo = channels_last_map((batch, 4 * channels, height, width), dtype)
    v, o = (qkvo[:, i * channels:(i + 1) * channels].detach().requires_grad_() for i in (2, 3))
    return channels_last_map(shape, y_dtype).requires_grad_(), v, o


def exact_copies(tensors):
    """fp64 copies on the CPU with NCHW strides (the weight's too): torch's CPU convolutions of channels-last fp64
    maps take seconds."""
    return [t.detach().cpu().double().clone(memory_format=torch.contiguous_format).requires_grad_() for t in tensors]


def residual_reference(x, weight, bias, gelu):
    a = F.gelu(x) if gelu else x
    return a + F.conv2d(a, weight, bias, padding=weight.shape[-1] // 2, groups=x.shape[1])


def gated_reference(y, v, o, weight, bias):
    return (y + F.conv2d(v, weight, bias, padding=weight.shape[-1] // 2, groups=v.shape[1])) * o


def check_against_fp64(op, reference, inputs):
    """op's output and its inputs' gradients against reference's in fp64 on the same values, for a random upstream
    gradient: within 1e-5 of the largest value where the result is fp32, within one rounding of the exact value
    where it is in a lower precision. The output and the maps' gradients are channels-last maps, the weight's
    gradient has the weight's strides, and each gradient its input's dtype."""
    exact_inputs = exact_copies(inputs)
    out = op(*inputs)
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, inputs, grad)
    exact = reference(*exact_inputs)
    exact.backward(grad.cpu().double())
    assert grads[-2].stride() == inputs[-2].stride()
    for ours, expected, like in [(out, exact, out), *zip(grads, (t.grad for t in exact_inputs), inputs)]:
        assert ours.dtype == like.dtype
        if ours.dim() == 4:
            assert ours.is_contiguous(memory_format=torch.channels_last)
        if ours.dtype == torch.float32:
            assert relative_error(ours.cpu(), expected) < 1e-5
        else:
            assert_within_one_rounding(ours.cpu(), expected)


def assert_within_one_rounding(ours, exact):
    """ours is exact rounded to ours' dtype, or a neighbour of that: the fp32 result may lie on the other side of a
    rounding boundary. Near zero, fp32's own error (1e-7 of the terms) may be more than one step of the dtype."""
    expected = exact.to(ours.dtype).double()
    bound = torch.finfo(ours.dtype).eps * expected.abs() + 1e-5 * exact.abs().max()
    assert ((ours.double() - expected).abs() <= bound).all()


@pytest.mark.parametrize('gelu', [False, True], ids=['identity', 'GELU'])
@pytest.mark.parametrize('shape, dtype', CASES, ids=CASE_IDS)
def test_residual_depthwise_conv_matches_fp64(shape, dtype, gelu):
    x = channels_last_map(shape, dtype).requires_grad_()
    check_against_fp64(lambda *args: depthwise_triton.residual_depthwise_conv(*args, gelu),
                       lambda *args: residual_reference(*args, gelu), [x, *conv_parameters(shape[1], 3)])


@pytest.mark.parametrize('shape, dtype', CASES, ids=CASE_IDS)
def test_gated_depthwise_conv_matches_fp64(shape, dtype):
    inputs = [*gated_inputs(shape, dtype, dtype), *conv_parameters(shape[1], 5)]
    check_against_fp64(depthwise_triton.gated_depthwise_conv, gated_reference, inputs)


def test_gated_depthwise_conv_takes_y_in_another_dtype_and_gives_o_dtype():
    inputs = [*gated_inputs((2, 20, 3, 5), torch.float16, torch.float32), *conv_parameters(20, 5)]
    check_against_fp64(depthwise_triton.gated_depthwise_conv, gated_reference, inputs)


def test_a_backward_program_sums_several_tiles(monkeypatch):
    """With 2 rows of partial sums, 65 pixels (3 tiles of 32) make chunks of 2 tiles, the last one past the map."""
    monkeypatch.setattr(depthwise_triton, 'MAX_PARTIAL_ROWS', 2)
    shape = (1, 20, 5, 13)
    x = channels_last_map(shape).requires_grad_()
    assert depthwise_triton.DepthwisePlan(x, torch.empty(20, 1, 3, 3), gpu_of(x)).chunk_grid == (2, 1)
    check_against_fp64(lambda *args: depthwise_triton.residual_depthwise_conv(*args, True),
                       lambda *args: residual_reference(*args, True), [x, *conv_parameters(20, 3)])
    inputs = [*gated_inputs(shape, torch.float32, torch.float32), *conv_parameters(20, 5)]
    check_against_fp64(depthwise_triton.gated_depthwise_conv, gated_reference, inputs)


def test_maps_whose_channels_are_not_adjacent_are_copied_first():
    x = torch.randn(1, 3, 9, 13, device=TRITON_DEVICE).requires_grad_()  # NCHW
    check_against_fp64(lambda *args: depthwise_triton.residual_depthwise_conv(*args, False),
                       lambda *args: residual_reference(*args, False), [x, *conv_parameters(3, 3)])


def test_an_empty_batch_gives_empty_maps_and_zero_parameter_grads():
    x = channels_last_map((0, 20, 3, 4)).requires_grad_()
    weight, bias = conv_parameters(20, 3)
    depthwise_triton.residual_depthwise_conv(x, weight, bias, gelu=True).sum().backward()
    y, v, o = gated_inputs((0, 20, 3, 4), torch.float32, torch.float32)
    depthwise_triton.gated_depthwise_conv(y, v, o, *conv_parameters(20, 5)).sum().backward()
    assert x.grad.shape == y.grad.shape == (0, 20, 3, 4)
    assert not weight.grad.any() and not bias.grad.any()


def test_shapes_are_checked():
    x = channels_last_map((1, 4, 5, 5))
    weight, bias = conv_parameters(4, 3)
    with pytest.raises(ValueError, match='k odd'):
        depthwise_triton.residual_depthwise_conv(x, weight[..., :2, :2], bias, gelu=False)
    with pytest.raises(ValueError, match='one shape'):
        depthwise_triton.gated_depthwise_conv(x, x, x[:, :, :4], weight, bias)


def test_one_launch_a_forward_and_two_a_backward(monkeypatch):
    """Under autocast too: the kernels read the fp32 parameters as they are. The residual op's backward runs into
    its leaves' .grad, where autograd would copy a gradient whose strides differ from its parameter's."""
    record = LaunchRecord(monkeypatch)
    x = channels_last_map((1, 20, 3, 4), torch.bfloat16).requires_grad_()
    weight, bias = conv_parameters(20, 3)
    with torch.autocast(TRITON_DEVICE.type, dtype=torch.bfloat16), record:
        out = depthwise_triton.residual_depthwise_conv(x, weight, bias, gelu=True)
    assert record.take() == ['residual_conv_kernel']
    grad = torch.randn_like(out)
    with record:
        out.backward(grad)
    assert record.take() == ['residual_conv_grad_kernel', 'aten.sum']
    assert weight.grad.stride() == weight.stride() and x.grad.stride() == x.stride()

    # v and o read in place; their gradients are separate maps, which autograd.grad returns as they are
    y, v, o = gated_inputs((1, 20, 3, 4), torch.bfloat16, torch.bfloat16)
    weight, bias = conv_parameters(20, 5)
    with torch.autocast(TRITON_DEVICE.type, dtype=torch.bfloat16), record:
        out = depthwise_triton.gated_depthwise_conv(y, v, o, weight, bias)
    assert record.take() == ['gated_conv_kernel']
    grad = torch.randn_like(out)
    with record:
        grads = torch.autograd.grad(out, (y, v, o, weight, bias), grad)
    assert record.take() == ['gated_conv_grad_kernel', 'aten.sum']
    assert grads[3].stride() == weight.stride()
