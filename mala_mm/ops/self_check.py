"""The kernels checked against the torch operators on the GPU that runs them, before they serve a run.

A kernel that fails to compile or launch raises, and 'auto' hands its operator to the torch operators
(:mod:`.dispatch`); a kernel that compiles but computes wrong numbers on some GPU or some Triton would go unnoticed.
So, at an operator's first use on a GPU, :meth:`~.dispatch.Operator.run` runs it once on small inputs in its kernels
and in its torch operators, forward and backward, in fp32 without TF32, and compares the two
(:func:`check_operator`). Where they differ, 'auto' hands the operator to the torch operators on that GPU with a
warning that names the operator, the GPU and the difference; 'triton' raises :class:`KernelMismatch`.
``python tools/check_kernels.py`` runs the check of every operator on every visible GPU on its own.
"""
import contextlib
from typing import Callable, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

# the largest difference of the kernels' outputs and gradients from the torch operators', relative to the largest
# value of each: both compute in fp32 (TF32 off), and the tests hold each within 1e-5 of fp64
BOUND = 1e-4


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
    # each implementation gets maps of its own that are not leaves, as in a network: rotate_qk writes into its map
    outputs = fn(*(t * 1 if i in wanted else t for i, t in enumerate(leaves)))
    outputs = outputs if isinstance(outputs, tuple) else (outputs, )
    generator = torch.Generator().manual_seed(generator_seed)
    loss = sum((out.float() * torch.randn(out.shape, generator=generator).to(out.device)).sum() for out in outputs)
    grads = torch.autograd.grad(loss, [leaves[i] for i in wanted], allow_unused=True, materialize_grads=True)
    return [out.detach() for out in outputs] + list(grads)


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


def check_operator(operator, device: torch.device) -> Optional[str]:
    """None where ``operator``'s kernels give its torch operators' outputs and gradients within :data:`BOUND` on
    ``device``, else what differs, in a few words. A kernel that fails to compile or launch raises, as in a run."""
    generator = torch.Generator().manual_seed(0)
    # its own autograd graph, wherever the first use happens: under inference mode, or in the forward of a
    # checkpointed block, whose hooks would otherwise take the tensors it saves
    with _exact_fp32(), torch.inference_mode(False), torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        for case, (args, wanted) in enumerate(sample_cases(operator.name, device, generator)):
            ours = _outputs_and_gradients(operator.triton, args, wanted, case)
            expected = _outputs_and_gradients(operator.torch, args, wanted, case)
            names = [f'output {i}' for i in range(len(ours) - len(wanted))]
            names += [f'the gradient of argument {i}' for i in wanted]
            for name, a, b in zip(names, ours, expected):
                difference = relative_error(a, b)
                if not difference <= BOUND:  # NaN too
                    return f'{name} of case {case} differs from the torch operators\' by {difference:.3g} relative ' \
                           f'(bound {BOUND:g})'
    return None
