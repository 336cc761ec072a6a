"""A block's residual branch added back with its layer scale and stochastic depth, ``x + keep * gamma * branch``,
and where a LayerNorm reads the sum (the FFN's input, or a stage's output), that norm too: the plain formulas
(:mod:`.naive`), torch operators (:mod:`.torch_ops`) and one Triton kernel forward and one backward
(:mod:`.triton_ops`), chosen by the functions here. The per-sample factors of stochastic depth are drawn apart,
for all the backbone's branches at once (:func:`drop_path_factors`).
"""
from typing import Optional, Tuple, Union

from torch import Tensor

from ..dispatch import Operator
from ..torch_compat import in_graph
from . import naive, torch_ops
from .torch_ops import layer_norm_2d

SCALED_RESIDUAL = Operator('scaled_residual', naive.scaled_residual, torch_ops.scaled_residual,
                           f'{__name__}.triton_ops')
SCALED_RESIDUAL_NORM = Operator('scaled_residual_norm', naive.scaled_residual_norm, torch_ops.scaled_residual_norm,
                                f'{__name__}.triton_ops')


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


def scaled_residual(x: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor] = None,
                    impl: str = 'torch') -> Tensor:
    """``x + factors * gamma * branch``.

    Args:
        x: (B, C, H, W), the residual stream.
        branch: (B, C, H, W), what the branch computed (it may be in autocast's lower precision).
        gamma: (1, C, 1, 1) layer scale.
        factors: (B, 1, 1, 1) per-sample factors of stochastic depth (a row of :func:`drop_path_factors`), or None.
        impl: 'auto', 'triton' or 'torch' (:func:`~mala_mm.ops.dispatch.uses_triton`).

    Returns:
        (B, C, H, W) in the promoted dtype of x, branch and gamma.
    """
    return SCALED_RESIDUAL.run(impl, x, x, branch, gamma, factors)


def scaled_residual_norm(x: Tensor, branch: Tensor, gamma: Tensor, factors: Optional[Tensor], weight: Tensor,
                         bias: Tensor, eps: float, as_output: bool = False, impl: str = 'torch'
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
    return SCALED_RESIDUAL_NORM.run(impl, x, x, branch, gamma, factors, weight, bias, eps, as_output)


def add_branch(x: Tensor, branch: Tensor, gamma: Optional[Tensor], keep_prob: Optional[float] = None,
               factors: Optional[Tensor] = None, norm: Optional[Tuple[Tensor, Tensor, float]] = None,
               as_output: bool = False, impl: str = 'torch') -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """A block's branch added back, ``x + DropPath(gamma * branch)``, and where ``norm`` is given the LayerNorm of
    the sum too.

    Args:
        x, branch: (B, C, H, W), the stream and what the branch computed.
        gamma: (1, C, 1, 1) layer scale, or None.
        keep_prob: the probability that stochastic depth keeps the branch, or None where it drops none (in eval,
            or at a rate of 0).
        factors: the branch's (B, 1, 1, 1) stochastic depth factors drawn beforehand (a row of
            :func:`drop_path_factors`), or None: drawn here where ``keep_prob`` is given.
        norm: the LayerNorm's (C,) weight and bias and its eps, or None.
        as_output, impl: as in :func:`scaled_residual_norm`.

    Returns:
        The (B, C, H, W) sum, and with ``norm`` its normalised map. With a layer scale and outside graphs, through
        :func:`scaled_residual` or :func:`scaled_residual_norm`; in graphs (traced, compiled or exported) and
        without one, in plain torch operators, which a graph's compiler fuses.
    """
    if gamma is None or in_graph():
        x = torch_ops.add_branch_in_graph(x, branch, gamma, keep_prob, factors)
        if norm is None:
            return x
        normed = layer_norm_2d(x, *norm)
        return x, (normed.contiguous() if as_output else normed)
    if keep_prob is None:
        factors = None
    elif factors is None:
        factors = drop_path_factors(gamma.new_full((1,), keep_prob), x.shape[0])[0]
    if norm is None:
        return scaled_residual(x, branch, gamma, factors, impl)
    return scaled_residual_norm(x, branch, gamma, factors, *norm, as_output, impl)
