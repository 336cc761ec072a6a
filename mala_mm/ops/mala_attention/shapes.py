"""The arguments every implementation of :func:`~mala_mm.ops.mala_attention.mala_attention` takes, checked once
where they enter: the kernels would read out of bounds, and the torch operators broadcast or fail deep inside a
matmul."""
from typing import Optional

from torch import Tensor


def check_shapes(q: Tensor, k: Tensor, v: Tensor, rope: Optional[tuple], v_width_of_q: bool = False) -> None:
    """Raises ValueError unless q and k are (B, h, N, d) of one shape, v (B, h, N, d_v) (``v_width_of_q``: d_v = d,
    as the kernels take it) and the RoPE tables, where given, (N, d)."""
    if q.dim() != 4 or k.shape != q.shape or v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f'mala_attention: q and k must be (B, h, N, d) of one shape and v (B, h, N, d_v), got '
                         f'{tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}')
    if v_width_of_q and v.shape != q.shape:
        raise ValueError(f'mala_attention: the Triton kernels take v of q\'s shape {tuple(q.shape)}, got '
                         f'{tuple(v.shape)}; impl=\'torch\' takes another head width')
    if rope is not None and not rope[0].shape == rope[1].shape == q.shape[-2:]:
        raise ValueError(f'mala_attention: the RoPE tables must be (N, d) = {tuple(q.shape[-2:])} for q of '
                         f'{tuple(q.shape)}, got {tuple(rope[0].shape)} and {tuple(rope[1].shape)}')
