"""mala_mm.ops.conv2d: the convolution as one operator inside a compiled graph, under autocast and across sizes; the
1x1 conv as dense chunks with one conv's backward."""
import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from mala_mm.ops.conv2d import conv1x1_chunks, conv2d
from tests.helpers import NEEDS_CUSTOM_OPS
from tests.helpers.launches import LaunchRecord
from tests.helpers.low_precision import DTYPES


@pytest.fixture(autouse=True)
def fresh_compiler():
    """Graphs counted are this test's own."""
    torch.compiler.reset()


def conv_parameters(in_channels: int, out_channels: int):
    weight = torch.randn(out_channels, in_channels, 3, 3) / 5
    return weight.requires_grad_(), torch.randn(out_channels).requires_grad_()


@pytest.mark.parametrize('dtype', DTYPES)
def test_compiled_convolution_follows_autocast(dtype):
    """conv2d inside a compiled graph runs in autocast's dtype, as ``F.conv2d`` does in eager, gradients included."""
    weight, bias = conv_parameters(8, 16)
    x = torch.randn(2, 8, 12, 20, requires_grad=True)

    def convolve(t):
        return conv2d(t, weight, bias, (2, 2), (1, 1))

    def step(forward):
        out = forward(x)
        return out, torch.autograd.grad(out.float().square().sum(), [x, weight, bias])

    with torch.autocast('cpu', dtype=dtype):
        compiled_out, compiled_grads = step(torch.compile(convolve, backend='aot_eager', fullgraph=True))
        eager_out, eager_grads = step(convolve)
    assert compiled_out.dtype == eager_out.dtype == dtype
    torch.testing.assert_close(compiled_out, eager_out)
    for ours, expected in zip(compiled_grads, eager_grads):
        assert ours.dtype == expected.dtype == torch.float32
        torch.testing.assert_close(ours, expected)


@NEEDS_CUSTOM_OPS
def test_compiled_convolution_keeps_one_graph_across_sizes():
    """The operator's compile-time result comes from the shapes alone: ``F.conv2d`` on fake tensors picks its kernel
    by the input's size, which guarded the size (on this CPU ``3 H W > 20480`` for a 3-channel input) and compiled
    one graph more."""
    weight, bias = conv_parameters(3, 8)

    def convolve(t):
        return conv2d(t, weight, bias, (2, 2), (1, 1))
    compiled = torch.compile(convolve, backend='aot_eager', dynamic=True, fullgraph=True)
    counters.clear()
    for height, width in ((64, 96), (128, 192)):  # 3 H W: 18432, then 73728
        x = torch.randn(1, 3, height, width)
        torch.testing.assert_close(compiled(x), F.conv2d(x, weight, bias, 2, 1))
    assert counters['stats']['unique_graphs'] == 1


def chunk_inputs(dtype=torch.float32):
    x = torch.randn(2, 12, 5, 7, dtype=dtype).contiguous(memory_format=torch.channels_last).requires_grad_()
    weight = torch.randn(4 * 8, 12, 1, 1, dtype=dtype) / 4
    return x, weight.requires_grad_(), torch.randn(32, dtype=dtype).requires_grad_()


def test_conv1x1_chunks_are_the_conv_and_its_gradients_those_of_one_conv(monkeypatch):
    """In fp64, the four maps the whole conv's channel slices, dense, and the gradients of a loss that weighs each map
    differently those of the whole conv; the backward one conv backward after the gradients side by side."""
    x, weight, bias = chunk_inputs(torch.float64)
    record = LaunchRecord(monkeypatch)
    with record:
        maps = conv1x1_chunks(x, weight, bias, 4)
    assert record.take() == ['aten.convolution'] * 4
    expected = F.conv2d(x, weight, bias).chunk(4, dim=1)
    weights = [torch.randn_like(m) for m in maps]
    loss = sum((m * w).sum() for m, w in zip(maps, weights))
    with record:
        grads = torch.autograd.grad(loss, (x, weight, bias))
    assert record.take()[-2:] == ['aten.cat', 'aten.convolution_backward']
    expected_grads = torch.autograd.grad(sum((m * w).sum() for m, w in zip(expected, weights)), (x, weight, bias))
    for ours, theirs in zip([*maps, *grads], [*expected, *expected_grads]):
        torch.testing.assert_close(ours, theirs)
    assert all(m.is_contiguous(memory_format=torch.channels_last) for m in maps)


@pytest.mark.parametrize('dtype', DTYPES)
def test_conv1x1_chunks_cast_x_once_under_autocast(dtype):
    """One cast of x, kept for the backward, where four convs would cast and keep four; values as autocast's."""
    x, weight, bias = chunk_inputs()
    saved = []
    with torch.autocast('cpu', dtype=dtype):
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            maps = conv1x1_chunks(x, weight, bias, 4)
        expected = [F.conv2d(x, w, b) for w, b in zip(weight.chunk(4), bias.chunk(4))]
    assert [t.dtype for t in saved if t.shape == x.shape] == [dtype]
    for ours, theirs in zip(maps, expected):
        assert ours.dtype == dtype
        torch.testing.assert_close(ours, theirs)
    sum(m.float().sum() for m in maps).backward()
    assert x.grad.dtype == torch.float32 and weight.grad.dtype == torch.float32
