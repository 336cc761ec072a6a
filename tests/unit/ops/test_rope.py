"""mala_mm.ops.rope: rotate_qk in each implementation against the naive rotation in fp64, the kernel's launches,
and the naive rotation against the spec's complex multiplication."""
import pytest
import torch

from mala_mm.models.layers import RoPE2d
from mala_mm.ops.rope import naive
from tests.helpers.launches import LaunchRecord
from tests.helpers.low_precision import (NEEDS_TRITON, assert_matches_fp64, device_of, fp64_copies, impl_dtypes,
                                         implementation, outputs_and_gradients)

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
HEIGHT, WIDTH, HEADS, HEAD_DIMS = 5, 7, 2, 12


def qkvo_map(dtype, device):
    """The qkvo projection's (B, 4C, H, W) map, channels-last, as a leaf that requires grad."""
    qkvo = torch.randn(2, 4 * HEADS * HEAD_DIMS, HEIGHT, WIDTH, device=device).to(dtype)
    return qkvo.contiguous(memory_format=torch.channels_last).requires_grad_()


def rotate_copy(impl):
    """The implementation on a copy of the map, which the kernel may overwrite."""
    return lambda qkvo, tables: implementation('rotate_qk', impl)(qkvo.clone(), tables, HEADS)


@pytest.mark.parametrize('impl, dtype', impl_dtypes([torch.float64, *FLOATS], FLOATS))
def test_rotate_qk_matches_naive_in_fp64(impl, dtype):
    """Within one rounding to the map's dtype: the arithmetic is fp32 (fp64 for an fp64 map)."""
    device = device_of(impl)
    inputs = [qkvo_map(dtype, device), RoPE2d(HEAD_DIMS).to(device).tables(HEIGHT, WIDTH, dtype)]
    outputs, grads, weights = outputs_and_gradients(rotate_copy(impl), inputs)
    exact, exact_grads, _ = outputs_and_gradients(lambda qkvo, tables: naive.rotate_qk(qkvo, tables, HEADS),
                                                  fp64_copies(inputs), weights)
    for name, ours, expected in zip(['q', 'k', 'v', 'o', 'grad qkvo'], [*outputs, *grads], [*exact, *exact_grads]):
        assert ours.dtype == dtype, name
        assert_matches_fp64(ours, expected, name)


@NEEDS_TRITON
def test_the_kernel_rotates_in_the_map_in_one_launch_a_pass(monkeypatch):
    """q and k rotated in place: every output is a view of the map. The backward's one launch also writes v's and
    o's gradients into the map's, which the chunks' concatenation would write in a launch of its own."""
    record = LaunchRecord(monkeypatch)
    device = device_of('triton')
    leaf = qkvo_map(torch.float32, device)
    qkvo = leaf.clone()
    tables = RoPE2d(HEAD_DIMS).to(device).tables(HEIGHT, WIDTH)
    with record:
        outputs = implementation('rotate_qk', 'triton')(qkvo, tables, HEADS)
    assert record.take() == ['rotate_qk_kernel']
    assert all(out.untyped_storage().data_ptr() == qkvo.untyped_storage().data_ptr() for out in outputs)
    torch.testing.assert_close(outputs[0], naive.rotate_qk(leaf.detach(), tables, HEADS)[0])
    grads = [torch.randn_like(out) for out in outputs]
    with record:
        torch.autograd.grad(outputs, leaf, grads)
    assert record.take() == ['rotate_qk_kernel']


@NEEDS_TRITON
def test_the_kernel_refuses_a_leaf_and_a_map_saved_before_it():
    """It overwrites q and k: a leaf that requires grad is refused, as torch refuses an in-place operator on one,
    and an operator that saved the map before fails its backward rather than compute with the rotated values."""
    device = device_of('triton')
    leaf = qkvo_map(torch.float32, device)
    tables = RoPE2d(HEAD_DIMS).to(device).tables(HEIGHT, WIDTH)
    with pytest.raises(ValueError, match='leaf'):
        implementation('rotate_qk', 'triton')(leaf, tables, HEADS)
    qkvo = leaf * 1
    squares = qkvo * qkvo
    implementation('rotate_qk', 'triton')(qkvo, tables, HEADS)
    with pytest.raises(RuntimeError, match='modified by an inplace operation'):
        squares.sum().backward()


def test_naive_rotation_is_the_complex_product_by_the_spec_angles():
    """Each channel pair ``(x_2m, x_2m+1)`` as the complex number ``x_2m + i x_2m+1``, turned by ``e^(i theta)``:
    the first half of a head's pairs by the token's row times the frequencies ``10000^-(f / (F - 1))``, F = d / 4,
    the second half by its column; with RoPE2d's tables of the map (angles in fp32: 1e-7 apart)."""
    head_dims = 16
    frequencies = 1 / 10000 ** (torch.arange(head_dims // 4, dtype=torch.float64) / (head_dims // 4 - 1))
    rows, columns = torch.meshgrid(torch.arange(HEIGHT, dtype=torch.float64),
                                   torch.arange(WIDTH, dtype=torch.float64), indexing='ij')
    theta = torch.cat([rows.reshape(-1, 1) * frequencies, columns.reshape(-1, 1) * frequencies], dim=-1)
    x = torch.randn(2, 3, HEIGHT * WIDTH, head_dims, dtype=torch.float64)
    expected = torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (-1, 2))) * torch.polar(
        torch.ones_like(theta), theta)).flatten(-2)
    tables = RoPE2d(head_dims).tables(HEIGHT, WIDTH, torch.float64)
    assert all(t.shape == (HEIGHT * WIDTH, head_dims) and t.dtype == torch.float64 for t in tables)
    torch.testing.assert_close(naive.apply_rope(x, tables), expected)


@NEEDS_TRITON
def test_the_kernel_takes_the_gradients_of_some_outputs_only():
    """Where the loss reads q and k alone (v and o get no gradient), the map's gradient is zero at v and o."""
    device = device_of('triton')
    leaf = qkvo_map(torch.float32, device)
    tables = RoPE2d(HEAD_DIMS).to(device).tables(HEIGHT, WIDTH)
    q, k, _, _ = implementation('rotate_qk', 'triton')(leaf.clone(), tables, HEADS)
    grad, = torch.autograd.grad((q * k).sum(), leaf)
    exact_leaf, exact_tables = fp64_copies([leaf, tables])
    q, k, _, _ = naive.rotate_qk(exact_leaf, exact_tables, HEADS)
    exact, = torch.autograd.grad((q * k).sum(), exact_leaf)
    assert_matches_fp64(grad, exact)
    assert not grad[:, 2 * HEADS * HEAD_DIMS:].any()
