"""The kernels checked against the torch operators at their first use on a GPU (mala_mm.ops.self_check): every
operator's check passes on the kernels as they are, and a planted kernel that returns wrong values is found, handed
to the torch operators under 'auto' with a warning that names the operator, the GPU and the difference, and stops
the run under 'triton'. The GPU is mocked: the kernels run on the GPU where there is one, else in Triton's
interpreter (tests/conftest.py)."""
import os
import subprocess
import sys

import pytest
import torch

from mala_mm.ops import OPERATORS, TRITON_AVAILABLE, dispatch
from mala_mm.ops.depthwise import gated_depthwise_conv
from tests.helpers import ROOT, call_tool, ignore_interpreter_deprecation, tool_env, warnings_as_errors
from tests.helpers.low_precision import NEEDS_TRITON, TRITON_DEVICE

if TRITON_AVAILABLE:  # a Triton the kernels run on; else NEEDS_TRITON skips these tests
    from mala_mm.ops.self_check import KernelMismatch, check_operator
    from mala_mm.ops.triton_launch import gpu_of
else:
    check_operator = None

pytestmark = NEEDS_TRITON


@pytest.mark.parametrize('name', sorted(OPERATORS))
def test_each_operators_kernels_pass_their_check(name):
    assert check_operator(OPERATORS[name], TRITON_DEVICE) is None


def planted(monkeypatch, name: str, factor: float = 1.01):
    """The operator ``name``'s launcher, its outputs off by ``factor``: a kernel that compiles and computes wrongly."""
    operator = OPERATORS[name]
    launcher = operator.triton

    def wrong(*args, **kwargs):
        return launcher(*args, **kwargs) * factor
    monkeypatch.setattr(operator, 'triton', wrong)
    return operator


def test_a_kernel_that_computes_wrongly_is_found():
    operator = OPERATORS['gated_depthwise_conv']
    with pytest.MonkeyPatch.context() as monkeypatch:
        planted(monkeypatch, 'gated_depthwise_conv')
        problem = check_operator(operator, TRITON_DEVICE)
    assert problem.startswith("output 0 of case 0 differs from the torch operators' by 0.01 relative (bound 0.0001)")


@pytest.fixture
def on_a_gpu(monkeypatch):
    """'auto' and 'triton' as on a GPU that Triton serves, whose kernels are checked at their first use; the
    operator's records fresh."""
    gpu = gpu_of(torch.empty(0, device=TRITON_DEVICE))
    monkeypatch.setattr(dispatch, '_on_a_gpu', lambda x: True)
    monkeypatch.setattr(dispatch, 'uses_triton', lambda impl, x, operator=None: impl == 'triton' or (
        impl == 'auto' and (operator is None or operator.available_on(gpu))))
    operator = OPERATORS['gated_depthwise_conv']
    for record in ('failed_on', 'failing_on', 'checked_on'):
        monkeypatch.setattr(operator, record, set())
    return gpu


def gated_inputs():
    maps = [torch.randn(2, 8, 5, 6, device=TRITON_DEVICE).contiguous(memory_format=torch.channels_last)
            for _ in range(3)]
    return (*maps, torch.randn(8, 1, 5, 5, device=TRITON_DEVICE), torch.randn(8, device=TRITON_DEVICE))


def test_auto_hands_a_wrong_kernels_operator_to_torch_at_its_first_use(on_a_gpu, monkeypatch):
    operator = planted(monkeypatch, 'gated_depthwise_conv')
    inputs = gated_inputs()
    with pytest.warns(RuntimeWarning) as warned:
        ignore_interpreter_deprecation()
        out = gated_depthwise_conv(*inputs, impl='auto')
    message = str(warned[0].message)
    assert len(warned) == 1 and "gated_depthwise_conv's Triton kernels compute other numbers" in message
    assert str(on_a_gpu) in message and 'differs from the torch operators' in message
    torch.testing.assert_close(out, gated_depthwise_conv(*inputs, impl='torch'))
    assert not operator.available_on(on_a_gpu)
    with warnings_as_errors():  # checked once, said once
        gated_depthwise_conv(*inputs, impl='auto')


def test_triton_stops_on_a_wrong_kernel(on_a_gpu, monkeypatch):
    planted(monkeypatch, 'gated_depthwise_conv')
    with pytest.raises(KernelMismatch, match=r"impl='triton': gated_depthwise_conv's Triton kernels compute other "
                                             r"numbers than its torch operators on Triton interpreter"):
        gated_depthwise_conv(*gated_inputs(), impl='triton')


def test_kernels_that_pass_their_check_run_at_their_first_use(on_a_gpu):
    inputs = gated_inputs()
    with warnings_as_errors():
        out = gated_depthwise_conv(*inputs, impl='auto')
    assert OPERATORS['gated_depthwise_conv'].checked_on == {on_a_gpu}
    assert OPERATORS['gated_depthwise_conv'].available_on(on_a_gpu)
    torch.testing.assert_close(out, gated_depthwise_conv(*inputs, impl='torch'), rtol=1e-5, atol=1e-5)


def test_the_command_checks_every_operator(tmp_path):
    """tools/check_kernels.py, here on Triton's interpreter: a line an operator, exit 0."""
    result = call_tool(['check_kernels.py', '--device', 'cpu'], tmp_path, TRITON_INTERPRET='1')
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(': ')[1] for line in lines] == list(OPERATORS)
    assert all(line.endswith('the kernels agree with the torch operators') for line in lines)


@pytest.mark.slow  # a process of its own, whose imports take seconds
def test_the_command_fails_on_a_wrong_kernel(tmp_path):
    """The tool in a process of its own, with gated_depthwise_conv's launcher off by 1% planted first."""
    code = f"""
import runpy, sys
from mala_mm.ops import OPERATORS
operator = OPERATORS['gated_depthwise_conv']
launcher = operator.triton
operator.triton = lambda *args, **kwargs: launcher(*args, **kwargs) * 1.01
sys.argv = ['check_kernels.py', '--device', 'cpu']
runpy.run_path({os.path.join(ROOT, 'tools', 'check_kernels.py')!r}, run_name='__main__')
"""
    result = subprocess.run([sys.executable, '-c', code], cwd=tmp_path, env=tool_env(TRITON_INTERPRET='1'),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-2000:]
    assert 'gated_depthwise_conv: output 0 of case 0 differs' in result.stdout
    assert 'error: the kernels of gated_depthwise_conv on cpu differ from the torch operators' in result.stderr
