"""Two-dimensional rotary position embedding (RoPE) as MALA uses it: the tables of a stage (:class:`RoPE2d`); the
rotation itself is :mod:`mala_mm.ops.rope`."""
from collections import OrderedDict
from typing import List, Tuple, Type

import torch
from torch import nn

from ...ops.rope import RotaryTables
from ...ops.torch_compat import in_graph


def rope_head_dims(embed_dims: int, num_heads: int, where: str, error: Type[ValueError] = ValueError) -> int:
    """The width of each of ``num_heads`` heads over ``embed_dims`` channels, checked to suit 2-D RoPE.

    The heads must divide the channels, and a head must be a multiple of 4 wide: :class:`RoPE2d` gives half of a
    head's channels to the token's row and half to its column, each half in channel pairs that share an angle.

    Raises:
        error: where either does not hold; its message begins with ``where`` (e.g. ``'MALA: in stage 2, '``).
    """
    if embed_dims % num_heads:
        raise error(f'{where}{num_heads} heads do not divide {embed_dims} channels')
    head_dims = embed_dims // num_heads
    if head_dims % 4:
        split = f' ({embed_dims} channels / {num_heads} heads)' if num_heads > 1 else ''
        raise error(f'{where}the head width {head_dims}{split} must be a multiple of 4 for 2-D RoPE')
    return head_dims


class RoPE2d(nn.Module):
    """The rotation tables of one stage, shared by all its heads and blocks.

    With ``F = d / 4`` base frequencies ``theta_f = 10000 ** -(f / (F - 1))`` each repeated twice,
    ``a = [theta_0, theta_0, theta_1, theta_1, ...]`` (length d/2), the token at row r and column c is
    rotated by the angles ``concat(r * a, c * a)`` (length d; channel pairs share an angle).

    The buffer is named ``angle`` and is kept in the state dict because the released checkpoints store it
    (as ``layers.{i}.RoPE.angle``).

    Args:
        head_dims: d, the per-head width; a multiple of 4.
    """

    # per stage: a 1333 x 800 image's stage-0 tables (66,800 tokens x 64 dims, cos and sin, fp32) take 34 MB, so
    # stage 0 keeps its latest size at the paper's scales, and a model at most 4 x 64 MiB
    CACHE_BYTES = 64 * 2**20

    def __init__(self, head_dims: int):
        super().__init__()
        num_freqs = rope_head_dims(head_dims, 1, 'RoPE2d: ') // 4
        theta = 1.0 / (10000 ** torch.linspace(0, 1, num_freqs))
        self.register_buffer('angle', theta.repeat_interleave(2))
        # Tables depend only on (H, W, device, dtype) and `angle`; feature maps of a stage keep their size
        # through a forward pass and often across passes (most COCO images resize to the same few shapes), so
        # the sizes seen most recently are kept, least recently used first out, up to CACHE_BYTES.
        self._tables: 'OrderedDict[tuple, RotaryTables]' = OrderedDict()

    @property
    def head_dims(self) -> int:
        return 2 * self.angle.numel()

    def tables(self, height: int, width: int, dtype: torch.dtype = torch.float32) -> RotaryTables:
        """The tables of an (height, width) map with tokens flattened row-major, for features of ``dtype``:
        float64 for float64 features, float32 otherwise (RoPE is applied in at least fp32)."""
        dtype = torch.promote_types(dtype, torch.float32)
        if in_graph():
            # a graph computes them from its input's size, which may differ from the example's
            return self._compute(height, width, dtype)
        key = (height, width, self.angle.device, dtype)
        if key in self._tables:
            self._tables.move_to_end(key)
            return self._tables[key]
        tables = self._compute(height, width, dtype)
        self._tables[key] = tables
        while self.cached_bytes() > self.CACHE_BYTES:
            self._tables.popitem(last=False)
        return tables

    def cached_tables(self) -> List[Tuple[tuple, RotaryTables]]:
        """The cached tables with their (height, width, device, dtype) keys, the least recently used first."""
        return list(self._tables.items())

    def cached_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self._tables.values() for t in pair)

    def _compute(self, height, width, dtype: torch.dtype) -> RotaryTables:
        angle = self.angle.to(dtype)
        rows = torch.arange(height, device=angle.device, dtype=dtype)
        cols = torch.arange(width, device=angle.device, dtype=dtype)
        row_angles = (rows[:, None] * angle).unsqueeze(1).expand(-1, cols.shape[0], -1)  # (H, W, d/2)
        col_angles = (cols[:, None] * angle).unsqueeze(0).expand(rows.shape[0], -1, -1)
        angles = torch.cat((row_angles, col_angles), dim=-1).flatten(0, 1)               # (N, d)
        sign = torch.tensor([-1.0, 1.0], device=angle.device, dtype=dtype).repeat(angles.shape[-1] // 2)
        return RotaryTables(angles.cos(), angles.sin() * sign)

    def _load_from_state_dict(self, *args, **kwargs):
        self._tables.clear()
        super()._load_from_state_dict(*args, **kwargs)

    def _apply(self, fn, *args, **kwargs):
        self._tables.clear()
        return super()._apply(fn, *args, **kwargs)

    def extra_repr(self) -> str:
        return f'head_dims={self.head_dims}'
