"""mala_mm.ops.residual: a block's residual branch with its layer scale and stochastic depth, and its gradients."""
import torch

from mala_mm.ops.residual import drop_path_factors, scaled_residual


def _inputs(dtype=torch.float64):
    x = torch.randn(4, 6, 5, 7, dtype=dtype).contiguous(memory_format=torch.channels_last).requires_grad_()
    branch = torch.randn(4, 6, 5, 7, dtype=dtype).contiguous(memory_format=torch.channels_last).requires_grad_()
    gamma = torch.randn(1, 6, 1, 1, dtype=dtype, requires_grad=True)
    return x, branch, gamma


def test_value_and_gradients_with_and_without_stochastic_depth():
    x, branch, gamma = _inputs()
    factors = torch.tensor([0., 2., 2., 0.], dtype=torch.float64).view(4, 1, 1, 1)
    for f in (factors, None):
        expected = x + (1 if f is None else f) * gamma * branch
        assert torch.allclose(scaled_residual(x, branch, gamma, f), expected, rtol=0, atol=1e-14)
        assert torch.autograd.gradcheck(lambda *args: scaled_residual(*args, f), (x, branch, gamma))


def test_a_low_precision_branch_gets_its_gradient_in_its_dtype():
    x, branch, gamma = _inputs(torch.float32)
    low = branch.detach().bfloat16().requires_grad_()
    factors = drop_path_factors(torch.tensor([0.5]), 4)[0]
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = scaled_residual(x, low, gamma, factors)
    assert out.dtype == torch.float32
    out.backward(torch.ones_like(out))
    assert low.grad.dtype == torch.bfloat16 and low.grad.stride() == low.stride()
    assert torch.equal(low.grad, (gamma * factors).expand_as(out).bfloat16())
    assert torch.allclose(gamma.grad.flatten(), (factors * low.float()).sum((0, 2, 3)), rtol=1e-6)


def test_drop_path_factors_drop_whole_samples_and_keep_the_mean_of_each_branch():
    keep_probs = torch.tensor([0.75, 1.0, 0.5], dtype=torch.float64)
    factors = drop_path_factors(keep_probs, 20000)
    assert factors.shape == (3, 20000, 1, 1, 1) and factors.dtype == torch.float64
    for row, keep in zip(factors, keep_probs.tolist()):
        assert torch.equal(row.unique(), torch.tensor([0, 1 / keep] if keep < 1 else [1.], dtype=torch.float64))
        assert abs(row.mean().item() - 1) < 0.03
