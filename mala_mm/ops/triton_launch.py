"""What the Triton launchers of every operator share: the GPU a launch runs on, what it allows, and the launch.

Each launcher asks :func:`gpu_of` for the GPU of its tensors and picks its tiles, warps and stages for that GPU
(its plan); :func:`launch` then runs the kernel on that GPU and its current stream, whichever device is current.
Triton itself launches on ``torch.cuda.current_device()`` and that device's stream, so without the guard a map on
``cuda:1`` would be handed to a kernel on GPU 0.
"""
import functools
from contextlib import nullcontext
from typing import Callable, NamedTuple, Optional, Tuple

import torch
import triton
from torch import Tensor


@triton.jit
def empty_kernel():
    """Does nothing: whether kernels are interpreted, and whether Triton compiles for a GPU (compile_kernels.py)."""


# whether the kernels run in Triton's interpreter (TRITON_INTERPRET=1 when this module was imported), which runs
# them on CPU tensors
INTERPRETED = not isinstance(empty_kernel, triton.runtime.JITFunction)

# Triton compiles for compute capability 8.0 (Ampere) and newer
MIN_CAPABILITY = (8, 0)

# CUDA's limit on a grid's second and third axes
MAX_GRID_YZ = 65535

KIB = 1024

# the most shared memory a block of any kernel variant takes (tools/compile_kernels.py fails on one over it): what
# CUDA gives a block without opting in to more, on every GPU
PLAN_SHARED_MEMORY = 48 * KIB

# shared memory a block may opt in to, by architecture: from sm_80 on, the SM's shared memory less the 1 KiB that
# CUDA reserves for each block
SHARED_MEMORY_BY_ARCH = {80: 163 * KIB, 86: 99 * KIB, 87: 163 * KIB, 89: 99 * KIB, 90: 227 * KIB, 100: 227 * KIB,
                         103: 227 * KIB, 110: 227 * KIB, 120: 99 * KIB, 121: 99 * KIB}


class GPU(NamedTuple):
    """What a launcher's plan depends on: the compute capability and the shared memory a block may use."""
    name: str
    capability: Tuple[int, int]
    shared_memory: int  # bytes a block may opt in to

    @property
    def arch(self) -> int:
        return self.capability[0] * 10 + self.capability[1]

    def __str__(self) -> str:
        return f'{self.name} (compute capability {self.capability[0]}.{self.capability[1]})'

    @classmethod
    def of_arch(cls, arch: int) -> 'GPU':
        """A GPU of architecture ``arch`` (e.g. 86 for sm_86), for plans made without one."""
        return cls(f'sm_{arch}', divmod(arch, 10), SHARED_MEMORY_BY_ARCH[arch])


# what the launchers' plans take for Triton's interpreter, which has no shared memory or registers to fit: the
# launchers give it larger tiles of their own
INTERPRETER_GPU = GPU('Triton interpreter', (9, 0), SHARED_MEMORY_BY_ARCH[90])


def _kernel_failures() -> tuple:
    """What compiling, loading and launching a kernel raise where it does not fit a GPU or a Triton: Triton's
    compiler, ptxas (Triton 3.3 and newer name its error) and the check of what a block takes (OutOfResources), and
    CUDA's driver, whose errors Triton's launcher and torch raise as RuntimeError. Any other type is a bug in a
    launcher or in what it hands the kernel."""
    from triton.compiler.errors import CompilationError
    from triton.runtime import errors
    return tuple(error for error in (CompilationError, errors.OutOfResources, getattr(errors, 'PTXASError', None),
                                     RuntimeError) if error is not None)


KERNEL_FAILURES = _kernel_failures()


class KernelUnavailable(RuntimeError):
    """A Triton kernel that did not compile, load or launch on a GPU."""

    def __init__(self, kernel: str, gpu: GPU, error: BaseException):
        super().__init__(f'the Triton kernel {kernel} failed on {gpu}: {type(error).__name__}: {error}')
        self.kernel, self.gpu, self.error = kernel, gpu, error


@functools.lru_cache(maxsize=None)
def cuda_gpu(index: int) -> GPU:
    properties = torch.cuda.get_device_properties(index)
    capability = (properties.major, properties.minor)
    shared = getattr(properties, 'shared_memory_per_block_optin', None)
    if shared is None:
        reserved = KIB if capability >= MIN_CAPABILITY else 0
        shared = properties.shared_memory_per_multiprocessor - reserved
    return GPU(properties.name, capability, shared)


def launch_device(t: Tensor) -> torch.device:
    """The device whose kernels read ``t``: a CUDA device with its index, or the CPU (the interpreter)."""
    if t.device.type == 'cuda' and t.device.index is None:
        return torch.device('cuda', torch.cuda.current_device())
    return t.device


def gpu_of(t: Tensor) -> GPU:
    """The GPU that kernels reading ``t`` run on (read once per device), or :data:`INTERPRETER_GPU`."""
    device = launch_device(t)
    return cuda_gpu(device.index) if device.type == 'cuda' else INTERPRETER_GPU


