"""RoPE's rotation of per-head features by the tables of :class:`~mala_mm.models.layers.RoPE2d`: the plain formula
(:mod:`.naive`), torch operators (:mod:`.torch_ops`, which the attention's torch path uses as :func:`apply_rope`),
and for the softmax stages' q and k together one Triton kernel (:mod:`.triton_ops`), chosen by
:func:`rotate_pair`."""
from typing import Tuple

from torch import Tensor

from ..dispatch import Operator
from . import naive, torch_ops
from .naive import RotaryTables
from .torch_ops import apply_rope

ROTATE_PAIR = Operator('rotate_pair', naive.rotate_pair, torch_ops.rotate_pair, f'{__name__}.triton_ops')


def rotate_pair(q: Tensor, k: Tensor, tables: RotaryTables, impl: str = 'torch') -> Tuple[Tensor, Tensor]:
    """``(apply_rope(q, tables), apply_rope(k, tables))``.

    Args:
        q, k: (B, h, N, d) features of one shape, any strides.
        tables: the (N, d) :class:`RotaryTables`.
        impl: 'auto', 'triton' or 'torch' (:func:`~mala_mm.ops.dispatch.uses_triton`). The kernel reads q and k in
            place and lays the results out as the heads of channels-last maps, one launch for both.

    Returns:
        q and k rotated, in their dtypes.
    """
    return ROTATE_PAIR.run(impl, q, q, k, tables)


__all__ = ['ROTATE_PAIR', 'RotaryTables', 'apply_rope', 'rotate_pair']
