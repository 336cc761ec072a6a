"""The time a call's variant takes in its kernels and in its torch operators, forward and backward, on its GPU.

At the first launch of a variant, :mod:`.verdicts` asks :func:`time_call` how long the call takes each way:
:data:`CLOCK` runs a forward and a backward :data:`WARMUP` times, then :data:`REPEATS` times between two CUDA
events, and gives the mean. The inputs are random, of the call's widths, dtypes and layout and of its batch and
columns, but of a :func:`fraction` of its rows (of its tokens): what the timing allocates (the inputs, their
gradients, the outputs, their gradients and what the backward keeps) stays within one copy of the call's own
outputs, taken to be at least one of its maps, and is freed before the call runs. The times are scaled back to the
call's rows. Tests replace :data:`CLOCK` by one that gives set times.
"""
import time
from typing import Callable, Sequence, Tuple

import torch

from .torch_compat import autocast_of
from .variants import ARGUMENTS, spatial_size, variant_inputs

WARMUP, REPEATS = 2, 5


class Clock:
    """Milliseconds a run takes on the GPU (CUDA events), or on the CPU where the tensors are there."""

    def milliseconds(self, run: Callable[[], None], impl: str, device: torch.device) -> float:
        """The mean time of ``run()`` after :data:`WARMUP` runs; ``impl`` ('triton' or 'torch') says whose it is."""
        for _ in range(WARMUP):
            run()
        if device.type != 'cuda':
            start = time.perf_counter()
            for _ in range(REPEATS):
                run()
            return (time.perf_counter() - start) * 1000 / REPEATS
        with torch.cuda.device(device):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(REPEATS):
                run()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / REPEATS


CLOCK = Clock()


def fraction(name: str) -> float:
    """The share of a call's rows that its timing takes. Its allocations come to about three copies of each map it
    takes (the map, the copy each run takes, its gradient) and three of its output (the output, its gradient, and
    what the backward keeps of the torch operators' intermediates); the output is at least one map of the call."""
    maps = sum(kind in ('map', 'heads') for kind in ARGUMENTS[name])
    return 1 / (3 * maps + 3)


def time_call(operator, args: Sequence) -> Tuple[float, float]:
    """(kernels ms, torch operators ms) of a forward and a backward of ``operator``'s call on ``args`` under the
    autocast now on, at the call's full size (measured on a :func:`fraction` of its rows, and scaled)."""
    batch, rows, columns = spatial_size(operator.name, args)
    if rows == 1:  # tokens: a share of them
        timed_rows, timed_columns = 1, max(1, round(columns * fraction(operator.name)))
        scale = columns / timed_columns
    else:
        timed_rows, timed_columns = max(1, round(rows * fraction(operator.name))), columns
        scale = rows / timed_rows
    inputs, wanted = variant_inputs(operator.name, args, batch, timed_rows, timed_columns,
                                    torch.Generator().manual_seed(0))
    autocast, device = autocast_of(args[0]), args[0].device
    times = []
    for impl, fn in (('triton', operator.triton), ('torch', operator.torch)):
        with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None), torch.enable_grad(), \
                torch.inference_mode(False), torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            times.append(CLOCK.milliseconds(_step(fn, inputs, wanted, ARGUMENTS[operator.name]), impl, device) * scale)
    return times[0], times[1]


def _step(fn: Callable, inputs: tuple, wanted: Sequence[int], kinds: Sequence) -> Callable[[], None]:
    """A forward and a backward of ``fn`` on ``inputs``, with gradients of ones for its outputs, freed as it ends.
    Each run takes copies of the maps (rotate_qk writes into its map) and of the running statistics."""
    def run():
        leaves = [t.detach().requires_grad_() if i in wanted else t.clone() if kind == 'stat' and t is not None
                  else t for i, (t, kind) in enumerate(zip(inputs, kinds))]
        outputs = fn(*(t * 1 if i in wanted else t for i, t in enumerate(leaves)))
        outputs = [out for out in (outputs if isinstance(outputs, tuple) else (outputs, )) if out.requires_grad]
        torch.autograd.grad(outputs, [leaves[i] for i in wanted], [torch.ones_like(out) for out in outputs],
                            allow_unused=True)
    return run
