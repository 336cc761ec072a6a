"""Magnitude-aware linear attention, MALA's token mixer: the plain formula (:mod:`.naive`), torch operators
(:mod:`.torch_ops`) and Triton kernels (:mod:`.triton_ops`), one chosen by :func:`mala_attention`."""
from typing import Optional

from torch import Tensor

from ..dispatch import Operator
from ..rope import RotaryTables
from . import naive, torch_ops
from .shapes import check_shapes

MALA_ATTENTION = Operator('mala_attention', naive.mala_attention, torch_ops.mala_attention, f'{__name__}.triton_ops')


def mala_attention(q: Tensor, k: Tensor, v: Tensor, rope: Optional[RotaryTables] = None, eps: float = 1e-6,
                   impl: str = 'torch') -> Tensor:
    """Magnitude-aware linear attention in O(N d^2): the scores ``S_ij = beta_i s_ij - gamma_i`` of
    :mod:`.naive` applied to v without forming the N x N matrix, as ``Y_i = beta_i q~_i KV - gamma_i sum_j v_j``
    with ``KV = s / N sum_j k~_j^T v_j`` (d x d per head).

    Args:
        q, k, v: (B, h, N, d) per-head projections (v may be (B, h, N, d_v) in torch operators).
        rope: the (N, d) tables of :meth:`~mala_mm.models.layers.RoPE2d.tables`, or None for no rotation.
        eps: keeps ``1 / z`` finite.
        impl: 'torch', 'triton' or 'auto' (:func:`~mala_mm.ops.dispatch.uses_triton`). The kernels lay their
            output out as the heads of a channels-last map.

    Raises:
        ValueError: q and k of different shapes, v of other tokens, or tables that are not (N, d).

    Returns:
        (B, h, N, d) in the dtype of v.
    """
    check_shapes(q, k, v, rope)
    return MALA_ATTENTION.run(impl, v, q, k, v, rope, eps)
