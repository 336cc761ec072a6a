"""Where a backbone step's time goes, by part of the model: a forward operator is charged to the innermost labelled
module or function that ran it, a backward operator to the forward operator whose autograd node it evaluates (the
profiler's sequence numbers pair them). Copies between memory layouts (``aten::copy_``) are also totalled on their
own, as a share of each part. ``benchmarks/profile_step.py`` is its command line."""
import collections
import contextlib
from typing import Dict, Iterator, List, Optional

import torch
from torch import nn
from torch.autograd.profiler import record_function

from mala_mm.models import MALA
from mala_mm.models.layers import (ConvDownsample, ConvFFN, ConvStem, GatedAttention, LayerNorm2d, MALABlock, MALAStage,
                                   MALAttention)
from mala_mm.ops.mala_attention import torch_ops as attention_ops
from mala_mm.ops.rope import torch_ops as rope_ops

PREFIX = 'part: '
OUTSIDE = 'loss and autograd bookkeeping'
GRADIENT_ACCUMULATION = 'gradient accumulation (AccumulateGrad)'
BACKWARD_NODE = 'autograd::engine::evaluate_function'


def part_of(module: nn.Module, parent: Optional[nn.Module], name: str) -> Optional[str]:
    """The part of the model a submodule's own operators count towards; None leaves them to its parent's part."""
    if isinstance(module, (ConvStem, ConvDownsample)):
        return 'stem and downsamples (convs, BN)'
    if isinstance(module, LayerNorm2d):
        return 'LayerNorms'
    if isinstance(module, MALABlock):
        return 'block: residual adds, layer scale'
    if isinstance(module, MALAStage):
        return 'stage: RoPE tables'
    if isinstance(parent, MALABlock) and name == 'pos':
        return 'position encoding: dwconv 3x3'
    if isinstance(module, GatedAttention):
        return 'attention: heads to a map'
    if isinstance(parent, GatedAttention):
        return {'qkvo': 'attention: qkvo projection 1x1', 'lepe': 'attention: LePE dwconv 5x5 and gate',
                'proj': 'attention: output projection 1x1'}[name]
    if isinstance(module, ConvFFN):
        return 'FFN: 1x1 convs'
    if isinstance(parent, ConvFFN) and name == 'dwconv':
        return 'FFN: GELU and dwconv 3x3'
    return None


@contextlib.contextmanager
def labelled_parts(model: MALA) -> Iterator[None]:
    """Every labelled module (and the attention functions) runs inside a profiler range named after its part."""
    handles, stack = [], []

    def enter(label):
        def hook(*_):
            stack.append(record_function(PREFIX + label))
            stack[-1].__enter__()
        return hook

    def leave(*_):
        stack.pop().__exit__(None, None, None)

    parents = {child: (parent, name) for parent in model.modules() for name, child in parent.named_children()}
    for module in model.modules():
        label = part_of(module, *parents.get(module, (None, '')))
        if label is not None:
            handles += [module.register_forward_pre_hook(enter(label)), module.register_forward_hook(leave)]

    def labelled(fn, label):
        def run(*args, **kwargs):
            with record_function(PREFIX + label):
                return fn(*args, **kwargs)
        return run

    for module in model.modules():
        if isinstance(module, GatedAttention):
            core = 'attention: MALA core (phi, z, beta, matmuls)' if isinstance(module, MALAttention) \
                else 'attention: softmax (SDPA)'
            module.attend = labelled(module.attend, core)
    # the torch operators that rotate call apply_rope by its global name in these two modules (softmax attention
    # through rope's)
    original_rope = rope_ops.apply_rope
    attention_ops.apply_rope = rope_ops.apply_rope = labelled(original_rope, 'attention: RoPE rotation')
    try:
        yield
    finally:
        attention_ops.apply_rope = rope_ops.apply_rope = original_rope
        for handle in handles:
            handle.remove()
        for module in model.modules():
            module.__dict__.pop('attend', None)


def ancestor(event, prefix: str):
    """The event itself or the innermost event around it whose name begins with ``prefix``; None if there is none."""
    while event is not None and not event.name.startswith(prefix):
        event = event.cpu_parent
    return event


def forward_part(event) -> str:
    """The part of the innermost label around the event (itself included)."""
    label = ancestor(event, PREFIX)
    return OUTSIDE if label is None else label.name[len(PREFIX):]


def charge(events) -> Dict[str, Dict[str, float]]:
    """{part: {'forward ms', 'backward ms', 'layout copies ms'}} from the profiler's events of one step."""
    events = sorted(events, key=lambda e: e.time_range.start)
    # the autograd node evaluation each event runs in, or None for a forward operator
    nodes = [ancestor(event, BACKWARD_NODE) for event in events]
    # A forward operator's event carries the sequence number the next autograd node will get; the last one to
    # carry it before the next number is the operator that made the node (a no-op ``aten::to`` before it does not).
    sequence_part = {event.sequence_nr: forward_part(event)
                     for event, node in zip(events, nodes) if event.sequence_nr >= 0 and node is None}
    parts: Dict[str, Dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    for event, node in zip(events, nodes):
        if event.name.startswith(PREFIX):
            continue
        if node is None:
            part, phase = forward_part(event), 'forward ms'
        elif 'AccumulateGrad' in node.name:
            part, phase = GRADIENT_ACCUMULATION, 'backward ms'
        else:
            part, phase = sequence_part.get(node.sequence_nr, OUTSIDE), 'backward ms'
        self_ms = event.self_cpu_time_total / 1e3
        parts[part][phase] += self_ms
        if event.name == 'aten::copy_':
            parts[part]['layout copies ms'] += self_ms
    return parts


def profile(model: nn.Module, x: torch.Tensor, train: bool, steps: int):
    def step():
        if train:
            sum(out.mean() for out in model(x)).backward()
        else:
            with torch.no_grad():
                model(x)
    step()  # warm-up: the RoPE tables' cache, the allocator
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    return prof.events()


def table_rows(parts: Dict[str, Dict[str, float]], steps: int) -> List[dict]:
    """One row per part, per step, largest first, and a last row 'all'."""
    rows = [{'part': part, 'forward ms': times['forward ms'] / steps, 'backward ms': times['backward ms'] / steps,
             'of which layout copies ms': times['layout copies ms'] / steps} for part, times in parts.items()]
    for row in rows:
        row['total ms'] = row['forward ms'] + row['backward ms']
    rows.sort(key=lambda row: -row['total ms'])
    total = {key: sum(row[key] for row in rows)
             for key in ('forward ms', 'backward ms', 'total ms', 'of which layout copies ms')}
    for row in rows:
        row['share %'] = 100 * row['total ms'] / total['total ms']
    return rows + [{'part': 'all', **total, 'share %': 100.0}]
