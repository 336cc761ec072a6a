"""Inputs at the edges, where the Triton operators give what their torch operators give: eps = 0, an empty batch,
stochastic-depth factors expanded from one value (stride 0), a qkvo map expanded over the batch (whose elements
overlap), and more heads than a grid's second axis takes; and what they refuse, as the torch operators do or with
what to do instead: q, k, v or tables of mismatched shapes, and maps beyond the kernels' int32 offsets.

The kernels run on the GPU where there is one, else on the CPU in Triton's interpreter (tests/conftest.py).
"""
import pytest
import torch

from mala_mm.models.layers import RoPE2d
from mala_mm.ops import OPERATORS as OPERATOR_IMPLEMENTATIONS
from mala_mm.ops import TRITON_AVAILABLE
from mala_mm.ops.depthwise import gated_depthwise_conv, residual_depthwise_conv
from mala_mm.ops.mala_attention import mala_attention
from mala_mm.ops.residual import scaled_residual, scaled_residual_norm
from mala_mm.ops.rope import rotate_qk
from tests.helpers.low_precision import IMPL_MARKS, TRITON_DEVICE

if TRITON_AVAILABLE:  # a Triton the kernels run on; else IMPL_MARKS skips these tests
    from mala_mm.ops.mala_attention.triton_ops import AttentionPlan
    from mala_mm.ops.triton_launch import MAX_GRID_YZ, MapTooLarge, check_grid, check_offsets
else:
    AttentionPlan = None

pytestmark = IMPL_MARKS['triton']


def leaves(*shapes, channels_last=False):
    tensors = [torch.randn(shape, device=TRITON_DEVICE) for shape in shapes]
    if channels_last:
        tensors = [t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t for t in tensors]
    return [t.requires_grad_() for t in tensors]


def outputs_and_gradients(operator, inputs, impl):
    """The operator's outputs and the gradients of a fixed random projection of them, in ``impl``."""
    outputs = operator(*inputs, impl)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    generator = torch.Generator().manual_seed(1)
    loss = sum((out.float() * torch.randn(out.shape, generator=generator).to(out.device)).sum() for out in outputs)
    return outputs, torch.autograd.grad(loss, inputs, allow_unused=True, materialize_grads=True)


def assert_same_as_torch(operator, inputs, rtol=1e-5, atol=1e-5):
    expected = outputs_and_gradients(operator, inputs, 'torch')
    ours = outputs_and_gradients(operator, inputs, 'triton')
    for a, b in zip([*ours[0], *ours[1]], [*expected[0], *expected[1]]):
        assert a.shape == b.shape
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.float(), b.float(), rtol=rtol, atol=atol)


def test_mala_attention_with_eps_zero_is_finite_as_in_torch():
    """20 tokens, not a whole number of tiles: the rows past the last token have z = 0, and 1 / z must not reach
    the state's gradient."""
    inputs = leaves(*[(2, 2, 20, 12)] * 3)
    tables = RoPE2d(12).to(TRITON_DEVICE).tables(4, 5)
    assert_same_as_torch(lambda q, k, v, impl: mala_attention(q, k, v, tables, 0.0, impl), inputs)


C, SIZE = 32, (5, 7)


