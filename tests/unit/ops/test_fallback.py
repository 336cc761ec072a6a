"""impl='auto' on a GPU where one Triton kernel fails: in every setting users train with (fp32, bf16 and fp16
autocast, with and without activation checkpointing), the step goes on in torch operators for that kernel's
operator and its gradients are the torch path's.

Each kernel of every operator in OPERATORS is made to fail as a kernel that does not fit a GPU would, at its every
launch; the kernels run in Triton's interpreter where there is no GPU (tests/conftest.py), and 'auto' takes them
as it would on a GPU that Triton serves.
"""
import re
import warnings

import pytest
import torch

from mala_mm import MALA
from mala_mm.models.layers import attention
from mala_mm.ops import OPERATORS, TRITON_AVAILABLE, dispatch
from tests.helpers import relative_error
from tests.helpers.launches import failing_kernel
from tests.helpers.low_precision import NAMES, NEEDS_CPU_FP16, NEEDS_TRITON, TRITON_DEVICE

# a block per stage, MALA attention in the first two and softmax attention with RoPE in the last two
ARCH = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_heads=[1, 2, 3, 4])
PRECISIONS = [torch.float32, torch.bfloat16, torch.float16]
# the largest difference from the torch path's gradients, relative to their largest value: fp32's rounding, and
# in a low precision the rounding of the kernels that still run, which compute in fp32 what torch's round
BOUNDS = {torch.float32: 1e-4, torch.bfloat16: 0.1, torch.float16: 0.02}
# the autocast cases take two thirds of the test's minute and a half in Triton's interpreter: the whole suite runs
# them, the fast subset the fp32 ones
LOW_PRECISION_MARKS = {torch.bfloat16: [pytest.mark.slow], torch.float16: [pytest.mark.slow, NEEDS_CPU_FP16]}
# the biases of the convs ahead of a BatchNorm (the stem's, the downsamples'): gradients of zero, as rounding noise
# in either path
NOISE = re.compile(r'patch_embed\.proj\.\d+\.bias|layers\.\d\.downsample\.reduction\.bias')


def kernels():
    """Every kernel of every operator, as the launchers make them."""
    if not TRITON_AVAILABLE:
        return ['none']
    return sorted({name for operator in OPERATORS.values() for name in kernel_names(operator)})


def kernel_names(operator) -> set:
    from mala_mm.ops.triton_launch import INTERPRETER_GPU
    return {getattr(kernel, 'fn', kernel).__name__ for kernel, _ in operator.variants(INTERPRETER_GPU)}


@pytest.fixture
def auto_as_on_a_gpu(monkeypatch):
    """``auto(kernel)``: 'auto' takes the kernels of the operators that launch ``kernel`` as on a GPU that Triton
    serves, on the kernels' device here, and the torch operators for the others (whose kernels the interpreter
    would take minutes over); the operators' records of failures fresh. Returns those operators and the GPU."""
    from mala_mm.ops.triton_launch import gpu_of
    gpu = gpu_of(torch.empty(0, device=TRITON_DEVICE))
    for operator in OPERATORS.values():
        monkeypatch.setattr(operator, 'failed_on', set())
        monkeypatch.setattr(operator, 'failing_on', set())

    def auto(kernel):
        chosen = [operator for operator in OPERATORS.values() if kernel in kernel_names(operator)]

        def uses_triton(impl, x, operator=None):
            return impl == 'auto' and (operator is None or operator in chosen and operator.available_on(gpu))
        for module in (dispatch, attention):  # attention.py asks it which layout the projection gives
            monkeypatch.setattr(module, 'uses_triton', uses_triton)
        return chosen, gpu
    return auto


def gradients(impl: str, dtype: torch.dtype, with_cp: bool) -> dict:
    """Every parameter's gradient after one step of the backbone, under autocast to ``dtype`` unless fp32."""
    torch.manual_seed(0)
    model = MALA(arch=ARCH, drop_path_rate=0.0, impl=impl, with_cp=with_cp).to(TRITON_DEVICE)
    x = torch.randn(2, 3, 96, 96, device=TRITON_DEVICE)
    with torch.autocast(TRITON_DEVICE.type, dtype=dtype, enabled=dtype != torch.float32):
        outputs = model(x)
    loss = sum((out.float() * torch.linspace(-1, 1, out.numel(), device=out.device).view(out.shape)).mean()
               for out in outputs)
    loss.backward()
    return {name: p.grad.detach().cpu() for name, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(scope='module')
def torch_path():
    """The torch path's gradients, by dtype (checkpointing does not change them)."""
    return {}


@NEEDS_TRITON
@pytest.mark.parametrize('with_cp', [False, True], ids=['', 'with_cp'])
@pytest.mark.parametrize('dtype', [pytest.param(d, id=NAMES[d], marks=LOW_PRECISION_MARKS.get(d, ()))
                                   for d in PRECISIONS])
@pytest.mark.parametrize('kernel', kernels())
def test_a_step_goes_on_in_torch_operators_where_a_kernel_fails(auto_as_on_a_gpu, monkeypatch, torch_path, kernel,
                                                                dtype, with_cp):
    if dtype not in torch_path:
        torch_path[dtype] = gradients('torch', dtype, with_cp=False)
    operators, gpu = auto_as_on_a_gpu(kernel)
    tried = failing_kernel(monkeypatch, kernel)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter('always', RuntimeWarning)
        ours = gradients('auto', dtype, with_cp)
    assert kernel in tried
    said = [str(w.message) for w in warned if issubclass(w.category, RuntimeWarning)]
    assert len(said) == 1 and f'the Triton kernel {kernel} failed' in said[0], said
    expected = torch_path[dtype]
    assert ours.keys() == expected.keys()
    errors = {name: relative_error(ours[name], expected[name]) for name in expected if not NOISE.fullmatch(name)}
    worst = max(errors, key=errors.get)
    assert errors[worst] < BOUNDS[dtype], (worst, errors[worst])
    # the step's backward over, the operator runs in torch operators from the next step on
    failed = [operator for operator in operators if operator.failed_on]
    assert len(failed) == 1 and (failed[0].failed_on, failed[0].failing_on) == ({gpu}, set())
