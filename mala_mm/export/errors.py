"""What export raises, and the check of the example shape it is given."""
from typing import Optional, Sequence, Tuple


class ExportError(RuntimeError):
    """The model cannot be exported, or the exported graph does not compute what the model does."""


def check_shape(shape: Optional[Sequence[int]], minimum: int = 32) -> Tuple[int, int]:
    """``shape`` as (H, W), or a clear :class:`ExportError`."""
    if shape is None or len(shape) != 2 or any(not isinstance(s, int) or s < minimum for s in shape):
        raise ExportError(f'`shape` needs two integers H W, each at least {minimum}; got {shape}')
    return tuple(shape)
