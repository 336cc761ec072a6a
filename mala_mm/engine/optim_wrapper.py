"""Mixed-precision training on CPU."""
from contextlib import contextmanager

import torch
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(OptimWrapper):
    """:class:`~mmengine.optim.OptimWrapper` whose forward passes run under CPU bfloat16 autocast.

    mmengine's ``AmpOptimWrapper`` needs CUDA. bfloat16 has float32's exponent range, so gradients neither
    overflow nor underflow and no loss scaling is needed; parameters, gradients and optimizer state stay fp32.
    """

    @contextmanager
    def optim_context(self, model: torch.nn.Module):
        with super().optim_context(model), torch.autocast('cpu', dtype=torch.bfloat16):
            yield
