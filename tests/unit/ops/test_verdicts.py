"""Each kernel variant a run launches, checked at its first launch on a GPU at the call's own widths, flags and
precision, and timed against the torch operators (mala_mm.ops.verdicts): a launcher planted wrong in one variant
only is caught in a whole training step, where 'auto' runs it in torch operators with one warning and 'triton'
stops; 'auto' takes the kernels only where they are faster; the verdicts are kept in the cache, and every rank of
a job takes rank 0's.

The GPU is mocked: the kernels run in Triton's interpreter (tests/conftest.py), and a set clock gives the times.
"""
import json
import logging
import re
import warnings

import pytest
import torch

from mala_mm import MALA
from mala_mm.models.layers import attention
from mala_mm.ops import OPERATORS, TRITON_AVAILABLE, dispatch
from mala_mm.ops.depthwise import gated_depthwise_conv
from tests.helpers import feature_loss, ignore_interpreter_deprecation, relative_error
from tests.helpers.low_precision import NAMES, NEEDS_CPU_FP16, NEEDS_TRITON, TRITON_DEVICE

if TRITON_AVAILABLE:  # else NEEDS_TRITON skips these tests
    from mala_mm.ops import timing, verdict_cache, verdicts
    from mala_mm.ops.self_check import KernelMismatch
    from mala_mm.ops.triton_launch import gpu_of

pytestmark = NEEDS_TRITON

# a block per stage: heads 16 channels wide in the first stage and 32 in the others; 32 channels in the first stage
# and 64 to 128 in the others; MALA attention in the first two stages and softmax attention with RoPE in the others
ARCH = dict(embed_dims=[32, 64, 96, 128], depths=[1, 1, 1, 1], num_heads=[2, 2, 3, 4])
# the largest difference from the torch path's gradients, relative to their largest value (as in test_fallback.py):
# the variants still in kernels compute in fp32 what torch's operators round
BOUNDS = {torch.float32: 1e-4, torch.bfloat16: 0.1, torch.float16: 0.02}
# the biases of the convs ahead of a BatchNorm (the stem's, the downsamples'): gradients of zero, as rounding noise
# in either path
NOISE = re.compile(r'patch_embed\.proj\.\d+\.bias|layers\.\d\.downsample\.reduction\.bias')


class SetClock:
    """A clock that gives set times by implementation, and runs nothing."""

    def __init__(self, kernels: float, torch: float):
        self.times = {'triton': kernels, 'torch': torch}

    def milliseconds(self, run, impl, device):
        return self.times[impl]


def on_a_gpu(monkeypatch, operator, clock=None):
    """'auto' and 'triton' as on a GPU that Triton serves, for ``operator`` alone (the interpreter would take
    minutes over every operator's kernels), whose variants are decided at their first launch; fresh records and
    verdicts, and a clock on which the kernels are faster unless ``clock`` is given. Returns the GPU."""
    gpu = gpu_of(torch.empty(0, device=TRITON_DEVICE))

    def uses_triton(impl, x, asking=None):
        return impl in ('auto', 'triton') and (asking is None or asking is operator and asking.available_on(gpu))
    for module in (dispatch, attention):  # attention.py asks it which layout the projection gives
        monkeypatch.setattr(module, 'uses_triton', uses_triton)
    monkeypatch.setattr(dispatch, '_on_a_gpu', lambda x: True)
    monkeypatch.setattr(operator, 'failed_on', set())
    monkeypatch.setattr(operator, 'failing_on', set())
    monkeypatch.setattr(verdicts, 'VERDICTS', verdicts.Verdicts())
    monkeypatch.setattr(timing, 'CLOCK', clock or SetClock(kernels=1.0, torch=2.0))
    return gpu


def scaled(outputs, factor: float):
    return tuple(out * factor for out in outputs) if isinstance(outputs, tuple) else outputs * factor


