"""The verdicts on the kernel variants (:mod:`.verdicts`) kept in the user's cache, so that a later run on the same
kind of GPU, with the same stack and the same kernels, launches no check.

One small JSON file per environment: the GPU's name and compute capability, CUDA's and the driver's versions, torch's
and Triton's, and a hash of the kernels' source files (each operator's ``kernels``, ``grad_kernels`` and
``triton_ops``, and the launchers' shared modules). Any of them changed, the file's name changes and the variants
are checked again. The folder is ``$MALA_MM_CACHE``, else ``$XDG_CACHE_HOME/mala_mm``, else ``~/.cache/mala_mm``, as
tools/setup_env.sh names it. A file is written whole to a temporary one beside it and renamed over it, so that a
reader never sees half of one.
"""
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Dict

import torch

# the launchers' and the kernels' source files, relative to mala_mm/ops
SOURCES = ('triton_launch.py', 'triton_helpers.py', '*/kernels.py', '*/grad_kernels.py', '*/triton_ops.py')


def cache_dir() -> Path:
    """The folder of the user's cache that the verdicts are kept in."""
    if os.environ.get('MALA_MM_CACHE'):
        return Path(os.environ['MALA_MM_CACHE'])
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return Path(base) / 'mala_mm'


@functools.lru_cache(maxsize=None)
def kernels_hash() -> str:
    """A hash of the kernels' and the launchers' source files."""
    ops = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted(p for pattern in SOURCES for p in ops.glob(pattern)):
        digest.update(str(path.relative_to(ops)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def environment(gpu) -> Dict[str, str]:
    """What the verdicts on ``gpu`` (a :class:`~.triton_launch.GPU`) hold for."""
    import triton
    driver = getattr(torch._C, '_cuda_getDriverVersion', None)
    return {'gpu': gpu.name, 'capability': '.'.join(map(str, gpu.capability)), 'cuda': str(torch.version.cuda),
            'driver': str(driver()) if driver is not None and torch.cuda.is_available() else 'none',
            'torch': torch.__version__, 'triton': triton.__version__, 'kernels': kernels_hash()}


def cache_file(gpu) -> Path:
    """The file of the verdicts on ``gpu`` in this environment."""
    key = json.dumps(environment(gpu), sort_keys=True)
    return cache_dir() / f'kernel_verdicts_{hashlib.sha256(key.encode()).hexdigest()[:16]}.json'


def load(gpu) -> Dict[str, dict]:
    """The verdicts kept for ``gpu``, by variant; none where there is no file or it cannot be read."""
    try:
        with open(cache_file(gpu)) as f:
            return json.load(f)['verdicts']
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def store(gpu, variant: str, verdict: dict) -> None:
    """Adds ``verdict`` on ``variant`` to the file of ``gpu``'s, written whole, then renamed over the old one. A
    cache that cannot be written costs the next run a check, nothing more."""
    path = cache_file(gpu)
    verdicts = load(gpu)
    verdicts[variant] = verdict
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix='.tmp')
    except OSError:
        return
    try:
        with os.fdopen(handle, 'w') as f:
            json.dump({'environment': environment(gpu), 'verdicts': verdicts}, f, indent=1, sort_keys=True)
        os.replace(temporary, path)
    except OSError:
        os.unlink(temporary)
