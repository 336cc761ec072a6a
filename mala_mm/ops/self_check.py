"""The kernels checked against the torch operators on the GPU that runs them, before they serve a run.

A kernel that fails to compile or launch raises, and 'auto' hands its operator to the torch operators
(:mod:`.dispatch`); a kernel that compiles but computes wrong numbers on some GPU or some Triton would go unnoticed.
So at the first launch of each variant (:mod:`.variants`) on a GPU, :mod:`.verdicts` has :func:`check_call` run it
on small inputs of the call's own widths, dtypes, flags and layout, under the call's autocast, in its kernels and in
its torch operators, forward and every gradient, and compare the two at the call's precision (:func:`compare`).
Where they differ, 'auto' runs that variant in torch operators on that GPU with a warning that names the operator,
the variant, the GPU and the difference; 'triton' raises :class:`KernelMismatch`. :func:`check_operator` checks an
operator's usual calls in fp32 alone, for ``tools/check_kernels.py``.
"""
import contextlib
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .torch_compat import autocast_of
from .variants import variant_inputs

# the check's inputs: one image of 8 x 9 pixels, or 72 tokens, which cross the tiles of every kernel on every GPU
# (32 pixels or tokens at most; 64 tokens in Triton's interpreter)
ROWS, COLUMNS = 8, 9

# in fp32, the largest difference of the kernels' outputs and gradients from the torch operators', relative to the
# largest value of each: both compute in fp32 (TF32 off), and the tests hold each within 1e-5 of fp64
BOUND = 1e-4
# In bf16 and fp16 the two round differently, so each is measured against the fp64 reference (the operator's plain
# formula on fp64 copies of the same inputs), each output and gradient in two ways: its largest error relative to the
# reference's largest value, and its root mean square error relative to the reference's root mean square. The
# kernels compute in fp32 what the torch operators round to the low precision, so their errors are at most about
# the torch operators'. They pass where each error is within TIMES times the torch operators' own, or within one
# rounding of the dtype (its eps for the largest error, half of it for the mean square), which a result rounded once
# to the dtype stays within. A kernel 1% off fails in both dtypes: the torch operators' mean square error is a few
# tenths of bf16's eps, and bf16's eps is 0.78%.
TIMES = 2


class KernelMismatch(RuntimeError):
    """An operator's kernels that computed other numbers than its torch operators on a GPU."""


class Tables(NamedTuple):
    """RoPE's tables as the operators read them (those of :class:`~mala_mm.ops.rope.RotaryTables`), here so that
    this module, which dispatch runs, imports no operator."""
    cos: Tensor
    sin: Tensor


def _maps(generator: torch.Generator, device: torch.device, *shapes) -> List[Tensor]:
    """Random fp32 maps of ``shapes``, (B, C, H, W) ones channels-last as the blocks lay them out."""
    maps = []
    for shape in shapes:
        t = torch.randn(shape, generator=generator).to(device)
        maps.append(t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 and shape[1] > 4 else t)
    return maps


