"""GELU after a BatchNorm in training, the stem's: the plain formula (:mod:`.naive`), torch operators
(:mod:`.torch_ops`) and a backward that keeps the norm's input alone, recomputing its output in one Triton kernel
(:mod:`.triton_ops`), chosen by :func:`batch_norm_gelu`."""
from typing import Optional

from torch import Tensor

from ..dispatch import Operator
from . import naive, torch_ops

BATCH_NORM_GELU = Operator('batch_norm_gelu', naive.batch_norm_gelu, torch_ops.batch_norm_gelu,
                           f'{__name__}.triton_ops')


def batch_norm_gelu(x: Tensor, weight: Tensor, bias: Tensor, running_mean: Optional[Tensor],
                    running_var: Optional[Tensor], momentum: float, eps: float, impl: str = 'torch') -> Tensor:
    """``GELU(BatchNorm(x))`` with the batch's statistics, as a BatchNorm computes in training.

    Args:
        x: (B, C, H, W), more than one value a channel.
        weight, bias: (C,) the norm's affine parameters.
        running_mean, running_var: (C,) the norm's running statistics, updated with ``momentum``, or None.
        eps: the norm's epsilon.
        impl: 'auto', 'triton' or 'torch' (:func:`~mala_mm.ops.dispatch.uses_triton`). The torch operators keep the
            norm's input and output for the backward; the Triton path keeps the input alone.

    Returns:
        (B, C, H, W) in x's dtype.
    """
    return BATCH_NORM_GELU.run(impl, x, x, weight, bias, running_mean, running_var, momentum, eps)


__all__ = ['BATCH_NORM_GELU', 'batch_norm_gelu']
