"""Which implementation serves each kernel variant on a GPU: the verdicts of its check and its timing, once.

At the first launch of a variant (:mod:`.variants`) on a GPU, :meth:`Verdicts.of` finds its verdict: kept in the
user's cache from an earlier run in the same environment (:mod:`.verdict_cache`), else found there and then. To find
one, the variant is checked against its torch operators on small inputs (:func:`~.self_check.check_call`) and,
where it is right, timed both ways at the call's size (:func:`~.timing.time_call`). The kernels serve 'auto' where
they are right and faster than the torch operators by more than :data:`MARGIN`; within it, the torch operators
serve, which every GPU runs the same way. 'triton' keeps the kernels where they are right and stops where they are
not (:mod:`.dispatch`). The new verdicts are logged as one table (:meth:`Verdicts.log_choices`) at the end of the
backbone's forward (:func:`~.dispatch.log_new_choices`): in training, the first forward meets every variant.

Every rank of a job runs the same choices. A variant leaves the image size out, so every rank of a job that trains
one model meets the same variants in the same order, whatever the size of its images, as it meets DDP's buckets: at
each variant new to the process, rank 0 finds (or reads) the verdict and broadcasts it with the variant, and the
others take it without a check or a timing, and raise :class:`RanksDisagree` where rank 0 named another variant
(they would otherwise wait, or take a verdict on another variant). Code that only some ranks run (a rank 0's
visualisation) should run with impl='torch', or after every rank has met its variants. A verdict is taken in the
process group that is initialized when the variant is first met; without one, each process decides for itself.
"""
import logging
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
from mmengine.logging import print_log

from . import timing, verdict_cache
from .self_check import check_call, precision_of
from .torch_compat import autocast_of
from .triton_launch import KernelUnavailable, MapTooLarge, gpu_of
from .variants import NAMES, variant_of

# the kernels serve 'auto' only where they take less than 1 - MARGIN of the torch operators' time: within it, the
# two are as fast as a timing of a few repetitions can tell, and the torch operators serve
MARGIN = 0.05


class RanksDisagree(RuntimeError):
    """Ranks of a job that met different kernel variants where they decide them together."""


class Verdict(NamedTuple):
    """Of one variant on one kind of GPU: whether its kernels are right, how fast each implementation is, and
    which one serves 'auto'."""
    operator: str
    variant: str
    shape: str  # of the call that met it first, e.g. '2x64x200x336'
    dtype: str  # the precision it computes in
    right: bool
    problem: Optional[str]  # what differs, where the kernels are not right
    error: Optional[float]  # the kernels' largest error (relative to the torch operators' in fp32, else to fp64)
    kernels_ms: Optional[float]
    torch_ms: Optional[float]
    choice: str  # 'triton' or 'torch'
    why: str


def find(operator, variant: str, args) -> Verdict:
    """The verdict on ``variant`` of ``operator``, from a check and a timing of the call on ``args``."""
    first = args[0]
    shape, dtype = 'x'.join(map(str, first.shape)), NAMES[precision_of(args, autocast_of(first))]
    try:
        problem, error = check_call(operator, args)
    except KernelUnavailable as failure:
        problem, error = str(failure), None
    if problem is not None:
        return Verdict(operator.name, variant, shape, dtype, False, problem, error, None, None, 'torch', 'wrong')
    try:
        kernels_ms, torch_ms = timing.time_call(operator, args)
    except (KernelUnavailable, MapTooLarge) as failure:  # right on small inputs, but not at the call's size
        return Verdict(operator.name, variant, shape, dtype, True, None, error, None, None, 'torch',
                       f'kernels fail at its size: {failure}')
    if kernels_ms < (1 - MARGIN) * torch_ms:
        choice, why = 'triton', 'faster'
    else:
        choice, why = 'torch', 'slower' if kernels_ms >= torch_ms else f'within {MARGIN:.0%}'
    return Verdict(operator.name, variant, shape, dtype, True, None, error, kernels_ms, torch_ms, choice, why)


def _kept_or_found(operator, gpu, variant: str, args) -> Verdict:
    kept = verdict_cache.load(gpu).get(variant)
    if kept is not None and set(kept) == set(Verdict._fields):
        return Verdict(**kept)
    verdict = find(operator, variant, args)
    verdict_cache.store(gpu, variant, verdict._asdict())
    return verdict


def _distributed() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def agreed(variant: str, decide: Callable[[], Verdict]) -> Verdict:
    """``decide()`` alone, or in a process group rank 0's, broadcast to every rank with the variant it is on."""
    if not _distributed():
        return decide()
    dist = torch.distributed
    payload = [variant, None, None]
    if dist.get_rank() == 0:
        try:
            payload[1] = decide()
        except Exception as error:  # every rank stops, not rank 0 alone while the others wait
            payload[2] = f'{type(error).__name__}: {error}'
            dist.broadcast_object_list(payload, src=0)
            raise
    dist.broadcast_object_list(payload, src=0)
    if payload[2] is not None:
        raise RanksDisagree(f'rank 0 failed to decide the kernel variant {variant}: {payload[2]}')
    if payload[0] != variant:
        raise RanksDisagree(f'rank {dist.get_rank()} met the kernel variant {variant} where rank 0 met '
                            f'{payload[0]}: every rank must launch the same variants in the same order')
    return payload[1]


class Verdicts:
    """The verdicts this process runs on, by GPU and variant, and those not logged yet."""

    def __init__(self):
        self.known: Dict[Tuple[object, str], Verdict] = {}
        self.unlogged: List[Tuple[object, Verdict]] = []

    def of(self, operator, args) -> Tuple[Verdict, object, bool]:
        """(the verdict on the variant of ``operator`` that a call on ``args`` launches, the GPU, whether it is new
        to this process). ``args``: the operator's arguments, its first a tensor on the GPU."""
        gpu = gpu_of(args[0])
        variant = str(variant_of(operator.name, args, autocast_of(args[0])))
        verdict = self.known.get((gpu, variant))
        if verdict is not None:
            return verdict, gpu, False
        verdict = agreed(variant, lambda: _kept_or_found(operator, gpu, variant, args))
        self.known[gpu, variant] = verdict
        self.unlogged.append((gpu, verdict))
        return verdict, gpu, True

    def log_choices(self) -> None:
        """Logs the verdicts not logged yet, as one table."""
        if not self.unlogged:
            return
        rows = [('operator', 'variant', 'shape', 'dtype', 'error', 'kernels ms', 'torch ms', 'choice')]
        for gpu, v in self.unlogged:
            widths_and_flags = v.variant[v.variant.index('[') + 1:].split('; ')[:2]
            rows.append((v.operator, ' '.join(widths_and_flags), v.shape, v.dtype, _number(v.error, '.2g'),
                         _number(v.kernels_ms, '.3f'), _number(v.torch_ms, '.3f'), f'{v.choice} ({v.why})'))
        gpus = sorted({str(gpu) for gpu, _ in self.unlogged})
        self.unlogged = []
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ['  '.join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
        print_log(f"The Triton kernels' variants on {', '.join(gpus)}: which implementation serves impl='auto' "
                  f'(kernels only where right and over {MARGIN:.0%} faster)\n' + '\n'.join(lines),
                  logger='current', level=logging.INFO)


def _number(value: Optional[float], spec: str) -> str:
    return '-' if value is None else format(value, spec)


# the verdicts of this process
VERDICTS = Verdicts()
