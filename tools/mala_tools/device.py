"""The check that a job on a machine with NVIDIA GPUs runs on them, in one place for the launchers and the tools:
a torch that cannot use the GPUs (a CPU build, a CUDA newer than the driver, hidden devices) would otherwise train
on CPU, each step a hundred times slower, with nothing but a warning.

The launchers run it once per machine before torchrun starts, with the interpreter they chose::

    python -m mala_tools.device SHOWN_PYTHON CHOSEN_BY

which prints on stderr the line naming the interpreter, its torch and CUDA and why it was chosen, then stops
(exit status 2) with the reason where the GPUs would go unused, and prints on stdout the GPUs torch can use and the
CPU cores the process may run on. The training and test tools check again in every process
(:func:`require_gpus_where_the_machine_has_them`): a slurm compute node runs them with no launcher of its own.
MALA_MM_ALLOW_CPU=1 runs on CPU anyway.
"""
import os
import socket
import subprocess
import sys

import torch

from .errors import ERROR_STATUS, ToolError, local_rank, print_error


def nvidia_gpu_count() -> int:
    """The NVIDIA GPUs of this machine, counted without torch (whose build may not see them): ``nvidia-smi -L``'s
    list, else the driver's entries under /proc/driver/nvidia/gpus. MALA_MM_NVIDIA_SMI and
    MALA_MM_NVIDIA_GPUS_DIR replace the two probes, to test the checks as they behave on a GPU machine."""
    try:
        listing = subprocess.run([os.environ.get('MALA_MM_NVIDIA_SMI', 'nvidia-smi'), '-L'], capture_output=True,
                                 text=True, timeout=60).stdout
        count = sum(line.startswith('GPU ') for line in listing.splitlines())
    except (OSError, subprocess.TimeoutExpired):
        count = 0
    if count:
        return count
    gpus_dir = os.environ.get('MALA_MM_NVIDIA_GPUS_DIR', '/proc/driver/nvidia/gpus')
    return len(os.listdir(gpus_dir)) if os.path.isdir(gpus_dir) else 0


def why_torch_uses_no_gpu() -> str:
    """Why ``torch.cuda.is_available()`` is false here, in torch's words where it has any (e.g. 'The NVIDIA
    driver on your system is too old (found version 12020)')."""
    if not torch.version.cuda:
        return f'torch {torch.__version__} is built without CUDA'
    try:
        torch.cuda.init()
    except Exception as err:  # torch raises RuntimeError or AssertionError, depending on the cause
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return f'torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use them: {reason}'
    visible = os.environ.get('CUDA_VISIBLE_DEVICES')
    return (f'torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU'
            + (f' (CUDA_VISIBLE_DEVICES={visible!r})' if visible is not None else ''))


def unused_gpus() -> int:
    """The machine's NVIDIA GPUs where this process's torch can use none of them, else 0."""
    return 0 if torch.cuda.is_available() else nvidia_gpu_count()


def cpu_on_a_gpu_machine(gpus: int) -> str:
    """Why a process would run on CPU on this machine, whose ``gpus`` NVIDIA GPUs its torch cannot use, and what
    to do."""
    return (f'{socket.gethostname()} has {gpus} NVIDIA GPU{"s" if gpus > 1 else ""}, but {why_torch_uses_no_gpu()}; '
            f'install the torch build for this driver (docs/get_started.md#which-torch-for-which-driver), or set '
            f'MALA_MM_ALLOW_CPU=1 to run on CPU anyway')


def cpu_allowed() -> bool:
    return os.environ.get('MALA_MM_ALLOW_CPU') == '1'


def require_gpus_where_the_machine_has_them() -> None:
    """Raise :class:`ToolError` where this process would run on CPU although its machine has NVIDIA GPUs (unless
    MALA_MM_ALLOW_CPU=1); the first process of each node prints why, since machines differ within a job."""
    gpus = 0 if cpu_allowed() else unused_gpus()
    if gpus:
        problem = cpu_on_a_gpu_machine(gpus)
        if local_rank() == 0:
            print_error(problem)
        raise ToolError(problem, printed=True)


def check_interpreter(shown: str, chosen_by: str) -> None:
    """The launchers' check (the module's docstring)."""
    usable = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cuda = 'CUDA: none'
    if torch.version.cuda:
        cuda = f'CUDA {torch.version.cuda}, {usable} GPU{"" if usable == 1 else "s"}'
    print(f'[mala_mm] python: {shown} (torch {torch.__version__}, {cuda}), chosen by {chosen_by}', file=sys.stderr)
    unused = unused_gpus()
    if unused and cpu_allowed():
        print(f'[mala_mm] MALA_MM_ALLOW_CPU=1: running on CPU although this machine has {unused} NVIDIA GPUs',
              file=sys.stderr)
    elif unused:
        print_error(cpu_on_a_gpu_machine(unused))
        raise SystemExit(ERROR_STATUS)
    print(usable, len(os.sched_getaffinity(0)))


if __name__ == '__main__':
    check_interpreter(*sys.argv[1:3])