def sample_cases(name: str, device: torch.device, generator: torch.Generator) -> List[Tuple[tuple, List[int]]]:
    """Small arguments of the operator ``name``, in the order its implementations take them, for each kind of call
    the blocks make (with and without RoPE, GELU, stochastic depth, a stage's output), with the positions of those a
    gradient is taken for: borders, channel counts that are not a multiple of a tile, two batch items. (A run's own
    widths take the same kernels with other constants, which tools/compile_kernels.py compiles for every GPU.)"""
    shape = (2, 24, 7, 9)
    # the (N, d) tables of 40 tokens' random angles in 16 channels, laid out as rope.RotaryTables lays them out:
    # each pair's cos at its two channels, its sin negated at the even one
    angles = (torch.rand(40, 8, generator=generator) * 6.3).repeat_interleave(2, dim=1).to(device)
    signs = torch.tensor([-1.0, 1.0], device=device).repeat(8)
    tables = Tables(angles.cos(), angles.sin() * signs)
    if name == 'mala_attention':
        return [((*_maps(generator, device, *[(2, 2, 40, 16)] * 3), rope, 1e-6), [0, 1, 2])
                for rope in (None, tables)]
    if name == 'rotate_qk':
        return [((_maps(generator, device, (2, 4 * 32, 5, 8))[0], tables, 2), [0])]
    if name == 'residual_depthwise_conv':
        x, weight, bias = _maps(generator, device, shape, (24, 1, 3, 3), (24, ))
        return [((x, weight, bias, gelu, None), [0, 1, 2]) for gelu in (False, True)]
    if name == 'gated_depthwise_conv':
        return [(tuple(_maps(generator, device, shape, shape, shape, (24, 1, 5, 5), (24, ))), [0, 1, 2, 3, 4])]
    if name == 'scaled_residual':
        x, branch, gamma, factors = _maps(generator, device, shape, shape, (1, 24, 1, 1), (2, 1, 1, 1))
        return [((x, branch, gamma, f), [0, 1, 2]) for f in (None, factors.abs())]
    if name == 'scaled_residual_norm':
        x, branch, gamma, weight, bias = _maps(generator, device, shape, shape, (1, 24, 1, 1), (24, ), (24, ))
        return [((x, branch, gamma, None, weight, bias, 1e-6, as_output), [0, 1, 2, 4, 5])
                for as_output in (False, True)]
    if name == 'batch_norm_gelu':
        x, weight, bias = _maps(generator, device, shape, (24, ), (24, ))
        return [((x, weight, bias, None, None, 0.1, 1e-5), [0, 1, 2])]
    raise KeyError(f'no sample arguments for the operator {name!r}')


def _outputs_and_gradients(fn: Callable, args: tuple, wanted: List[int], generator_seed: int) -> List[Tensor]:
    """fn's outputs and the gradients, for the arguments at ``wanted``, of a fixed random projection of them."""
    leaves = [t.detach().clone().requires_grad_() if i in wanted else t for i, t in enumerate(args)]
    # each implementation gets maps of its own that are not leaves, laid out as the arguments, as in a network:
    # rotate_qk writes into its map; the running statistics each implementation updates are its own too
    outputs = fn(*(_laid_out_as(t, args[i]) if i in wanted else (t.clone() if isinstance(t, Tensor) else t)
                   for i, t in enumerate(leaves)))
    outputs = outputs if isinstance(outputs, tuple) else (outputs, )
    generator = torch.Generator().manual_seed(generator_seed)
    loss = sum((out.double() * torch.randn(out.shape, generator=generator, dtype=torch.float64).to(out.device)).sum()
               for out in outputs)
    grads = torch.autograd.grad(loss, [leaves[i] for i in wanted], allow_unused=True, materialize_grads=True)
    return [out.detach() for out in outputs] + list(grads)


