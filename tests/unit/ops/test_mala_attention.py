"""mala_mm.ops.mala_attention: each implementation against the naive formula in fp64, the kernels' plans and launches,
and the formula's own properties."""
import pytest
import torch

from mala_mm.models.layers import RoPE2d
from mala_mm.ops.mala_attention import naive
from tests.helpers.launches import LaunchRecord
from tests.helpers.low_precision import (NEEDS_TRITON, TOLERANCES, TRITON_DEVICE, assert_matches_fp64, device_of,
                                         fp64_copies, impl_dtypes, implementation, outputs_and_gradients)

# (batch, heads, height, width, head width): a padded head width (d = 12, 96), token counts that are not a multiple
# of the tile, a single token, several batch items and heads, and a chunked reduction (more tiles than one program
# takes)
SHAPES = [(2, 3, 5, 7, 8), (1, 2, 9, 11, 96), (2, 1, 12, 20, 64), (1, 1, 1, 1, 4), (1, 2, 40, 50, 12)]


def shape_id(shape):
    return 'x'.join(map(str, shape))


def attention_inputs(batch, heads, height, width, head_dims, with_rope, dtype=torch.float32, device=TRITON_DEVICE):
    """q, k, v requiring gradients, and the RoPE tables of the map or None."""
    qkv = [torch.randn(batch, heads, height * width, head_dims, dtype=dtype, device=device).requires_grad_()
           for _ in range(3)]
    return [*qkv, RoPE2d(head_dims).to(device).tables(height, width, dtype) if with_rope else None]


def check_against_naive(fn, inputs, dtype):
    """fn's output and the gradients of q, k and v against the naive formula's in fp64 on the same values, each
    gradient relative to its largest value; for a single token relative to the largest of the three: its dq and dk
    are ~1e-7 of its dv, since its output z / (z + eps) v hardly depends on q and k, and are rounding errors of that
    size in fp32."""
    outputs, grads, weights = outputs_and_gradients(fn, inputs)
    exact, exact_grads, _ = outputs_and_gradients(naive.mala_attention, fp64_copies(inputs), weights)
    assert outputs[0].dtype == dtype
    assert_matches_fp64(outputs[0], exact[0])
    largest = max(grad.abs().max().item() for grad in exact_grads)
    for name, grad, expected in zip('qkv', grads, exact_grads):
        assert grad.dtype == dtype, name
        scale = largest if expected.shape[-2] == 1 else expected.abs().max().item()
        assert (grad.cpu().double() - expected).abs().max().item() < TOLERANCES[dtype] * scale, name


@pytest.mark.parametrize('with_rope', [False, True], ids=['no RoPE', 'RoPE'])
@pytest.mark.parametrize('shape', SHAPES, ids=shape_id)
@pytest.mark.parametrize('impl, dtype', impl_dtypes([torch.float64, torch.float32], [torch.float32]))
def test_matches_naive_in_fp64(impl, dtype, shape, with_rope):
    inputs = attention_inputs(*shape, with_rope, dtype, device_of(impl))
    check_against_naive(implementation('mala_attention', impl), inputs, dtype)


@NEEDS_TRITON
@pytest.mark.parametrize('arch', [80, 86, 89, 90], ids=lambda arch: f'sm_{arch}')
def test_each_gpus_plan_matches_naive(arch, monkeypatch):
    """The tiles each GPU's plan takes (the interpreter's own are larger), heads of 64 and of 96 channels (three
    blocks of 32), with RoPE: 7 x 9 tokens cross tiles of 16 and 32, and the tiles cross a chunk's end."""
    from mala_mm.ops.mala_attention import triton_ops
    from mala_mm.ops.triton_launch import GPU
    monkeypatch.setattr(triton_ops, 'gpu_of', lambda t: GPU.of_arch(arch))
    monkeypatch.setattr(triton_ops, 'TARGET_PROGRAMS', 4)  # a head's tokens in two chunks
    for head_dims in (64, 96):
        check_against_naive(implementation('mala_attention', 'triton'),
                            attention_inputs(1, 2, 7, 9, head_dims, with_rope=True), torch.float32)


@NEEDS_TRITON
@pytest.mark.parametrize('with_rope', [False, True], ids=['no RoPE', 'RoPE'])
def test_the_kernels_take_two_launches_a_pass_and_lay_out_a_channels_last_map(with_rope, monkeypatch):
    """The state's reduction and the output in the forward, the queries' and the keys' and values' gradients in the
    backward, each reduction's partial sums added in one launch of torch's; the output is (B, N, h, d) in memory,
    which the skeleton views as a (B, C, H, W) map."""
    record = LaunchRecord(monkeypatch)
    *qkv, tables = attention_inputs(2, 3, 4, 5, 8, with_rope)
    with record:
        out = implementation('mala_attention', 'triton')(*qkv, tables)
    assert record.take() == ['state_kernel', 'aten.sum', 'output_kernel']
    assert out.transpose(1, 2).is_contiguous()
    grad = torch.randn_like(out)
    with record:
        torch.autograd.grad(out, qkv, grad)
    assert record.take() == ['query_grad_kernel', 'aten.sum', 'key_value_grad_kernel']


def test_naive_phi_is_elu_plus_one():
    x = torch.linspace(-20, 5, 101, dtype=torch.float64)
    torch.testing.assert_close(naive.phi(x), torch.where(x > 0, x + 1, x.exp()))


def test_naive_rows_sum_to_one_without_rope_and_not_with_it():
    """Without RoPE a row sums to ``z / (z + eps)``; z uses the un-rotated features, as released, so with RoPE the
    identity no longer holds."""
    *qkv, tables = attention_inputs(2, 3, 5, 7, 8, with_rope=True, dtype=torch.float64, device=torch.device('cpu'))
    q, k, _ = qkv
    row_sums = naive.mala_scores(q, k).sum(-1)
    torch.testing.assert_close(row_sums, torch.ones_like(row_sums), rtol=0, atol=1e-5)
    assert (naive.mala_scores(q, k, tables).sum(-1) - 1).abs().max() > 1e-3
