"""The check that a job on a machine with NVIDIA GPUs runs on them, made by the training and test tools in every
process: a torch that cannot use the GPUs (a CPU build, a CUDA newer than the driver, hidden devices) would
otherwise train on CPU, each step a hundred times slower, with nothing but a warning."""
import os
import socket
import subprocess
from typing import Optional

import torch

from .errors import ToolError, local_rank, print_error


def nvidia_gpu_count() -> int:
    """The NVIDIA GPUs of this machine, counted without torch: ``nvidia-smi -L``'s list, else the driver's entries
    under /proc/driver/nvidia/gpus. MALA_MM_NVIDIA_SMI and MALA_MM_NVIDIA_GPUS_DIR replace the two probes (as
    for the launchers, tools/find_python.sh)."""
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


def cpu_on_a_gpu_machine() -> Optional[str]:
    """Why this process would run on CPU although its machine has NVIDIA GPUs, with what to do; None where it
    runs on a GPU, where the machine has none, or where MALA_MM_ALLOW_CPU=1 asks for CPU."""
    if os.environ.get('MALA_MM_ALLOW_CPU') == '1' or torch.cuda.is_available():
        return None
    gpus = nvidia_gpu_count()
    if gpus == 0:
        return None
    return (f'{socket.gethostname()} has {gpus} NVIDIA GPU{"s" if gpus > 1 else ""}, but {why_torch_uses_no_gpu()}; '
            f'install the torch build for this driver (docs/get_started.md#which-torch-for-which-driver), or set '
            f'MALA_MM_ALLOW_CPU=1 to run on CPU anyway')


def require_gpus_where_the_machine_has_them() -> None:
    """Raise :class:`ToolError` where :func:`cpu_on_a_gpu_machine` finds a reason; the first process of each node
    prints why, since machines differ within a job."""
    problem = cpu_on_a_gpu_machine()
    if problem:
        if local_rank() == 0:
            print_error(problem)
        raise ToolError(problem, printed=True)
