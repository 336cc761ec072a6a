"""Which implementation runs an operator: its torch operators, or the Triton kernels beside them.

``impl`` is 'triton' (the kernels), 'torch' (the operators) or 'auto': the kernels for CUDA tensors on a GPU that
Triton serves (compute capability 8.0 or newer) where Triton is installed, where their variant is right and faster
(:mod:`.verdicts`), the operators elsewhere. The backbone checks it once, where it is built (:func:`check_impl`);
each operator then asks :func:`uses_triton` of the tensors it is given and runs through :meth:`Operator.run`, where
under 'auto' a kernel that fails on a GPU (one this package's kernels were never compiled for, or another Triton),
or a map too large for the kernels, hands that operator to its torch operators on that GPU, with one warning.
"""
import logging
import re
import warnings
from importlib import import_module
from typing import Callable, Dict, Optional

import torch
from mmengine.logging import print_log
from torch import Tensor

from .torch_compat import in_graph

# The oldest Triton the kernels are written and compiled for (tools/compile_kernels.py). An older one, such as the
# 2.1 that torch 2.1's CUDA wheels pin, is left unused: the torch operators then serve every device.
MIN_TRITON = (3, 2)
NEEDS_TRITON = f"the kernels need Triton {'.'.join(map(str, MIN_TRITON))} or newer"


def release(version: str) -> tuple:
    """(major, minor) of a version such as '3.4.0' or '3.6.0+git1234'."""
    return tuple(int(part) for part in re.findall(r'\d+', version)[:2])


def usable_triton():
    """Triton, where it is installed at MIN_TRITON or newer, else None and what is installed instead."""
    try:
        import triton
    except ImportError:  # optional
        return None, 'Triton is not installed'
    if release(triton.__version__) < MIN_TRITON:
        return None, f'Triton {triton.__version__} is installed'
    return triton, None


triton, TRITON_MISSING = usable_triton()
TRITON_AVAILABLE = triton is not None
if TRITON_AVAILABLE:
    from . import triton_launch
IMPLS = ('auto', 'triton', 'torch')
FLOATS = (torch.float32, torch.float16, torch.bfloat16)

# the GPUs (triton_launch.GPU) that the kernels do not serve, on which 'auto' has said so
GPUS_LOGGED = set()


class Operator:
    """One of the blocks' operators in each of its implementations, which all take the arguments of
    ``reference``.

    Attributes:
        name: the operator's name.
        reference: its plain formula (the op's ``naive`` module): what every implementation is tested against.
        torch: its torch operators, which the CPU, compiled, traced and exported graphs run.
        triton: its Triton launcher, which also takes a keyword ``torch_fallback``; None without Triton.
        variants: ``variants(gpu)`` yields (kernel, its constexprs and launch options) for each kernel variant the
            launcher makes on a :class:`~.triton_launch.GPU`; None without Triton.
        failed_on: the GPUs on which its kernels failed under 'auto' before the current training step: there it
            runs in torch operators.
        failing_on: the GPUs on which a kernel of it failed in the current step. Until that step's backward ends,
            its kernels are still tried, and each failure handled alone: a block under activation checkpointing
            then recomputes in its backward what its forward ran (kernels or torch operators, which save different
            tensors), as torch's checkpoint requires.
    """

    def __init__(self, name: str, reference: Callable, torch_fn: Callable, triton_module: Optional[str] = None):
        """``triton_module``: the module that holds the Triton launcher ``name`` and ``{name}_variants``."""
        self.name, self.reference, self.torch = name, reference, torch_fn
        self.triton = self.variants = None
        if triton_module is not None and TRITON_AVAILABLE:
            module = import_module(triton_module)
            self.triton, self.variants = getattr(module, name), getattr(module, f'{name}_variants')
        self.failed_on, self.failing_on = set(), set()

    def __repr__(self) -> str:
        return f'Operator({self.name!r})'

    def __call__(self, *args):
        """The torch operators on ``args``: what a launcher calls where its kernels fail."""
        return self.torch(*args)

    def implementations(self) -> Dict[str, Callable]:
        """'torch' and, with Triton, 'triton': each implementation, called with the reference's arguments."""
        found = {'torch': self.torch}
        if self.triton is not None:
            found['triton'] = self.triton
        return found

    def run(self, impl: str, x: Tensor, *args):
        """The operator on ``args`` in the kernels where :func:`uses_triton` takes them for ``x`` and their variant
        serves on its GPU (:meth:`_serves`), else in torch operators. Under 'auto', a kernel that fails, or a map too
        large for the kernels, hands the operator to its torch operators on that GPU (in the backward too); under
        'triton' the error stops the run."""
        if impl == 'torch' or not uses_triton(impl, x, self) or not self._serves(impl, x, args):
            return self.torch(*args)
        torch_fallback = self if impl == 'auto' else None
        return triton_launch.in_kernels_or_torch(lambda: self.triton(*args, torch_fallback=torch_fallback),
                                                 torch_fallback, lambda: self.torch(*args))

    def available_on(self, gpu) -> bool:
        return gpu not in self.failed_on

    def _serves(self, impl: str, x: Tensor, args: tuple) -> bool:
        """Whether the kernels serve this call: :mod:`.verdicts` decides each variant at its first launch on a GPU,
        from a check against the torch operators and a timing of both. 'auto' takes the kernels where they are
        right and faster; 'triton' where they are right, and raises where they are not. A wrong variant runs in
        torch operators under 'auto', with a warning at its first launch."""
        if not _on_a_gpu(x):  # Triton's interpreter: the tests' own
            return True
        from . import verdicts
        from .self_check import KernelMismatch
        verdict, gpu, new = verdicts.VERDICTS.of(self, args)
        if verdict.right:
            return impl == 'triton' or verdict.choice == 'triton'
        if impl != 'auto':
            raise KernelMismatch(f"impl='triton': {self.name}'s Triton kernels compute other numbers than its torch "
                                 f"operators in the variant {verdict.variant} on {gpu}: {verdict.problem}; "
                                 f"impl='auto' runs that variant in torch operators there")
        if new:
            warnings.warn(f"impl='auto': {self.name}'s Triton kernels compute other numbers than its torch "
                          f"operators in the variant {verdict.variant} on {gpu}: {verdict.problem}; that variant "
                          f"runs in torch operators on this GPU from now on", RuntimeWarning, stacklevel=4)
        return False

    def unavailable(self, error) -> None:
        """Hands the operator to its torch operators on the GPU of ``error`` (a
        :class:`~.triton_launch.KernelUnavailable`), with a warning that names the kernel, the GPU and the error:
        at once where no backward can follow (no gradients are recorded), else from the end of the backward of the
        step it failed in (:meth:`fell_back`)."""
        if error.gpu in self.failed_on or error.gpu in self.failing_on:
            return
        warnings.warn(f"impl='auto': {error}; {self.name} runs in torch operators on this GPU from now on",
                      RuntimeWarning, stacklevel=3)
        if torch.is_grad_enabled() or _in_backward():
            self.failing_on.add(error.gpu)
        else:
            self.failed_on.add(error.gpu)

    def fell_back(self, outputs):
        """``outputs``, which the torch operators gave in place of a failed kernel's, as they are; the failure takes
        effect once the backward that runs now, or the one through ``outputs``, has ended."""
        if not self.failing_on:
            return outputs
        if _in_backward():
            torch.autograd.Variable._execution_engine.queue_callback(self._step_ended)
            return outputs
        recorded = [t for t in (outputs if isinstance(outputs, tuple) else (outputs, ))
                    if isinstance(t, Tensor) and t.requires_grad]
        if not recorded:  # no backward goes through them
            self._step_ended()
        for t in recorded:
            t.register_hook(self._queue_step_end)
        return outputs

    def _queue_step_end(self, grad: Tensor) -> None:
        torch.autograd.Variable._execution_engine.queue_callback(self._step_ended)

    def _step_ended(self) -> None:
        self.failed_on |= self.failing_on
        self.failing_on.clear()