def planted(monkeypatch, name: str, wrong_where) -> list:
    """The operator ``name``'s launcher, 1% off where ``wrong_where(*args)``; returns the batch sizes of the calls
    it computed wrongly, which the check's calls have one image of."""
    operator = OPERATORS[name]
    launcher, wrong_batches = operator.triton, []

    def launch(*args, **kwargs):
        outputs = launcher(*args, **kwargs)
        if not wrong_where(*args):
            return outputs
        wrong_batches.append(args[0].shape[0])
        return scaled(outputs, 1.01)
    monkeypatch.setattr(operator, 'triton', launch)
    return wrong_batches


def step_gradients(impl: str, dtype: torch.dtype, with_cp: bool = False) -> dict:
    """Every parameter's gradient after one training step of two images, under autocast to ``dtype`` unless
    fp32."""
    torch.manual_seed(0)
    model = MALA(arch=ARCH, drop_path_rate=0.1, impl=impl, with_cp=with_cp).to(TRITON_DEVICE)
    x = torch.randn(2, 3, 32, 32, device=TRITON_DEVICE)
    with torch.autocast(TRITON_DEVICE.type, dtype=dtype, enabled=dtype != torch.float32):
        torch.manual_seed(1)  # stochastic depth's draws, the same in both paths
        outputs = model(x)
    feature_loss(outputs).backward()
    return {name: p.grad.detach().cpu() for name, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(scope='module')
def torch_path():
    """The torch path's gradients, by dtype."""
    return {}


# (operator, where its launcher is wrong, the precision of the step), the four ways a variant the old check never
# ran can be wrong
PLANTS = {
    'heads of 32 or wider': ('mala_attention', lambda q, *args: q.shape[-1] >= 32, torch.float32),
    '64 channels or more': ('residual_depthwise_conv', lambda x, *args: x.shape[1] >= 64, torch.float32),
    'fp16 only': ('scaled_residual_norm', lambda x, branch, *args: branch.dtype == torch.float16, torch.float16),
    'bf16 only': ('gated_depthwise_conv', lambda y, v, *args: v.dtype == torch.bfloat16, torch.bfloat16),
}
# a step in the interpreter with the depth-wise kernels, or under bf16 autocast, takes half a minute on a slow CPU
AUTO_MARKS = {'64 channels or more': [pytest.mark.slow], 'fp16 only': [pytest.mark.slow, NEEDS_CPU_FP16],
              'bf16 only': [pytest.mark.slow]}
TRITON_MARKS = {'fp16 only': [NEEDS_CPU_FP16]}


@pytest.mark.parametrize('plant, with_cp', [
    *(pytest.param(name, False, id=name, marks=AUTO_MARKS.get(name, ())) for name in PLANTS),
    # the check runs in the forward of a checkpointed block, which its backward recomputes on the same verdicts
    pytest.param('heads of 32 or wider', True, id='heads of 32 or wider-with_cp', marks=pytest.mark.slow)])
def test_auto_runs_a_variant_planted_wrong_in_torch_operators(monkeypatch, torch_path, plant, with_cp):
    name, wrong_where, dtype = PLANTS[plant]
    if dtype not in torch_path:
        torch_path[dtype] = step_gradients('torch', dtype)
    gpu = on_a_gpu(monkeypatch, OPERATORS[name])
    wrong_batches, tables = planted(monkeypatch, name, wrong_where), logged(monkeypatch)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter('always', RuntimeWarning)
        ours = step_gradients('auto', dtype, with_cp)
    assert len(tables) == 1 and all(v.operator in tables[0] for v in verdicts.VERDICTS.known.values())
    said = [str(w.message) for w in warned if issubclass(w.category, RuntimeWarning)]
    wrong = [v.variant for v in verdicts.VERDICTS.known.values() if not v.right]
    assert wrong and len(said) == len(wrong), said  # a warning a wrong variant, at its first launch
    for variant, message in zip(wrong, said):
        assert f"{name}'s Triton kernels compute other numbers" in message and f'variant {variant} ' in message
        assert str(gpu) in message and NAMES[dtype] in variant
    assert wrong_batches and set(wrong_batches) == {1}, 'the step ran the wrong variant'  # the check's calls only
    assert all(v.choice == 'triton' for v in verdicts.VERDICTS.known.values() if v.right)
    expected = torch_path[dtype]
    errors = {key: relative_error(ours[key], expected[key]) for key in expected if not NOISE.fullmatch(key)}
    worst = max(errors, key=errors.get)
    assert errors[worst] < BOUNDS[dtype], (worst, errors[worst])


@pytest.mark.parametrize('plant', [pytest.param(name, marks=TRITON_MARKS.get(name, ())) for name in PLANTS])
def test_triton_stops_at_a_variant_planted_wrong(monkeypatch, plant):
    name, wrong_where, dtype = PLANTS[plant]
    on_a_gpu(monkeypatch, OPERATORS[name])
    wrong_batches = planted(monkeypatch, name, wrong_where)
    with pytest.raises(KernelMismatch, match=rf"impl='triton': {name}'s Triton kernels compute other numbers .* "
                                             rf"in the variant {name}\["):
        step_gradients('triton', dtype)
    assert set(wrong_batches) == {1}


def gated_inputs():
    maps = [torch.randn(2, 8, 5, 6, device=TRITON_DEVICE).contiguous(memory_format=torch.channels_last)
            for _ in range(3)]
    return (*maps, torch.randn(8, 1, 5, 5, device=TRITON_DEVICE), torch.randn(8, device=TRITON_DEVICE))


def launched(monkeypatch, operator) -> list:
    """Records the batch size of each call of ``operator``'s launcher."""
    launcher, batches = operator.triton, []

    def launch(*args, **kwargs):
        batches.append(args[0].shape[0])
        return launcher(*args, **kwargs)
    monkeypatch.setattr(operator, 'triton', launch)
    return batches


def logged(monkeypatch) -> list:
    messages = []
    monkeypatch.setattr(verdicts, 'print_log', lambda message, logger, level: messages.append(message))
    return messages


@pytest.mark.parametrize('kernels_ms, choice', [(3.0, 'torch (slower)'), (1.95, 'torch (within 5%)'),
                                                (1.0, 'triton (faster)')])
def test_auto_takes_the_kernels_only_where_faster_and_logs_the_choice_once(monkeypatch, kernels_ms, choice):
    operator = OPERATORS['gated_depthwise_conv']
    on_a_gpu(monkeypatch, operator, SetClock(kernels=kernels_ms, torch=2.0))
    batches, messages = launched(monkeypatch, operator), logged(monkeypatch)
    inputs = gated_inputs()
    for _ in range(3):
        out = gated_depthwise_conv(*inputs, impl='auto')
        dispatch.log_new_choices()  # as the backbone does at the end of each forward
    torch.testing.assert_close(out, gated_depthwise_conv(*inputs, impl='torch'), rtol=1e-5, atol=1e-5)
    in_kernels = choice.startswith('triton')
    assert batches == [1] + [2] * 3 * in_kernels  # the check's call, then the calls' own where chosen
    [table] = messages
    header, row = table.splitlines()[1:]
    assert header.split() == ['operator', 'variant', 'shape', 'dtype', 'error', 'kernels', 'ms', 'torch', 'ms',
                              'choice']
    assert row.split()[:6] == ['gated_depthwise_conv', 'C=8', 'k=5', '-', '2x8x5x6', 'fp32'] and row.endswith(choice)
    # timed on one of the call's five rows, and scaled
    assert row.split()[7:9] == [f'{5 * kernels_ms:.3f}', '10.000']


def test_triton_keeps_the_kernels_where_slower(monkeypatch):
    operator = OPERATORS['gated_depthwise_conv']
    on_a_gpu(monkeypatch, operator, SetClock(kernels=3.0, torch=2.0))
    batches = launched(monkeypatch, operator)
    gated_depthwise_conv(*gated_inputs(), impl='triton')
    assert batches == [1, 2]


def test_a_second_run_reads_the_verdicts_and_launches_no_check(monkeypatch, tmp_path):
    operator = OPERATORS['gated_depthwise_conv']
    gpu = on_a_gpu(monkeypatch, operator)
    monkeypatch.setenv('MALA_MM_CACHE', str(tmp_path / 'verdicts'))
    gated_depthwise_conv(*gated_inputs(), impl='auto')
    [path] = (tmp_path / 'verdicts').iterdir()
    kept = json.loads(path.read_text())
    assert kept['environment'] == verdict_cache.environment(gpu)
    [(variant, verdict)] = kept['verdicts'].items()
    assert variant.startswith('gated_depthwise_conv[C=8 k=5') and verdict['choice'] == 'triton'
    # the next run: a process of its own verdicts, the same cache
    monkeypatch.setattr(verdicts, 'VERDICTS', verdicts.Verdicts())
    monkeypatch.setattr(verdicts, 'check_call', lambda *args: pytest.fail('checked again'))
    monkeypatch.setattr(timing, 'CLOCK', None)  # timed again: fails
    batches = launched(monkeypatch, operator)
    gated_depthwise_conv(*gated_inputs(), impl='auto')
    assert batches == [2]


def test_a_variant_leaves_the_image_size_out():
    from mala_mm.ops.variants import variant_of
    small, large = (torch.empty(b, 64, h, w).contiguous(memory_format=torch.channels_last)
                    for b, h, w in ((1, 8, 9), (2, 200, 336)))
    weight, bias = torch.empty(64, 1, 3, 3), torch.empty(64)
    assert variant_of('residual_depthwise_conv', (small, weight, bias, True, None), None) == \
        variant_of('residual_depthwise_conv', (large, weight, bias, True, None), None)
    assert str(variant_of('residual_depthwise_conv', (large, weight, bias, True, None), torch.float16)) == \
        'residual_depthwise_conv[C=64 k=3; gelu; fp32 fp32 fp32 autocast fp16; 1 3 2 0]'


def test_map_too_large_runs_in_torch_under_auto_and_stops_triton(monkeypatch):
    from mala_mm.ops import triton_launch
    operator = OPERATORS['gated_depthwise_conv']
    gpu = on_a_gpu(monkeypatch, operator)
    monkeypatch.setattr(dispatch, '_on_a_gpu', lambda x: False)  # no check: the map alone
    monkeypatch.setattr(triton_launch, 'MAX_SPAN', 100)
    inputs = gated_inputs()
    with pytest.raises(triton_launch.MapTooLarge):
        gated_depthwise_conv(*inputs, impl='triton')
    with torch.no_grad(), pytest.warns(RuntimeWarning) as warned:
        ignore_interpreter_deprecation()  # else pytest.warns shows it again
        out = gated_depthwise_conv(*inputs, impl='auto')
    assert len(warned) == 1 and 'spans' in str(warned[0].message) and str(gpu) in str(warned[0].message)
    torch.testing.assert_close(out, gated_depthwise_conv(*inputs, impl='torch'))


def test_the_table_is_logged_once_at_info(monkeypatch):
    operator = OPERATORS['gated_depthwise_conv']
    on_a_gpu(monkeypatch, operator)
    levels = []
    monkeypatch.setattr(verdicts, 'print_log', lambda message, logger, level: levels.append(level))
    for _ in range(3):
        gated_depthwise_conv(*gated_inputs(), impl='auto')
        dispatch.log_new_choices()
    assert levels == [logging.INFO]


def _rank(rank: int, port: str, cache: str, kernels_ms: float, out: str) -> None:
    """One of two processes of a gloo group, on the mocked GPU, whose clock has the kernels take ``kernels_ms``
    against the torch operators' 2: the variants it met, the choices it took and the checks it ran, into ``out``."""
    import os

    import torch.distributed as dist
    os.environ.update(MALA_MM_CACHE=cache, MASTER_ADDR='127.0.0.1', MASTER_PORT=port)
    dist.init_process_group('gloo', rank=rank, world_size=2)
    operator = OPERATORS['gated_depthwise_conv']
    gpu = gpu_of(torch.empty(0, device=TRITON_DEVICE))
    dispatch._on_a_gpu = lambda x: True
    dispatch.uses_triton = lambda impl, x, asking=None: asking is None or asking is operator
    timing.CLOCK = SetClock(kernels=kernels_ms, torch=2.0)
    checks, check_call = [], verdicts.check_call
    verdicts.check_call = lambda *args: checks.append(1) or check_call(*args)
    torch.manual_seed(rank)  # images of other sizes on each rank
    for width in (8, 12):
        maps = [torch.randn(1 + rank, width, 5 + rank, 6).contiguous(memory_format=torch.channels_last)
                for _ in range(3)]
        gated_depthwise_conv(*maps, torch.randn(width, 1, 5, 5), torch.randn(width), impl='auto')
    choices = {variant: v.choice for (_, variant), v in verdicts.VERDICTS.known.items()}
    with open(out, 'w') as f:
        json.dump({'choices': choices, 'checks': len(checks), 'gpu': str(gpu)}, f)
    dist.destroy_process_group()


@pytest.mark.slow  # two processes of a gloo group: 10 s on a slow CPU
def test_every_rank_takes_rank_0s_choices(tmp_path):
    """Rank 0's clock has the kernels faster, rank 1's slower: both run the kernels, on rank 0's verdicts, and rank
    1 checks nothing. Each rank's images have a size of their own."""
    from tests.helpers import _TOOL_PROCESSES, free_port
    port, outs = free_port(), [str(tmp_path / f'rank{rank}.json') for rank in range(2)]
    processes = [_TOOL_PROCESSES.Process(target=_rank, args=(rank, port, str(tmp_path / f'cache{rank}'), ms, out))
                 for rank, ms, out in zip(range(2), (1.0, 3.0), outs)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(300)
    assert [process.exitcode for process in processes] == [0, 0]
    rank0, rank1 = (json.loads(open(out).read()) for out in outs)
    assert rank0['choices'] == rank1['choices'] and len(rank0['choices']) == 2
    assert set(rank0['choices'].values()) == {'triton'}
    assert (rank0['checks'], rank1['checks']) == (2, 0)


def test_a_decided_variant_launches_what_an_unchecked_call_does(monkeypatch):
    """The check's launches come at a variant's first launch only: later steps launch no more kernels than a run
    without checks (benchmarks/kernel_count.py counts those)."""
    from tests.helpers.launches import LaunchRecord
    on_a_gpu(monkeypatch, OPERATORS['gated_depthwise_conv'])
    inputs, record = gated_inputs(), LaunchRecord(monkeypatch)
    with record:
        gated_depthwise_conv(*inputs, impl='auto')
        first = record.take()
        gated_depthwise_conv(*inputs, impl='auto')
        later = record.take()
        monkeypatch.setattr(dispatch, '_on_a_gpu', lambda x: False)
        gated_depthwise_conv(*inputs, impl='auto')
        unchecked = record.take()
    assert later == unchecked == ['gated_conv_kernel'] and len(first) > len(later)


class FailingClock:
    """A clock under which the kernels fail, as they may at a call's size and not at the check's."""

    def milliseconds(self, run, impl, device):
        from mala_mm.ops.triton_launch import KernelUnavailable
        raise KernelUnavailable('gated_conv_kernel', gpu_of(torch.empty(0)), RuntimeError('out of resource'))


def test_kernels_that_fail_at_the_calls_size_leave_auto_to_torch(monkeypatch):
    operator = OPERATORS['gated_depthwise_conv']
    on_a_gpu(monkeypatch, operator, FailingClock())
    batches, inputs = launched(monkeypatch, operator), gated_inputs()
    out = gated_depthwise_conv(*inputs, impl='auto')
    torch.testing.assert_close(out, gated_depthwise_conv(*inputs, impl='torch'))
    [verdict] = verdicts.VERDICTS.known.values()
    assert batches == [1] and verdict.choice == 'torch' and 'out of resource' in verdict.why
