"""Which implementation runs an operator: its torch operators, or the Triton kernels beside them.

``impl`` is 'triton' (the kernels), 'torch' (the operators) or 'auto': the kernels for CUDA tensors on a GPU that
Triton serves (compute capability 8.0 or newer) where Triton is installed, the operators elsewhere. The backbone
checks it once, where it is built (:func:`check_impl`); each operator then asks :func:`uses_triton` of the
tensors it is given and runs through :func:`run`, where under 'auto' a kernel that fails on a GPU (one this
package's kernels were never compiled for, or another Triton) hands that operator to its torch operators on that
GPU, with one warning.
"""
import logging
import warnings
from typing import Callable

import torch
from mmengine.logging import print_log
from torch import Tensor

from .torch_compat import is_compiling, is_exporting

try:
    import triton
except ImportError:  # optional: without it the torch operators serve every device
    triton = None
if triton is not None:
    from . import depthwise_triton, mala_triton, residual_triton, rope_triton, triton_launch
else:
    depthwise_triton = mala_triton = residual_triton = rope_triton = triton_launch = None

TRITON_AVAILABLE = triton is not None
IMPLS = ('auto', 'triton', 'torch')
FLOATS = (torch.float32, torch.float16, torch.bfloat16)

# the GPUs (triton_launch.GPU) that the kernels do not serve, on which 'auto' has said so
_GPUS_LOGGED = set()


class Operator:
    """An operator that runs in Triton kernels or in torch operators, both with the arguments of ``torch_fn``;
    the GPUs on which its kernels failed."""

    def __init__(self, name: str, torch_fn: Callable):
        self.name, self.torch_fn = name, torch_fn
        self.failed_on = set()

    def __call__(self, *args):
        """The torch operators on ``args``."""
        return self.torch_fn(*args)

    def available_on(self, gpu) -> bool:
        return gpu not in self.failed_on

    def unavailable(self, error) -> None:
        """Hands the operator to its torch operators on the GPU of ``error`` (a
        :class:`~.triton_launch.KernelUnavailable`), with a warning that names the kernel, the GPU and the error."""
        if error.gpu not in self.failed_on:
            self.failed_on.add(error.gpu)
            warnings.warn(f"impl='auto': {error}; {self.name} runs in torch operators on this GPU from now on",
                          RuntimeWarning, stacklevel=3)


def check_impl(impl: str, where: str, error=ValueError) -> str:
    """``impl`` if it is one of IMPLS that this installation can run, else ``error`` saying why."""
    if impl not in IMPLS:
        raise error(f'{where}impl must be one of {IMPLS}, got {impl!r}')
    if impl == 'triton' and not TRITON_AVAILABLE:
        raise error(f"{where}impl='triton' needs Triton (pip install triton), which is not installed")
    return impl


def uses_triton(impl: str, x: Tensor, operator: Operator = None) -> bool:
    """Whether an operator given ``x`` runs in the Triton kernels. Traced, exported and compiled graphs take the
    torch operators, which they can record and the compiler fuses itself."""
    check_impl(impl, '')
    if impl == 'torch' or torch.jit.is_tracing() or is_compiling() or is_exporting():
        return False
    if impl == 'auto':
        if not TRITON_AVAILABLE or not x.is_cuda or x.dtype not in FLOATS:
            return False
        gpu = triton_launch.gpu_of(x)
        why_not = triton_launch.unserved(gpu)
        if why_not is not None:
            _log_once(gpu, why_not)
            return False
        return operator is None or operator.available_on(gpu)
    if x.dtype not in FLOATS:
        raise TypeError(f"impl='triton' takes fp32, bf16 or fp16 features, got {x.dtype}")
    if not (x.is_cuda or triton_launch.INTERPRETED):
        raise RuntimeError(f"impl='triton' runs on CUDA tensors, got {x.device.type} ones (Triton's "
                           f"interpreter runs it on the CPU where TRITON_INTERPRET=1 is set before import)")
    why_not = triton_launch.unserved(triton_launch.gpu_of(x)) if x.is_cuda else None
    if why_not is not None:
        raise RuntimeError(f"impl='triton' runs the Triton kernels, and {why_not}: use impl='auto' (which "
                           f"takes the torch operators there) or 'torch'")
    return True


def run(operator: Operator, impl: str, x: Tensor, triton_fn: Callable, *args):
    """``operator`` on ``args``: ``triton_fn(*args, torch_fallback)`` where :func:`uses_triton` takes the kernels
    for ``x``, else its torch operators. Under 'auto', a kernel that fails hands the operator to its torch operators
    on that GPU (``torch_fallback``: in the backward too); under 'triton' the error stops the run."""
    if not uses_triton(impl, x, operator):
        return operator(*args)
    torch_fallback = operator if impl == 'auto' else None
    return triton_launch.in_kernels_or_torch(lambda: triton_fn(*args, torch_fallback), torch_fallback,
                                             lambda: operator(*args))


def _log_once(gpu, why_not: str) -> None:
    if gpu not in _GPUS_LOGGED:
        _GPUS_LOGGED.add(gpu)
        print_log(f"impl='auto': {why_not}; the blocks' operators run in torch operators", logger='current',
                  level=logging.WARNING)


def kernel_variants(gpu):
    """(operator module, kernel, its constexprs and launch options) of each Triton kernel variant that the
    launchers make on ``gpu`` (a :class:`~.triton_launch.GPU`): what tools/compile_kernels.py compiles."""
    for module in (mala_triton, rope_triton, depthwise_triton, residual_triton):
        for kernel, options in module.variants(gpu):
            yield module.__name__, kernel, options
