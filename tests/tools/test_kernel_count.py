"""benchmarks/kernel_count.py: what it counts, and MALA-T's kernels and memory per step held at or below the
committed counts, so that no change adds launches or memory unnoticed. A backbone's kernels do not depend on the
input's size, so the committed full-size counts (results/cpu/kernel_count.json) bound those of a small input; its
memory does, and is held to the committed counts at the small input (kernel_count_quick.json)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.helpers import ROOT
from tests.helpers.low_precision import NEEDS_TRITON

BENCHMARKS = os.path.join(ROOT, 'benchmarks')
COMMITTED = os.path.join(BENCHMARKS, 'results', 'cpu', 'kernel_count.json')
COMMITTED_QUICK = os.path.join(BENCHMARKS, 'results', 'cpu', 'kernel_count_quick.json')

# the counts run MALA's default CUDA path, its kernels in Triton's interpreter
pytestmark = NEEDS_TRITON


@pytest.fixture(scope='module')
def kernel_count():
    from benchmarks import kernel_count  # as python -m benchmarks.kernel_count imports it, Triton under its interpreter
    return kernel_count


def test_a_step_counts_its_launches_casts_and_parts_but_not_views(kernel_count):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.GELU())
    x = torch.randn(1, 3, 8, 8)

    def step(autocast):
        with torch.no_grad(), autocast():
            model(x).permute(0, 2, 3, 1).sum()  # the view is free; the sum is outside any module
    fp32 = kernel_count.count(model, step, None, lambda name: {'0': 'conv', '1': 'gelu'}.get(name))
    assert fp32['kernels'] == 3 and fp32['casts'] == 0
    assert fp32['parts'] == {'conv': 1, 'gelu': 1, kernel_count.OUTSIDE: 1}
    # read and written: the conv's input, weight, bias and output, GELU's input and output, the sum's and its result
    assert fp32['bytes'] == 4 * ((192 + 12 + 4 + 256) + (256 + 256) + (256 + 1))
    bf16 = kernel_count.count(model, step, torch.bfloat16, lambda name: None)
    assert bf16['casts'] == 3 and bf16['kernels'] == 6  # the conv's input, weight and bias


def test_multi_tensor_operators_count_as_cudas_launches(kernel_count):
    def launches(shapes, strides_differ=False):
        sources = [torch.empty(shape) for shape in shapes]
        destinations = [torch.empty(shape, dtype=torch.bfloat16) for shape in shapes]
        if strides_differ:
            destinations[0] = destinations[0].t().contiguous().t()
        return kernel_count.foreach_launches([destinations, sources])
    assert launches([(4, 4)] * 3) == 1
    assert launches([(4, 4)] * 130) == 3  # 64 tensors a launch for two lists
    assert launches([(1000, 65536)]) == 4  # 320 blocks of 65536 elements a launch
    assert launches([(4, 5)] * 3, strides_differ=True) == 3  # the fallback: a kernel a tensor
    # counted in a step although, in place, it returns nothing
    destinations, sources = [torch.empty(4), torch.empty(4)], [torch.ones(4), torch.ones(4)]
    copied = kernel_count.count(torch.nn.Identity(), lambda autocast: torch._foreach_copy_(destinations, sources),
                                None, lambda name: None)
    assert copied['kernels'] == 1 and copied['bytes'] == 4 * 4 * 4


def test_a_step_holds_what_it_allocates_and_saves_what_autograd_keeps(kernel_count):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.GELU())
    x = torch.randn(1, 3, 8, 8)  # made before the step: neither held nor saved by it

    def step(autocast):
        model.zero_grad(set_to_none=True)
        with autocast():
            y = model(x)
        y.sum().backward()
    counts = kernel_count.count(model, step, None, lambda name: None)
    assert counts['saved_bytes'] == 4 * 256  # GELU's input; the conv's input and weight outlive the step
    # at the peak, in GELU's backward: the conv's output (saved), GELU's output (the step's y), the loss, its
    # gradient and GELU's input gradient; the parameters' gradients come after the conv's output is released
    assert counts['peak_bytes'] == 4 * (256 + 256 + 1 + 1 + 256)


def _mala_t_counts(kernel_count, impl: str, modes) -> dict:
    from mala_mm import MALA
    model = MALA(arch='tiny', impl=impl)
    counts = {}
    for mode, step in kernel_count.backbone_steps(model, torch.randn(1, 3, 64, 96)).items():
        for dtype_name, dtype in kernel_count.AUTOCAST.items():
            if mode in modes:
                counts[mode, dtype_name] = kernel_count.count(model, step, dtype, kernel_count.backbone_part)
    return counts


def _committed(path: str, model: str, step: str) -> dict:
    return {(row['mode'], row['dtype']): row for row in json.load(open(path))['rows']
            if row['model'] == model and row['step'] == step}


def test_mala_t_launches_no_more_kernels_and_holds_no_more_memory_than_committed(kernel_count):
    kernels = _committed(COMMITTED, 'MALA-T', 'backbone 1280x800')
    assert set(kernels) == {(mode, dtype) for mode in ('eval', 'train') for dtype in ('fp32', 'bf16')}
    for name, impl, modes in (('MALA-T', 'triton', ('eval', 'train')), (kernel_count.TORCH_PATH, 'torch', ('train',))):
        memory = _committed(COMMITTED_QUICK, name, 'backbone 96x64')
        for (mode, dtype), counts in _mala_t_counts(kernel_count, impl, modes).items():
            if name == 'MALA-T':
                assert counts['kernels'] <= kernels[mode, dtype]['kernels'], (mode, dtype, counts['kernels'])
            if mode == 'train':
                for key in ('saved_bytes', 'peak_bytes'):
                    assert counts[key] <= memory[mode, dtype][key], (name, dtype, key, counts[key])


def test_a_benchmark_runs_as_a_module_of_the_package():
    """As a user runs one, from the repository root: its relative imports of common and its siblings resolve."""
    result = subprocess.run([sys.executable, '-m', 'benchmarks.kernel_count', '--help'], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith('usage: ')
