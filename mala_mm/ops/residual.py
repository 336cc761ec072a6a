"""A block's residual branch added back with its layer scale and stochastic depth: ``x + keep * gamma * branch``.

mmcv's DropPath and the layer scale take seven operators in the forward and five in the backward of each branch
(the scale's product, the draw and its rounding, the division by the keep probability, the product with the mask,
the addition). :func:`scaled_residual` takes four and four: the draw of the per-sample factor (two), their
product with gamma, one ``addcmul``; in the backward, the branch's gradient in one product written in the branch's
dtype, and gamma's as a sum over the batch weighted by the factors.
"""
from typing import Optional

import torch
from torch import Tensor


def drop_path_factors(batch: int, drop_prob: float, like: Tensor) -> Tensor:
    """DropPath's per-sample factors: 0 with probability ``drop_prob``, else ``1 / (1 - drop_prob)``, a
    (batch, 1, 1, 1) tensor of the dtype and device of ``like`` (the layer scale, whose product they join)."""
    keep_prob = 1 - drop_prob
    return like.new_empty((batch, 1, 1, 1)).bernoulli_(keep_prob).div_(keep_prob)


class _ScaledResidual(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor]) -> Tensor:
        # the mixed precisions of x (the residual stream) and branch (autocast's) promote inside addcmul, as autocast
        # would cast the branch for it, without a launch of their own
        with torch.autocast(x.device.type, enabled=False):
            scale = gamma if factors is None else gamma * factors
            ctx.save_for_backward(branch, scale, factors)
            return torch.addcmul(x, branch, scale)

    @staticmethod
    def backward(ctx, grad: Tensor):
        branch, scale, factors = ctx.saved_tensors
        grad_branch = grad_gamma = None
        if ctx.needs_input_grad[1]:
            grad_branch = torch.mul(grad, scale, out=torch.empty_like(branch))
        if ctx.needs_input_grad[2]:
            if factors is None:
                grad_gamma = (grad * branch).sum((0, 2, 3))
            else:  # sum_b factor_b sum_hw grad * branch
                grad_gamma = factors.flatten() @ (grad * branch).sum((2, 3))
            grad_gamma = grad_gamma.view(scale.shape[1:]).unsqueeze(0)
        return grad, grad_branch, grad_gamma, None


def scaled_residual(x: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor] = None) -> Tensor:
    """``x + factors * gamma * branch``.

    Args:
        x: (B, C, H, W), the residual stream.
        branch: (B, C, H, W), what the branch computed (it may be in autocast's lower precision).
        gamma: (1, C, 1, 1) layer scale.
        factors: (B, 1, 1, 1) per-sample factors of stochastic depth (:func:`drop_path_factors`), or None.

    Returns:
        (B, C, H, W) in the promoted dtype of x and branch.
    """
    return _ScaledResidual.apply(x, branch, gamma, factors)
