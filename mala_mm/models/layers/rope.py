"""Two-dimensional rotary position embedding (RoPE) as MALA uses it."""
from typing import Dict

import torch
from torch import Tensor, nn


def apply_rope(x: Tensor, rotation: Tensor) -> Tensor:
    """``RoPE(x) = x * cos + rot(x) * sin``, with ``rot`` mapping each channel pair ``(x_2m, x_2m+1)`` to
    ``(-x_2m+1, x_2m)``: the pair is the complex number ``x_2m + i x_2m+1`` multiplied by ``cos + i sin``.

    Args:
        x: (..., N, d) features of N tokens.
        rotation: (N, d/2) complex unit numbers from :meth:`RoPE2d.tables`.

    Returns:
        (..., N, d) in the dtype of x.
    """
    pairs = torch.view_as_complex(x.to(rotation.real.dtype).contiguous().unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * rotation).flatten(-2).to(x.dtype)


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

    def __init__(self, head_dims: int):
        super().__init__()
        if head_dims % 4:
            raise ValueError(f'RoPE2d needs a head width divisible by 4, got {head_dims}')
        num_freqs = head_dims // 4
        theta = 1.0 / (10000 ** torch.linspace(0, 1, num_freqs))
        self.register_buffer('angle', theta.repeat_interleave(2))
        # Tables depend only on (H, W, device, dtype) and `angle`; feature maps of a stage keep their size
        # through a forward pass and often across passes, so each size is computed once.
        self._tables: Dict[tuple, Tensor] = {}

    @property
    def head_dims(self) -> int:
        return 2 * self.angle.numel()

    def tables(self, height: int, width: int, dtype: torch.dtype = torch.float32) -> Tensor:
        """Return the (height * width, d / 2) complex rotations of tokens flattened row-major, in complex128 for
        float64 features and complex64 otherwise."""
        key = (height, width, self.angle.device, dtype)
        if key not in self._tables:
            if len(self._tables) >= 8:  # bounded: multi-scale training sees many sizes
                self._tables.pop(next(iter(self._tables)))
            angle = self.angle
            rows = torch.arange(height, device=angle.device, dtype=angle.dtype)
            cols = torch.arange(width, device=angle.device, dtype=angle.dtype)
            row_angles = (rows[:, None] * angle).unsqueeze(1).expand(height, width, -1)
            col_angles = (cols[:, None] * angle).unsqueeze(0).expand(height, width, -1)
            angles = torch.cat((row_angles, col_angles), dim=-1).flatten(0, 1)[:, 0::2]  # one angle per pair
            angles = angles.to(torch.promote_types(dtype, torch.float32))
            self._tables[key] = torch.polar(torch.ones_like(angles), angles)
        return self._tables[key]

    def _load_from_state_dict(self, *args, **kwargs):
        self._tables.clear()
        super()._load_from_state_dict(*args, **kwargs)

    def _apply(self, fn, *args, **kwargs):
        self._tables.clear()
        return super()._apply(fn, *args, **kwargs)

    def extra_repr(self) -> str:
        return f'head_dims={self.head_dims}'