def check_impl(impl: str, where: str, error=ValueError) -> str:
    """``impl`` if it is one of IMPLS that this installation can run, else ``error`` saying why."""
    if impl not in IMPLS:
        raise error(f'{where}impl must be one of {IMPLS}, got {impl!r}')
    if impl == 'triton' and not TRITON_AVAILABLE:
        raise error(f"{where}impl='triton': {NEEDS_TRITON}, and {TRITON_MISSING}; 'auto' and 'torch' run the "
                    'torch operators')
    return impl


def uses_triton(impl: str, x: Tensor, operator: Operator = None) -> bool:
    """Whether an operator given ``x`` runs in the Triton kernels. Traced, exported and compiled graphs take the
    torch operators, which they can record and the compiler fuses itself."""
    check_impl(impl, '')
    if impl == 'torch' or in_graph():
        return False
    if impl == 'auto':
        if not TRITON_AVAILABLE or not x.is_cuda or x.dtype not in FLOATS:
            return False
        gpu = triton_launch.gpu_of(x)
        why_not = triton_launch.unserved(gpu)
        if why_not is not None:
            _log_once(gpu, why_not)
            return False
        return operator is None or operator.available_on(gpu)
    if x.dtype not in FLOATS:
        raise TypeError(f"impl='triton' takes fp32, bf16 or fp16 features, got {x.dtype}")
    if not (x.is_cuda or triton_launch.INTERPRETED):
        raise RuntimeError(f"impl='triton' runs on CUDA tensors, got {x.device.type} ones (Triton's "
                           f"interpreter runs it on the CPU where TRITON_INTERPRET=1 is set before import)")
    why_not = triton_launch.unserved(triton_launch.gpu_of(x)) if x.is_cuda else None
    if why_not is not None:
        raise RuntimeError(f"impl='triton' runs the Triton kernels, and {why_not}: use impl='auto' (which "
                           f"takes the torch operators there) or 'torch'")
    return True


def log_new_choices() -> None:
    """Logs the verdicts on the kernel variants met since the last call, as one table (:mod:`.verdicts`): the
    backbone calls it at the end of each eager forward, so that a run's first forward logs its choices once."""
    if TRITON_AVAILABLE:
        from . import verdicts
        verdicts.VERDICTS.log_choices()


def _on_a_gpu(x: Tensor) -> bool:
    """Whether x lies on a GPU, where the kernels are checked at their first use (the tests mock one)."""
    return x.is_cuda


def _in_backward() -> bool:
    """Whether autograd's engine is running a backward (a checkpointed block's recomputation among it)."""
    return torch._C._current_graph_task_id() != -1


def _log_once(gpu, why_not: str) -> None:
    if gpu not in GPUS_LOGGED:
        GPUS_LOGGED.add(gpu)
        print_log(f"impl='auto': {why_not}; the blocks' operators run in torch operators", logger='current',
                  level=logging.WARNING)
