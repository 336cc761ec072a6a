"""benchmarks/kernel_count.py: what it counts, and MALA-T's kernels per step held at or below the committed counts
(results/cpu/kernel_count.json), so that no change adds launches unnoticed. A backbone's count does not depend on
the input's size, so the committed full-size counts bound the counts of a small input."""
import json
import os

import pytest
import torch

from tests.helpers import ROOT

BENCHMARKS = os.path.join(ROOT, 'benchmarks')
COMMITTED = os.path.join(BENCHMARKS, 'results', 'cpu', 'kernel_count.json')


@pytest.fixture(scope='module')
def kernel_count():
    import kernel_count  # on the path from pytest.ini, importing Triton under its interpreter
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


def test_mala_t_launches_no_more_kernels_than_committed(kernel_count):
    from mala_mm import MALA
    committed = {(row['mode'], row['dtype']): row['kernels'] for row in json.load(open(COMMITTED))['rows']
                 if row['model'] == 'MALA-T' and row['step'] == 'backbone 1280x800'}
    assert set(committed) == {(mode, dtype) for mode in ('eval', 'train') for dtype in ('fp32', 'bf16')}
    model = MALA(arch='tiny', impl='triton')
    for mode, step in kernel_count.backbone_steps(model, torch.randn(1, 3, 64, 96)).items():
        for dtype_name, dtype in kernel_count.AUTOCAST.items():
            kernels = kernel_count.count(model, step, dtype, kernel_count.backbone_part)['kernels']
            assert kernels <= committed[mode, dtype_name], (mode, dtype_name, kernels)
