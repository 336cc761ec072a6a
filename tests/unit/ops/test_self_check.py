"""The kernels checked against the torch operators at their first use on a GPU (mala_mm.ops.self_check): every
operator's check passes on the kernels as they are, and a planted kernel that returns wrong values is found, handed
to the torch operators under 'auto' with a warning that names the operator, the GPU and the difference, and stops
the run under 'triton'. The GPU is mocked: the kernels run on the GPU where there is one, else in Triton's
interpreter (tests/conftest.py)."""
import os
import runpy
import subprocess
import sys

import pytest
import torch

from mala_mm.ops import OPERATORS, TRITON_AVAILABLE, dispatch
from mala_mm.ops.depthwise import gated_depthwise_conv
from tests.helpers import ROOT, call_tool, ignore_interpreter_deprecation, tool_env, warnings_as_errors
from tests.helpers.low_precision import NEEDS_CPU_FP16, NEEDS_TRITON, TRITON_DEVICE

if TRITON_AVAILABLE:  # a Triton the kernels run on; else NEEDS_TRITON skips these tests
    from mala_mm.ops import timing, verdicts
    from mala_mm.ops.self_check import KernelMismatch, check_call, check_operator, sample_cases
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
        outputs = launcher(*args, **kwargs)
        return tuple(out * factor for out in outputs) if isinstance(outputs, tuple) else outputs * factor
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
    for record in ('failed_on', 'failing_on'):
        monkeypatch.setattr(operator, record, set())
    monkeypatch.setattr(verdicts, 'VERDICTS', verdicts.Verdicts())
    monkeypatch.setattr(timing, 'CLOCK', SetClock(kernels=1.0, torch=2.0))
    return gpu


class SetClock:
    """A clock that gives set times, by implementation, and runs nothing."""

    def __init__(self, kernels: float, torch: float):
        self.times = {'triton': kernels, 'torch': torch}

    def milliseconds(self, run, impl, device):
        return self.times[impl]


def gated_inputs():
    maps = [torch.randn(2, 8, 5, 6, device=TRITON_DEVICE).contiguous(memory_format=torch.channels_last)
            for _ in range(3)]
    return (*maps, torch.randn(8, 1, 5, 5, device=TRITON_DEVICE), torch.randn(8, device=TRITON_DEVICE))


def test_auto_hands_a_wrong_kernels_operator_to_torch_at_its_first_use(on_a_gpu, monkeypatch):
    planted(monkeypatch, 'gated_depthwise_conv')
    inputs = gated_inputs()
    with pytest.warns(RuntimeWarning) as warned:
        ignore_interpreter_deprecation()
        out = gated_depthwise_conv(*inputs, impl='auto')
    message = str(warned[0].message)
    assert len(warned) == 1 and "gated_depthwise_conv's Triton kernels compute other numbers" in message
    assert str(on_a_gpu) in message and 'differs from the torch operators' in message
    torch.testing.assert_close(out, gated_depthwise_conv(*inputs, impl='torch'))
    assert [(gpu, verdict.right) for (gpu, _), verdict in verdicts.VERDICTS.known.items()] == [(on_a_gpu, False)]
    with warnings_as_errors():  # checked once, said once
        gated_depthwise_conv(*inputs, impl='auto')


def test_triton_stops_on_a_wrong_kernel(on_a_gpu, monkeypatch):
    planted(monkeypatch, 'gated_depthwise_conv')
    with pytest.raises(KernelMismatch, match=r"impl='triton': gated_depthwise_conv's Triton kernels compute other "
                                             r"numbers than its torch operators in the variant "
                                             r"gated_depthwise_conv\[C=8 k=5; .*\] on Triton interpreter"):
        gated_depthwise_conv(*gated_inputs(), impl='triton')


def test_kernels_that_pass_their_check_run_at_their_first_use(on_a_gpu):
    inputs = gated_inputs()
    with warnings_as_errors():
        out = gated_depthwise_conv(*inputs, impl='auto')
    [((gpu, variant), verdict)] = verdicts.VERDICTS.known.items()
    assert gpu == on_a_gpu and variant.startswith('gated_depthwise_conv[C=8 k=5; -; fp32')
    assert (verdict.right, verdict.choice) == (True, 'triton')
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


def test_the_command_has_nothing_to_check_where_triton_is_too_old(monkeypatch, capsys):
    """torch 2.1's wheels pin Triton 2.1: the torch operators serve every device, which is no failure."""
    monkeypatch.setattr(dispatch, 'TRITON_AVAILABLE', False)
    monkeypatch.setattr(dispatch, 'TRITON_MISSING', 'Triton 2.1.0 is installed')
    monkeypatch.setattr(sys, 'argv', ['check_kernels.py'])
    runpy.run_path(os.path.join(ROOT, 'tools', 'check_kernels.py'), run_name='__main__')
    assert capsys.readouterr().out == (
        'nothing to check: the kernels need Triton 3.2 or newer, and Triton 2.1.0 is installed, so every device runs '
        "the torch operators, which impl='auto' takes there\n")


