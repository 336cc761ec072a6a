"""mala_mm.ops.rope: rotate_pair in each implementation against the naive rotation in fp64, the kernel's launches,
and the naive rotation against the spec's complex multiplication."""
import pytest
import torch

from tests.helpers.launches import LaunchRecord
from tests.helpers.low_precision import (IMPL_MARKS, assert_matches_fp64, device_of, fp64_copies, impl_dtypes,
                                         implementation, outputs_and_gradients)
from mala_mm.models.layers import RoPE2d
from mala_mm.ops.rope import naive

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
HEIGHT, WIDTH, HEADS, HEAD_DIMS = 5, 7, 2, 12


def strided_pair(dtype, device):
    """q and k as the skeleton hands them over: the heads of two channel slices of one channels-last map."""
    qk = torch.randn(2, 2 * HEADS * HEAD_DIMS, HEIGHT, WIDTH, device=device).to(dtype)
    qk = qk.contiguous(memory_format=torch.channels_last)
    return [t.permute(0, 2, 3, 1).reshape(2, HEIGHT * WIDTH, HEADS, HEAD_DIMS).transpose(1, 2).requires_grad_()
            for t in qk.detach().chunk(2, dim=1)]


@pytest.mark.parametrize('impl, dtype', impl_dtypes([torch.float64, *FLOATS], FLOATS))
def test_rotate_pair_matches_naive_in_fp64(impl, dtype):
    """Within one rounding to the features' dtype: the arithmetic is fp32 (fp64 for fp64 features)."""
    device = device_of(impl)
    inputs = [*strided_pair(dtype, device), RoPE2d(HEAD_DIMS).to(device).tables(HEIGHT, WIDTH, dtype)]
    outputs, grads, weights = outputs_and_gradients(implementation('rotate_pair', impl), inputs)
    exact, exact_grads, _ = outputs_and_gradients(naive.rotate_pair, fp64_copies(inputs), weights)
    for name, ours, expected in zip(['q', 'k', 'grad q', 'grad k'], [*outputs, *grads], [*exact, *exact_grads]):
        assert ours.dtype == dtype, name
        assert_matches_fp64(ours, expected, name)


@IMPL_MARKS['triton']
def test_the_kernel_takes_one_launch_a_pass_and_lays_out_channels_last_maps(monkeypatch):
    """q and k read in place and rotated together; the results are (B, N, h, d) in memory, as flash attention
    reads them."""
    record = LaunchRecord(monkeypatch)
    device = device_of('triton')
    q, k = strided_pair(torch.float32, device)
    tables = RoPE2d(HEAD_DIMS).to(device).tables(HEIGHT, WIDTH)
    with record:
        outputs = implementation('rotate_pair', 'triton')(q, k, tables)
    assert record.take() == ['rotate_pair_kernel']
    assert all(out.transpose(1, 2).is_contiguous() for out in outputs)
    grads = [torch.randn_like(out) for out in outputs]
    with record:
        torch.autograd.grad(outputs, (q, k), grads)
    assert record.take() == ['rotate_pair_kernel']


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
