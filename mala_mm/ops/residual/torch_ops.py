"""A block's residual branch added back with its layer scale and stochastic depth, ``x + keep * gamma * branch``, in
torch operators.

mmcv's DropPath and the layer scale take seven operators in the forward and five in the backward of each branch
(the scale's product, the draw and its rounding, the division by the keep probability, the product with the mask,
the addition). Here it takes two and four, the per-sample factors drawn apart (:func:`~.drop_path_factors`):
their product with gamma and one ``addcmul``; in the backward, the branch's gradient in one product written in the
branch's dtype, and gamma's as a sum over the batch weighted by the factors.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..torch_compat import compiling_to_run


class ScaledResidual(torch.autograd.Function):

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
    """``x + factors * gamma * branch`` in the promoted dtype of x, branch and gamma."""
    return ScaledResidual.apply(x, branch, gamma, factors)


def scaled_residual_norm(x: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor], weight: Tensor,
                         bias: Tensor, eps: float, as_output: bool = False) -> Tuple[Tensor, Tensor]:
    """:func:`scaled_residual` and torch's LayerNorm of its result over the channels."""
    out = ScaledResidual.apply(x, branch, gamma, factors)
    normed = F.layer_norm(out.permute(0, 2, 3, 1), weight.shape, weight, bias, eps).permute(0, 3, 1, 2)
    return out, (normed.contiguous() if as_output else normed)


def layer_norm_2d(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """LayerNorm over the channels of a (B, C, H, W) map, with (C,) weight and bias: torch's over the channels-last
    view, or inside a graph torch.compile runs, the same normalisation written over dim 1 for the compiler to fuse
    (the permuted view, saved for the backward, is a graph output whose symbolic strides inductor cannot order
    under dynamic sizes)."""
    if compiling_to_run():
        mean = x.mean(1, keepdim=True)
        centred = x - mean
        variance = centred.square().mean(1, keepdim=True)
        return torch.addcmul(bias[:, None, None], centred, weight[:, None, None] * torch.rsqrt(variance + eps))
    return F.layer_norm(x.permute(0, 2, 3, 1), weight.shape, weight, bias, eps).permute(0, 3, 1, 2)


def add_branch_in_graph(x: Tensor, branch: Tensor, gamma: Optional[Tensor], keep_prob: Optional[float],
                        factors: Optional[Tensor]) -> Tensor:
    """``x + DropPath(gamma * branch)`` in the plain operators that a traced, compiled or exported graph records
    and its compiler fuses. Where ``keep_prob`` is given and ``factors`` are not, they are drawn here as mmcv's
    DropPath draws them, ``floor(keep_prob + U)``: the probability enters the graph as a scalar of its operators,
    never of a condition, so that one graph serves every rate."""
    if keep_prob is None:
        return x + branch if gamma is None else torch.addcmul(x, gamma, branch)
    scaled = branch if gamma is None else gamma * branch
    if factors is None:
        keep = keep_prob + torch.rand((branch.shape[0], 1, 1, 1), dtype=scaled.dtype, device=scaled.device)
        return x + scaled.div(keep_prob) * keep.floor()
    return x + scaled * factors
