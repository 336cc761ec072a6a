"""A block's residual branch added back with its layer scale and stochastic depth: ``x + keep * gamma * branch``.

mmcv's DropPath and the layer scale take seven operators in the forward and five in the backward of each branch
(the scale's product, the draw and its rounding, the division by the keep probability, the product with the mask,
the addition). :func:`scaled_residual` takes four and four: the draw of the per-sample factor (two), their
product with gamma, one ``addcmul``; in the backward, the branch's gradient in one product written in the branch's
dtype, and gamma's as a sum over the batch weighted by the factors. Where the Triton kernels run
(:mod:`.residual_triton`), one launch does the forward and two the backward, the draw apart: the backbone draws all
its branches' factors in two launches (:func:`drop_path_factors`). :func:`scaled_residual_norm` adds the LayerNorm
that follows the attention's branch to the same launches.
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import dispatch


def drop_path_factors(keep_probs: Tensor, batch: int) -> Tensor:
    """DropPath's per-sample factors of n branches at once, in two launches: for branch i, 0 with probability
    ``1 - keep_probs[i]``, else ``1 / keep_probs[i]``.

    Args:
        keep_probs: (n,) probabilities of keeping each branch.
        batch: B.

    Returns:
        (n, B, 1, 1, 1) in the dtype and on the device of keep_probs; row i is branch i's ``factors`` for
        :func:`scaled_residual`.
    """
    keep = keep_probs.view(-1, 1, 1, 1, 1)
    draws = keep_probs.new_empty((keep_probs.shape[0], batch, 1, 1, 1))
    return draws.bernoulli_(keep.expand_as(draws)).div_(keep)


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


def scaled_residual(x: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor] = None,
                    impl: str = 'torch') -> Tensor:
    """``x + factors * gamma * branch``.

    Args:
        x: (B, C, H, W), the residual stream.
        branch: (B, C, H, W), what the branch computed (it may be in autocast's lower precision).
        gamma: (1, C, 1, 1) layer scale.
        factors: (B, 1, 1, 1) per-sample factors of stochastic depth (a row of :func:`drop_path_factors`), or None.
        impl: 'auto', 'triton' or 'torch' (:func:`~.dispatch.uses_triton`).

    Returns:
        (B, C, H, W) in the promoted dtype of x, branch and gamma.
    """
    if impl == 'torch':
        return _scaled_residual(x, branch, gamma, factors)
    return dispatch.run(SCALED_RESIDUAL, impl, x, _fused_scaled_residual, x, branch, gamma, factors)


def scaled_residual_norm(x: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor], weight: Tensor,
                         bias: Tensor, eps: float, impl: str = 'torch', as_output: bool = False
                         ) -> Tuple[Tensor, Tensor]:
    """:func:`scaled_residual` and the LayerNorm of its result over the channels: the stream after the attention's
    branch and the FFN's input, or after a stage's last block and the stage's output.

    Args:
        x, branch, gamma, factors, impl: as in :func:`scaled_residual`.
        weight, bias: (C,) the LayerNorm's; eps: its epsilon.
        as_output: the normalised map leaves the backbone: contiguous (B, C, H, W), which mmcv's compiled operators
            (RoIAlign) downstream need, in the stream's dtype. Else it is the next conv's input, channels-last.

    Returns:
        The (B, C, H, W) stream, and its normalised (B, C, H, W) map: as the next conv's input, in fp32 under
        autocast in torch operators, as autocast's layer_norm gives it, and in autocast's dtype in the Triton kernel,
        which the conv would cast it to.
    """
    args = (x, branch, gamma, factors, weight, bias, eps, as_output)
    if impl == 'torch':
        return _scaled_residual_norm(*args)
    return dispatch.run(SCALED_RESIDUAL_NORM, impl, x, _fused_scaled_residual_norm, *args)


def _scaled_residual(x: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor]) -> Tensor:
    return _ScaledResidual.apply(x, branch, gamma, factors)


def _scaled_residual_norm(x: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor], weight: Tensor,
                          bias: Tensor, eps: float, as_output: bool) -> Tuple[Tensor, Tensor]:
    out = _ScaledResidual.apply(x, branch, gamma, factors)
    normed = F.layer_norm(out.permute(0, 2, 3, 1), weight.shape, weight, bias, eps).permute(0, 3, 1, 2)
    return out, (normed.contiguous() if as_output else normed)


def _fused_scaled_residual(*args):
    return dispatch.residual_triton.scaled_residual(*args)


def _fused_scaled_residual_norm(*args):
    return dispatch.residual_triton.scaled_residual_norm(*args)


SCALED_RESIDUAL = dispatch.Operator('scaled_residual', _scaled_residual)
SCALED_RESIDUAL_NORM = dispatch.Operator('scaled_residual_norm', _scaled_residual_norm)
