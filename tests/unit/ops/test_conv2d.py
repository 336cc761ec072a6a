"""mala_mm.ops.conv2d: the convolution as one operator inside a compiled graph, under autocast and across sizes."""
import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from tests.helpers.low_precision import DTYPES
from mala_mm.ops.conv2d import conv2d


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