def _laid_out_as(leaf: Tensor, like: Tensor) -> Tensor:
    """A differentiable copy of ``leaf`` with the strides of ``like``: a channel slice of a wider map keeps its gaps,
    which ``leaf * 1`` would close."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(like.shape, like.stride()))
    if span == like.numel():  # dense: the product keeps its strides
        return leaf * 1
    return leaf.new_zeros(span).as_strided(like.shape, like.stride()).copy_(leaf)


def relative_error(ours: Tensor, reference: Tensor) -> float:
    """max |ours - reference| / max |reference|, in fp64; the absolute error where the reference is all zero. (The
    measure of the tests and the benchmarks too: tests/helpers and mala_tools.reference take it from here.)"""
    error = (ours.double() - reference.double()).abs().max().item()
    scale = reference.double().abs().max().item()
    return error / scale if scale else error


@contextlib.contextmanager
def _exact_fp32():
    """fp32 matmuls and convs without TF32, and autocast off: the two implementations at their own precision."""
    matmul = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False), torch.enable_grad(), \
                torch.autocast('cuda', enabled=False), torch.autocast('cpu', enabled=False):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul


def _names(count: int, wanted: Sequence[int]) -> List[str]:
    return [f'output {i}' for i in range(count - len(wanted))] + [f'the gradient of argument {i}' for i in wanted]


def compare(ours: List[Tensor], theirs: List[Tensor], names: List[str], precision: torch.dtype,
            reference: Optional[List[Tensor]] = None) -> Tuple[Optional[str], float]:
    """(what differs, in a few words, or None; the kernels' largest error): the kernels' outputs and gradients
    ``ours`` against the torch operators' ``theirs`` at ``precision``, in a low precision against the fp64
    ``reference`` (see :data:`TIMES`)."""
    worst = 0.0
    for name, a, b, exact in zip(names, ours, theirs, reference or theirs):
        if precision == torch.float32:
            error = relative_error(a, b)
            worst = max(worst, error)
            if not error <= BOUND:  # NaN too
                return f'{name} differs from the torch operators\' by {error:.3g} relative (bound {BOUND:g})', error
            continue
        eps = torch.finfo(precision).eps
        for measure, floor in ((relative_error, eps), (rms_error, eps / 2)):
            error, torch_error = measure(a, exact), measure(b, exact)
            worst = max(worst, error) if measure is relative_error else worst
            if not error <= max(TIMES * torch_error, floor):
                return (f'{name} is {error:.3g} off the fp64 reference ({measure.__name__}), the torch operators\' '
                        f'{torch_error:.3g} (bound: {TIMES}x that, at least {floor:.3g})'), max(worst, error)
    return None, worst


def rms_error(ours: Tensor, reference: Tensor) -> float:
    """The root mean square of ours - reference over that of the reference, in fp64."""
    scale = reference.double().square().mean().sqrt().item()
    error = (ours.double() - reference.double()).square().mean().sqrt().item()
    return error / scale if scale else error


def precision_of(args: Sequence, autocast: Optional[torch.dtype]) -> torch.dtype:
    """The lowest precision a call computes in: autocast's, or its tensors' lowest; fp32 at least."""
    dtypes = {t.dtype for t in args if isinstance(t, Tensor) and t.is_floating_point()} | {autocast}
    for low in (torch.bfloat16, torch.float16):
        if low in dtypes:
            return low
    return torch.float32


@contextlib.contextmanager
def _own_graph():
    """Its own autograd graph, wherever the first use happens: under inference mode, or in the forward of a
    checkpointed block, whose hooks would otherwise take the tensors it saves."""
    with torch.inference_mode(False), torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        yield


def check_call(operator, args: Sequence) -> Tuple[Optional[str], float]:
    """(what differs, or None; the kernels' largest error) for the variant that ``operator`` launches on ``args``
    under the autocast now on, on small inputs of that variant (:data:`ROWS` by :data:`COLUMNS`). A kernel that fails
    to compile or launch raises, as in a run."""
    autocast = autocast_of(args[0])
    small, wanted = variant_inputs(operator.name, args, 1, ROWS, COLUMNS, torch.Generator().manual_seed(0))
    device = args[0].device.type
    with _exact_fp32(), torch.autocast(device, dtype=autocast, enabled=autocast is not None), _own_graph():
        ours = _outputs_and_gradients(operator.triton, small, wanted, 0)
        theirs = _outputs_and_gradients(operator.torch, small, wanted, 0)
    precision, reference = precision_of(small, autocast), None
    if precision != torch.float32:
        in_fp64 = tuple(_fp64(t) for t in small)
        with _exact_fp32(), _own_graph():
            reference = _outputs_and_gradients(operator.reference, in_fp64, wanted, 0)
    return compare(ours, theirs, _names(len(ours), wanted), precision, reference)


def _fp64(t):
    if isinstance(t, Tensor) and t.is_floating_point():
        return t.double()
    if isinstance(t, tuple) and all(isinstance(part, Tensor) for part in t):  # RoPE's tables
        return type(t)(*(part.double() for part in t))
    return t


def check_operator(operator, device: torch.device) -> Optional[str]:
    """None where ``operator``'s kernels give its torch operators' outputs and gradients within :data:`BOUND` on
    ``device`` in fp32, in each of its usual calls (:func:`sample_cases`), else what differs, in a few words. A
    kernel that fails to compile or launch raises, as in a run."""
    generator = torch.Generator().manual_seed(0)
    with _exact_fp32(), _own_graph():
        for case, (args, wanted) in enumerate(sample_cases(operator.name, device, generator)):
            ours = _outputs_and_gradients(operator.triton, args, wanted, case)
            expected = _outputs_and_gradients(operator.torch, args, wanted, case)
            problem, _ = compare(ours, expected, _names(len(ours), wanted), torch.float32)
            if problem is not None:
                return problem.replace(' differs', f' of case {case} differs')
    return None
