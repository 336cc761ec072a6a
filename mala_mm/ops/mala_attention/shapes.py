"""The arguments every implementation of :func:`~mala_mm.ops.mala_attention.mala_attention` takes, checked once
where they enter: the kernels would read out of bounds, and the torch operators broadcast or fail deep inside a
matmul."""
from typing import Optional

from torch import Tensor


def check_shapes(q: Tensor, k: Tensor, v: Tensor, rope: Optional[tuple]) -> None:
    """Raises ValueError unless q, k and v are (B, h, N, d) of one shape and the RoPE tables, where given, (N, d)."""
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f'mala_attention: q, k and v must be (B, h, N, d) of one shape, got {tuple(q.shape)}, '
                         f'{tuple(k.shape)} and {tuple(v.shape)}')
    if rope is not None and not rope[0].shape == rope[1].shape == q.shape[-2:]:
        raise ValueError(f'mala_attention: the RoPE tables must be (N, d) = {tuple(q.shape[-2:])} for q of '
                         f'{tuple(q.shape)}, got {tuple(rope[0].shape)} and {tuple(rope[1].shape)}')
