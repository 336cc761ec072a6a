"""GELU of a training BatchNorm in torch operators: the norm's module and the GELU's, as the stem runs them."""
from typing import Optional

import torch.nn.functional as F
from torch import Tensor


def batch_norm_gelu(x: Tensor, weight: Tensor, bias: Tensor, running_mean: Optional[Tensor],
                    running_var: Optional[Tensor], momentum: float, eps: float) -> Tensor:
    """``GELU(BatchNorm(x))`` with the batch's statistics, the running ones (where given) updated."""
    return F.gelu(F.batch_norm(x, running_mean, running_var, weight, bias, True, momentum, eps))
