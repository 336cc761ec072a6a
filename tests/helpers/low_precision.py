"""The low precisions that the mixed-precision tests run under CPU autocast, and MALA attention's implementations,
as test parameters."""
import pytest
import torch

from mala_mm.ops import OPERATORS, TRITON_AVAILABLE


def cpu_autocast_takes(dtype) -> bool:
    try:
        with torch.autocast('cpu', dtype=dtype):
            return True
    except RuntimeError:  # torch 2.1's CPU autocast runs bfloat16 only
        return False


LOW_PRECISIONS = [torch.bfloat16, torch.float16]
NAMES = {torch.bfloat16: 'bf16', torch.float16: 'fp16'}
MARKS = {torch.float16: pytest.mark.skipif(not cpu_autocast_takes(torch.float16),
                                           reason="this torch's CPU autocast has no float16")}
# the low precisions as parameters of a test, each skipped where this torch's CPU autocast lacks it
DTYPES = [pytest.param(dtype, id=NAMES[dtype], marks=MARKS.get(dtype, ())) for dtype in LOW_PRECISIONS]


# MALA attention's implementations, as test parameters: the Triton kernels run on the GPU where there is one, else on
# the CPU in Triton's interpreter (tests/conftest.py)
TRITON_DEVICE = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
IMPL_MARKS = {'triton': pytest.mark.skipif(not TRITON_AVAILABLE,
                                           reason='Triton is not installed (the tests extra installs it)')}
ATTENTION_IMPLS = [pytest.param(name, marks=IMPL_MARKS.get(name, ())) for name in ('torch', 'triton')]


def attention_impl(name: str):
    """mala_attention's implementation ``name`` as a function of CPU tensors, returning CPU tensors."""
    from mala_mm.ops.mala_attention import mala_attention
    if name == 'torch':
        return mala_attention

    def fused(q, k, v, rope=None):
        to = lambda t: t.to(TRITON_DEVICE)  # noqa: E731
        return OPERATORS['mala_attention'].triton(to(q), to(k), to(v), rope and type(rope)(*map(to, rope))).cpu()
    return fused
