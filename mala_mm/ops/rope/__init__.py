"""RoPE's rotation of per-head features by the tables of :class:`~mala_mm.models.layers.RoPE2d`: the plain formula
(:mod:`.naive`), torch operators (:mod:`.torch_ops`, which the attentions' torch paths use as :func:`apply_rope`),
and for the softmax stages' q and k one Triton kernel that rotates them in the qkvo projection's map
(:mod:`.triton_ops`), chosen by :func:`rotate_qk`."""
from typing import Tuple

from torch import Tensor

from ..dispatch import Operator
from . import naive, torch_ops
from .naive import RotaryTables, split_heads
from .torch_ops import apply_rope

ROTATE_QK = Operator('rotate_qk', naive.rotate_qk, torch_ops.rotate_qk, f'{__name__}.triton_ops')


def rotate_qk(qkvo: Tensor, tables: RotaryTables, num_heads: int, impl: str = 'torch'
              ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The (B, 4C, H, W) qkvo map split as softmax attention takes it: q's and k's (B, h, N, d) heads rotated by
    ``apply_rope``, and v's and o's (B, C, H, W) maps.

    Args:
        qkvo: q, k, v and o, C channels each, in that order.
        tables: the (N, d) :class:`RotaryTables`.
        num_heads: h, with C = h d.
        impl: 'auto', 'triton' or 'torch' (:func:`~mala_mm.ops.dispatch.uses_triton`). The kernel rotates q and k
            in place in the map (channels-last), so that the map, which the backward keeps for v and o, holds them
            once; the torch operators write them apart.

    Returns:
        q and k rotated, v and o, in the map's dtype.
    """
    return ROTATE_QK.run(impl, qkvo, qkvo, tables, num_heads)


__all__ = ['ROTATE_QK', 'RotaryTables', 'apply_rope', 'rotate_qk', 'split_heads']