def centre_tap(weight):
    tap = torch.zeros_like(weight)
    tap[..., weight.shape[-2] // 2, weight.shape[-1] // 2] = 1
    return tap.detach()


OPERATORS = {
    'mala_attention': (lambda q, k, v, impl: mala_attention(q, k, v, None, 1e-6, impl), [(0, 2, 20, 16)] * 3),
    'rotate_qk': (lambda qkvo, impl: rotate_qk(qkvo.clone(), RoPE2d(16).to(TRITON_DEVICE).tables(4, 5), 2, impl),
                  [(0, 4 * 32, 4, 5)]),
    'residual_depthwise_conv': (lambda x, w, b, impl: residual_depthwise_conv(x, w, b, True, centre_tap(w), impl),
                                [(0, C, *SIZE), (C, 1, 3, 3), (C,)]),
    'gated_depthwise_conv': (gated_depthwise_conv, [(0, C, *SIZE)] * 3 + [(C, 1, 5, 5), (C,)]),
    'scaled_residual': (lambda x, b, g, impl: scaled_residual(x, b, g, None, impl),
                        [(0, C, *SIZE), (0, C, *SIZE), (1, C, 1, 1)]),
    'scaled_residual_norm': (lambda x, b, g, w, bias, impl: scaled_residual_norm(x, b, g, None, w, bias, 1e-6,
                                                                                 impl=impl),
                             [(0, C, *SIZE), (0, C, *SIZE), (1, C, 1, 1), (C,), (C,)]),
}


@pytest.mark.parametrize('name', OPERATORS)
def test_an_empty_batch_gives_what_torch_gives(name):
    operator, shapes = OPERATORS[name]
    assert_same_as_torch(operator, leaves(*shapes, channels_last=True))


@pytest.mark.parametrize('norm', [False, True], ids=['residual', 'residual and norm'])
def test_expanded_stochastic_depth_factors_are_read_as_their_values(norm):
    """One factor expanded over the batch has stride 0: read as a dense (B,) vector it would run past its one
    value."""
    factors = torch.tensor([0.0, 2.0], device=TRITON_DEVICE)[1:].view(1, 1, 1, 1).expand(3, 1, 1, 1)
    inputs = leaves((3, C, *SIZE), (3, C, *SIZE), (1, C, 1, 1), (C,), (C,), channels_last=True)

    def with_norm(x, branch, gamma, weight, bias, impl):
        return scaled_residual_norm(x, branch, gamma, factors, weight, bias, 1e-6, impl=impl)

    def without_norm(x, branch, gamma, impl):
        return scaled_residual(x, branch, gamma, factors, impl)
    if norm:
        assert_same_as_torch(with_norm, inputs)
    else:
        assert_same_as_torch(without_norm, inputs[:3])


def test_more_heads_than_a_grid_axis_takes_go_on_one_axis():
    """CUDA caps a grid's second and third axes at 65,535; the attention's programs are on the first."""
    q = torch.empty(70000, 2, 100, 64, device='meta')
    plan = AttentionPlan(q, None, None)
    assert len(plan.chunk_grid()) == 1 and plan.chunk_grid()[0] >= 140000
    assert all(len(plan.tile_grid(kernel)) == 1 for kernel in plan.options)
    check_grid('kernel', plan.chunk_grid())
    with pytest.raises(ValueError, match='65535'):
        check_grid('kernel', (1, MAX_GRID_YZ + 1))


def test_rotate_qk_writes_a_map_whose_elements_overlap_through_a_copy():
    """A map expanded over the batch (stride 0): rotating q and k in place would rotate the one memory twice, once
    for each batch item's program (a race on a GPU). The kernel takes a copy, as for other layouts, and leaves the
    expanded map as it was."""
    one = torch.randn(1, 128, 3, 5).contiguous(memory_format=torch.channels_last).to(TRITON_DEVICE)
    expanded = one.expand(3, -1, -1, -1)
    before = one.clone()
    ours = rotate_qk(expanded, RoPE2d(32).to(TRITON_DEVICE).tables(3, 5), 1, 'triton')
    expected = rotate_qk(expanded.cpu().contiguous(), RoPE2d(32).tables(3, 5), 1, 'torch')
    for a, b in zip(ours, expected):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-6, atol=1e-6)
    assert torch.equal(one, before)


@pytest.mark.parametrize('change', ['k heads', 'v tokens', 'q not 4-D', 'tables'])
def test_mismatched_attention_shapes_get_the_torch_operators_error(change):
    q, k, v = (torch.randn(2, 2, 12, 8, device=TRITON_DEVICE) for _ in range(3))
    rope = None
    if change == 'k heads':
        k = k[:, :1]  # the torch operators broadcast it without a word
    elif change == 'v tokens':
        v = v[:, :, :10]
    elif change == 'q not 4-D':
        q = q[0]
    else:
        rope = RoPE2d(8).to(TRITON_DEVICE).tables(3, 5)  # 15 tokens' tables for 12 tokens
    errors = []
    for impl in ('torch', 'triton'):
        with pytest.raises(ValueError, match='mala_attention: ') as raised:
            mala_attention(q, k, v, rope, impl=impl)
        errors.append(str(raised.value))
    with pytest.raises(ValueError) as raised:  # the Triton entry, as a launcher is called
        OPERATOR_IMPLEMENTATIONS['mala_attention'].triton(q, k, v, rope)
    assert errors[0] == errors[1] == str(raised.value)


def test_a_value_width_other_than_the_heads_is_the_torch_operators_alone():
    """v of another head width: the torch operators compute it (the attention-insight tool takes the scores so),
    the kernels say that they cannot."""
    q, k = (torch.randn(1, 2, 12, 8, device=TRITON_DEVICE) for _ in range(2))
    v = torch.randn(1, 2, 12, 12, device=TRITON_DEVICE)
    assert mala_attention(q, k, v, impl='torch').shape == (1, 2, 12, 12)
    with pytest.raises(ValueError, match=r"the Triton kernels take v of q's shape .*impl='torch' takes another"):
        mala_attention(q, k, v, impl='triton')


def test_a_map_beyond_int32_offsets_is_refused_with_what_to_do():
    """2^31 elements and more, on the meta device (no memory): the launch stops before the kernel would address
    them wrongly."""
    x = torch.empty(2, 64, 4096, 4096, device='meta').contiguous(memory_format=torch.channels_last)
    weight, bias = torch.empty(64, 1, 3, 3, device='meta'), torch.empty(64, device='meta')
    with pytest.raises(MapTooLarge, match=r"residual_conv_kernel: a map of shape \(2, 64, 4096, 4096\) spans "
                                          r"2,147,483,648 elements.*use a smaller batch, or impl='torch'"):
        OPERATOR_IMPLEMENTATIONS['residual_depthwise_conv'].triton(x, weight, bias, False)
    memory = torch.empty(2 ** 31, device='meta')
    check_offsets('kernel', [memory[:-1], memory[:-1].expand(4, -1)])  # 2^31 - 1 elements, some read 4 times
    with pytest.raises(MapTooLarge, match=r'spans 2,147,483,649 elements'):  # strided: fewer values than it spans
        check_offsets('kernel', [memory.as_strided((2, 2), (2 ** 30, 2 ** 30))])