def registers_a_thread(num_warps: int) -> int:
    """The most registers a thread may take in a block of ``num_warps`` warps (the launch option ``maxnreg``): an
    SM's 65,536, at most 255. Left to itself, ptxas caps them lower and spills."""
    return min(255, 65536 // (32 * num_warps))


def unserved(gpu: GPU) -> Optional[str]:
    """Why the kernels do not run on ``gpu``, or None where they do."""
    if gpu.capability < MIN_CAPABILITY:
        major, minor = MIN_CAPABILITY
        return f'{gpu} is older than compute capability {major}.{minor}, which Triton compiles for'
    if gpu.shared_memory < PLAN_SHARED_MEMORY:
        return f'{gpu} has {gpu.shared_memory // KIB} KiB of shared memory a block, less than the kernels take'
    return None


# the kernels address their maps with int32 offsets (index times stride): a map spans fewer elements
MAX_SPAN = 2 ** 31


class MapTooLarge(ValueError):
    """A map whose elements lie beyond the int32 offsets that the kernels address: 'auto' runs the call in torch
    operators, as where a kernel does not fit the GPU (:func:`in_kernels_or_torch`); ``gpu``: the GPU, where one was
    named."""

    def __init__(self, message: str, gpu: Optional[GPU] = None):
        super().__init__(message)
        self.gpu = gpu


def check_offsets(kernel: str, tensors, gpu: Optional[GPU] = None) -> None:
    """Raises :class:`MapTooLarge` where one of ``tensors`` spans 2^31 elements or more of its memory (from its first
    element to its last), which the kernel's int32 offsets would address wrongly, silently."""
    for t in tensors:
        span = 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride())) if t.numel() else 0
        if span >= MAX_SPAN:
            on = f' on {gpu}' if gpu is not None else ''
            raise MapTooLarge(f"{kernel}: a map of shape {tuple(t.shape)} spans {span:,} elements, and the Triton "
                              f"kernels{on} address fewer than 2^31: use a smaller batch, or impl='torch'", gpu)


def check_grid(kernel: str, grid: Tuple[int, ...]) -> None:
    if any(size > MAX_GRID_YZ for size in grid[1:3]):
        raise ValueError(f'{kernel}: a grid of {grid} programs exceeds CUDA\'s {MAX_GRID_YZ} on its second and '
                         f'third axes')


def launch(kernel, grid: Tuple[int, ...], *args, **options) -> None:
    """``kernel[grid](*args, **options)`` on the device of its first tensor argument and that device's current
    stream; nothing where the grid is empty.

    Raises:
        MapTooLarge: a map beyond the kernels' int32 offsets (:func:`check_offsets`).
        KernelUnavailable: the kernel did not compile, load or launch (:data:`KERNEL_FAILURES`), with the error
            that stopped it. Other errors propagate as they are, under 'auto' too.
    """
    name = getattr(kernel, 'fn', kernel).__name__
    check_grid(name, grid)
    like = next(a for a in args if isinstance(a, Tensor))
    check_offsets(name, (a for a in args if isinstance(a, Tensor)), gpu_of(like))
    if 0 in grid:
        return
    device = launch_device(like)
    with torch.cuda.device(device) if device.type == 'cuda' else nullcontext():
        try:
            kernel[grid](*args, **options)
        except KERNEL_FAILURES as error:
            raise KernelUnavailable(name, gpu_of(like), error) from error


def in_kernels_or_torch(in_kernels: Callable, torch_fallback, in_torch: Callable):
    """``in_kernels()``; where a kernel of it fails, or a map is too large for the kernels, and ``torch_fallback``
    (a :class:`~.dispatch.Operator`) is given, that operator goes to its torch operators on the GPU and
    ``in_torch()`` gives the result instead; without one, the error stops the run."""
    try:
        return in_kernels()
    except (KernelUnavailable, MapTooLarge) as error:
        if torch_fallback is None:
            raise
        torch_fallback.unavailable(error)
        return torch_fallback.fell_back(in_torch())


def torch_gradients(torch_fn, inputs: tuple, grads: tuple, autocast: Optional[torch.dtype] = None) -> tuple:
    """The gradients of ``torch_fn(*inputs)`` with respect to each floating-point tensor of ``inputs`` (None for
    the others), given the gradients ``grads`` of its outputs: a backward whose kernels failed, in torch operators
    from the inputs the forward saved, under the autocast the forward ran under (``autocast``, from
    :func:`~.torch_compat.autocast_of`), which casts those inputs and the fp32 parameters to one dtype as it did
    there."""
    device = next(t for t in inputs if isinstance(t, Tensor)).device.type
    with torch.enable_grad(), torch.autocast(device, dtype=autocast, enabled=autocast is not None):
        leaves = tuple(t.detach().requires_grad_() if isinstance(t, Tensor) and t.is_floating_point() else t
                       for t in inputs)
        outputs = torch_fn(*leaves)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(out, grad) for out, grad in zip(outputs, grads) if grad is not None]
        wanted = [t for t in leaves if isinstance(t, Tensor) and t.requires_grad]
        found = iter(torch.autograd.grad([out for out, _ in pairs], wanted, [grad for _, grad in pairs],
                                         allow_unused=True))
    return tuple(next(found) if isinstance(t, Tensor) and t.requires_grad else None for t in leaves)