# the tool with a config, as on a GPU: the kernels of ``operator`` alone (the interpreter would take minutes over all
# of them), each variant checked at its first launch, a clock that has them faster, and ``plant`` run first
CONFIG_RUN = """
import runpy, sys
from mala_mm.models.layers import attention
from mala_mm.ops import OPERATORS, dispatch, timing
operator = OPERATORS[{operator!r}]
dispatch._on_a_gpu = lambda x: True
dispatch.uses_triton = attention.uses_triton = lambda impl, x, asking=None: asking is None or asking is operator


class SetClock:
    def milliseconds(self, run, impl, device):
        return {{'triton': 1.0, 'torch': 2.0}}[impl]


timing.CLOCK = SetClock()
{plant}
sys.argv = ['check_kernels.py', {config!r}, '--device', 'cpu', '--shape', '64', '64', '--images', '1']
runpy.run_path({tool!r}, run_name='__main__')
"""


@pytest.mark.slow  # two processes of their own, whose imports take seconds
def test_the_command_checks_the_variants_of_a_configs_step(tmp_path):
    """tools/check_kernels.py CONFIG: the table of the step's variants, exit 0; with a variant planted wrong (LePE's
    at 64 channels), exit 2 naming it."""
    config = tmp_path / 'small.py'
    config.write_text(f"_base_ = [{os.path.join(ROOT, 'configs/detection/cascade_mask_rcnn_mala_t_builtin.py')!r}]\n"
                      "model = dict(backbone=dict(arch=dict(_delete_=True, embed_dims=[32, 64, 96, 128], "
                      "depths=[1, 1, 1, 1], num_heads=[1, 2, 3, 4])))\n")
    tool = os.path.join(ROOT, 'tools', 'check_kernels.py')
    wrong = ("launcher = operator.triton\n"
             "operator.triton = lambda *a, **k: launcher(*a, **k) * (1.01 if a[1].shape[1] == 64 else 1)")
    results = [subprocess.run([sys.executable, '-c', CONFIG_RUN.format(operator='gated_depthwise_conv', plant=plant,
                                                                       config=str(config), tool=tool)],
                              cwd=tmp_path, env=tool_env(TRITON_INTERPRET='1', MALA_MM_CACHE=str(tmp_path / name)),
                              capture_output=True, text=True, timeout=600)
               for name, plant in (('right', ''), ('wrong', wrong))]
    right, planted_wrong = results
    assert right.returncode == 0, right.stderr[-2000:]
    rows = [line.split() for line in right.stdout.splitlines() if line.startswith('gated_depthwise_conv')]
    assert [row[1] for row in rows] == ['C=32', 'C=64', 'C=96', 'C=128'] and all(
        row[-2:] == ['triton', '(faster)'] for row in rows)
    assert planted_wrong.returncode == 2, planted_wrong.stderr[-2000:]
    assert 'gated_depthwise_conv  C=64 k=5' in planted_wrong.stdout
    assert 'error: on cpu, the kernels of gated_depthwise_conv[C=64 k=5;' in planted_wrong.stderr


@pytest.mark.parametrize('config, amp, size, dtype', [
    ('detection/mask_rcnn_mala_s.py', False, (800, 1344), torch.float16),
    ('detection/mask_rcnn_mala_s_3x.py', False, (800, 1344), torch.float16),
    ('segmentation/fpn_mala_b.py', False, (512, 512), None),
    ('segmentation/fpn_mala_b.py', True, (512, 512), torch.float16)])
def test_the_command_takes_a_configs_training_size_and_precision(config, amp, size, dtype):
    """On a GPU: a paper config's largest training scale, padded to 32, and its AmpOptimWrapper's fp16 (or
    tools/train.py --amp's)."""
    from mala_tools.kernel_step import step_dtype, training_size
    from tests.helpers import CONFIG_ROOT, load_config
    cfg = load_config(CONFIG_ROOT / config)
    assert training_size(cfg) == size and step_dtype(cfg, amp, torch.device('cuda')) == dtype


def low_precision_call(name: str, dtype: torch.dtype) -> tuple:
    """The last of the operator's sample calls with its maps in ``dtype`` (a stream of its own in fp32, as the
    blocks give the residual operators), for a call under autocast to ``dtype``."""
    from mala_mm.ops.variants import ARGUMENTS
    args, _ = sample_cases(name, TRITON_DEVICE, torch.Generator().manual_seed(0))[-1]
    low = tuple(t.to(dtype) if kind in ('map', 'heads') else t for t, kind in zip(args, ARGUMENTS[name]))
    return (args[0], *low[1:]) if name.startswith('scaled_residual') else low


@pytest.mark.parametrize('dtype', [pytest.param(torch.bfloat16, id='bf16'),
                                   pytest.param(torch.float16, id='fp16', marks=NEEDS_CPU_FP16)])
@pytest.mark.parametrize('name', sorted(OPERATORS))
def test_in_low_precision_the_check_passes_rounding_and_finds_one_percent(monkeypatch, name, dtype):
    """Under autocast, on maps of the low precision: the kernels as they are pass, within the torch operators'
    own rounding; off by 1%, they fail."""
    args = low_precision_call(name, dtype)
    with torch.autocast(TRITON_DEVICE.type, dtype=dtype):
        assert check_call(OPERATORS[name], args)[0] is None
        operator = planted(monkeypatch, name)
        problem, _ = check_call(operator, args)
    assert problem is not None and 'off the fp64 reference' in problem
