"""Measuring time and peak memory the same way on CPU and GPU, and writing tables and plots."""
import contextlib
import json
import os
import statistics
import time
import weakref
from typing import Callable, Dict, List, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results')


def device_name(device: torch.device) -> str:
    if device.type == 'cuda':
        return torch.cuda.get_device_name(device)
    return f'CPU ({torch.get_num_threads()} threads)'


@contextlib.contextmanager
def tf32(enabled: bool):
    """TF32 in CUDA convolutions and matmuls on or off (by default cuDNN's convolutions use it, matmuls do not)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def exact_fp32():
    """TF32 off in CUDA convolutions and matmuls, for exact fp32 comparisons."""
    return tf32(False)


def synchronize(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], object], device: torch.device, warmup: int = 2, repeats: int = 5,
            budget_s: float = 20.0) -> float:
    """Median wall time of ``fn`` in milliseconds, over up to ``repeats`` runs within ``budget_s``."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times: List[float] = []
    started = time.perf_counter()
    while len(times) < repeats and (not times or time.perf_counter() - started < budget_s):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


class _LiveTensorBytes(TorchDispatchMode):
    """Peak bytes of the storages that operators create while the mode is on (CPU has no allocator stats).

    A storage counts from the first tensor an operator returns on it until the last such tensor is freed;
    kernels' private scratch space is not seen.
    """

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._refs: Dict[int, int] = {}

    def _release(self, key: int, nbytes: int) -> None:
        self._refs[key] -= 1
        if not self._refs[key]:
            del self._refs[key]
            self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.device.type == 'cpu':
                storage = t.untyped_storage()
                key, nbytes = storage.data_ptr(), storage.nbytes()
                if key not in self._refs:
                    self._refs[key] = 0
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                self._refs[key] += 1
                weakref.finalize(t, self._release, key, nbytes)
        return out


def peak_mib(fn: Callable[[], object], device: torch.device) -> float:
    """Peak memory that one call of ``fn`` allocates beyond what exists before it, in MiB."""
    if device.type == 'cuda':
        synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    tracker = _LiveTensorBytes()
    with tracker:
        fn()
    return tracker.peak / 2**20


def write_results(name: str, device: torch.device, rows: List[dict], markdown: str,
                  folder: Optional[str] = None) -> str:
    """Save rows as JSON and the table as Markdown in ``folder`` (default: results/<device kind>/); returns the
    folder."""
    folder = folder or os.path.join(RESULTS_DIR, device.type)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f'{name}.json'), 'w') as f:
        json.dump(dict(device=device_name(device), torch=torch.__version__, rows=rows), f, indent=1)
    with open(os.path.join(folder, f'{name}.md'), 'w') as f:
        f.write(f'Device: {device_name(device)}, torch {torch.__version__}\n\n{markdown}\n')
    return folder


def markdown_table(rows: List[dict], columns: List[str]) -> str:
    def cell(value):
        if isinstance(value, float):
            return f'{value:.3g}' if abs(value) < 1000 else f'{value:.0f}'
        return '–' if value is None else str(value)
    lines = ['| ' + ' | '.join(columns) + ' |', '|' + '---|' * len(columns)]
    lines += ['| ' + ' | '.join(cell(row.get(c)) for c in columns) + ' |' for row in rows]
    return '\n'.join(lines)
