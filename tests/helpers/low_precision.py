"""The low precisions that the mixed-precision tests run under CPU autocast, the operators' implementations as test
parameters, and how their results are compared with the fp64 reference."""
from typing import Callable, Sequence, Tuple

import pytest
import torch

from mala_mm.ops import OPERATORS, TRITON_AVAILABLE
from mala_mm.ops.dispatch import NEEDS_TRITON as TRITON_FLOOR
from mala_mm.ops.dispatch import TRITON_MISSING
from tests.helpers import relative_error


def cpu_autocast_takes(dtype) -> bool:
    try:
        with torch.autocast('cpu', dtype=dtype):
            return True
    except RuntimeError:  # torch 2.1's CPU autocast runs bfloat16 only
        return False


LOW_PRECISIONS = [torch.bfloat16, torch.float16]
NAMES = {torch.float64: 'fp64', torch.float32: 'fp32', torch.bfloat16: 'bf16', torch.float16: 'fp16'}
MARKS = {torch.float16: pytest.mark.skipif(not cpu_autocast_takes(torch.float16),
                                           reason="this torch's CPU autocast has no float16")}
NEEDS_CPU_FP16 = MARKS[torch.float16]  # as a decorator: Python 3.8 takes a name there, not a subscript
# the low precisions as parameters of a test, each skipped where this torch's CPU autocast lacks it
DTYPES = [pytest.param(dtype, id=NAMES[dtype], marks=MARKS.get(dtype, ())) for dtype in LOW_PRECISIONS]


# The operators' implementations (mala_mm.ops.OPERATORS), as test parameters: the Triton kernels run on the GPU where
# there is one, else on the CPU in Triton's interpreter (tests/conftest.py)
TRITON_DEVICE = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
IMPL_MARKS = {'triton': pytest.mark.skipif(not TRITON_AVAILABLE,
                                           reason=f'{TRITON_FLOOR}, and {TRITON_MISSING}')}
NEEDS_TRITON = IMPL_MARKS['triton']
IMPLS = [pytest.param(name, marks=IMPL_MARKS.get(name, ())) for name in ('torch', 'triton')]


def attention_impl(name: str):
    """mala_attention's implementation ``name`` as a function of CPU tensors, returning CPU tensors."""
    from mala_mm.ops.mala_attention import mala_attention
    if name == 'torch':
        return mala_attention

    def fused(q, k, v, rope=None):
        to = lambda t: t.to(TRITON_DEVICE)  # noqa: E731
        return OPERATORS['mala_attention'].triton(to(q), to(k), to(v), rope and type(rope)(*map(to, rope))).cpu()
    return fused


def impl_dtypes(torch_dtypes: Sequence[torch.dtype], triton_dtypes: Sequence[torch.dtype]) -> list:
    """(impl, dtype) test parameters: each implementation with the dtypes of the inputs it is checked in (the torch
    operators take fp64, the kernels do not)."""
    return [pytest.param(impl, dtype, id=f'{impl}-{NAMES[dtype]}', marks=IMPL_MARKS.get(impl, ()))
            for impl, dtypes in (('torch', torch_dtypes), ('triton', triton_dtypes)) for dtype in dtypes]


def implementation(name: str, impl: str) -> Callable:
    """``OPERATORS[name]``'s implementation ``impl``, which takes the reference's arguments."""
    return OPERATORS[name].implementations()[impl]


def device_of(impl: str) -> torch.device:
    """Where an implementation's inputs are made: the kernels' device for 'triton', the CPU for 'torch'."""
    return TRITON_DEVICE if impl == 'triton' else torch.device('cpu')


def channels_last_map(shape, dtype=torch.float32, device=TRITON_DEVICE) -> torch.Tensor:
    """A random (B, C, H, W) map of ``dtype``, channels-last: the layout of the backbone's maps."""
    return torch.randn(shape, device=device).to(dtype).contiguous(memory_format=torch.channels_last)


def fp64_copies(args) -> list:
    """args with each tensor (and each tensor of a tuple, such as RoPE's tables) an fp64 copy of the same values on
    the CPU, with NCHW strides (torch's CPU convolutions of channels-last fp64 maps take seconds), requiring a
    gradient where the tensor does."""
    def copy(t):
        if isinstance(t, tuple):
            return type(t)(*map(copy, t))
        if not isinstance(t, torch.Tensor):
            return t
        exact = t.detach().cpu().double().clone(memory_format=torch.contiguous_format)
        return exact.requires_grad_(t.requires_grad)
    return [copy(a) for a in args]


def outputs_and_gradients(fn: Callable, args, weights=None, autocast: torch.dtype = None
                          ) -> Tuple[tuple, tuple, list]:
    """``fn(*args)`` as a tuple of outputs, the gradients of each tensor of args that requires one, and the weights:
    the gradients are those of the loss ``sum_i sum(w_i * out_i)``, with w_i fixed random numbers of each output's
    shape rounded to its dtype (drawn here, or given as ``weights`` from an earlier call), so that every output
    element counts, each differently. With ``autocast`` (a dtype), the forward runs under autocast on the tensors'
    device, and the backward after it, as a training step's."""
    device = next(a for a in args if isinstance(a, torch.Tensor)).device
    with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
        outputs = fn(*args)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    if weights is None:
        generator = torch.Generator().manual_seed(1)
        weights = [torch.randn(out.shape, generator=generator, dtype=torch.float64).to(out.dtype) for out in outputs]
    loss = sum((out.double() * w.to(out.device, torch.float64)).sum() for out, w in zip(outputs, weights))
    wanted = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    return outputs, torch.autograd.grad(loss, wanted), weights


# how far a result in fp64 or fp32 may lie from the fp64 reference, relative to its largest value: the same
# arithmetic in another order
TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-5}


def assert_matches_fp64(ours: torch.Tensor, exact: torch.Tensor, name: str = '') -> None:
    """ours against the fp64 result ``exact`` of the same values: in fp64 or fp32 within TOLERANCES of its largest
    value, in a lower precision exact rounded to ours' dtype or a neighbour of that (the fp32 result may lie on the
    other side of a rounding boundary; near zero, fp32's own error, 1e-7 of the terms, may be more than one step of
    the dtype)."""
    assert ours.shape == exact.shape, name
    ours = ours.detach().cpu()
    if ours.dtype in TOLERANCES:
        assert relative_error(ours, exact) < TOLERANCES[ours.dtype], name
        return
    expected = exact.to(ours.dtype).double()
    bound = torch.finfo(ours.dtype).eps * expected.abs() + 1e-5 * exact.abs().max()
    assert ((ours.double() - expected).abs() <= bound).all(), name
