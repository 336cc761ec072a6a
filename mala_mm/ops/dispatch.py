"""Which implementation runs an operator: its torch operators, or the Triton kernels beside them.

``impl`` is 'triton' (the kernels), 'torch' (the operators) or 'auto' (the kernels for CUDA tensors where Triton is
installed, the operators elsewhere). The backbone checks it once, where it is built (:func:`check_impl`); each
operator then asks :func:`uses_triton` of the tensors it is given.
"""
import torch
from torch import Tensor

from .torch_compat import is_compiling, is_exporting

try:
    import triton
except ImportError:  # optional: without it the torch operators serve every device
    triton = None
if triton is not None:
    from . import depthwise_triton, mala_triton, residual_triton, rope_triton
else:
    depthwise_triton = mala_triton = residual_triton = rope_triton = None

IMPLS = ('auto', 'triton', 'torch')
FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def check_impl(impl: str, where: str, error=ValueError) -> str:
    """``impl`` if it is one of IMPLS that this installation can run, else ``error`` saying why."""
    if impl not in IMPLS:
        raise error(f'{where}attn_impl must be one of {IMPLS}, got {impl!r}')
    if impl == 'triton' and mala_triton is None:
        raise error(f"{where}attn_impl='triton' needs Triton (pip install triton), which is not installed")
    return impl


def uses_triton(impl: str, x: Tensor) -> bool:
    """Whether an operator given ``x`` runs in the Triton kernels. Traced, exported and compiled graphs take the
    torch operators, which they can record and the compiler fuses itself."""
    if impl == 'torch' or torch.jit.is_tracing() or is_compiling() or is_exporting():
        return False
    if impl == 'auto':
        return mala_triton is not None and x.is_cuda and x.dtype in FLOATS
    if x.dtype not in FLOATS:
        raise TypeError(f"attn_impl='triton' takes fp32, bf16 or fp16 features, got {x.dtype}")
    if not (x.is_cuda or mala_triton.INTERPRETED):
        raise RuntimeError(f"attn_impl='triton' runs on CUDA tensors, got {x.device.type} ones (Triton's "
                           f"interpreter runs it on the CPU where TRITON_INTERPRET=1 is set before import)")
    return True
