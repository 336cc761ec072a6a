"""What the tests share: the repository's paths and configs, a small arch, and running the tools as a user does.

The modules beside this one: ``low_precision`` (the dtypes and tolerances of the mixed-precision tests, and the
operators' implementations as test parameters, checked against their fp64 reference), ``launches`` (the kernels
that code launches), ``hostile_pickles`` (pickles that run code when loaded), ``fault_injection`` (hooks that
child runs import to be killed or to dump their state) and ``slow_rank/sitecustomize.py`` (a rank that starts
late).
"""
import contextlib
import copy
import functools
import multiprocessing
import os
import runpy
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import pytest
import torch
from mmengine.config import Config

from mala_mm.ops.self_check import relative_error  # noqa: F401  (the tests' measure)
from mala_mm.ops.torch_compat import HAS_CUSTOM_OPS

ROOT = str(Path(__file__).resolve().parents[2])
# where fault_injection.py is: child runs that load its hooks have it on their PYTHONPATH
HELPERS_DIR = os.path.dirname(os.path.abspath(__file__))
# Release-format checkpoint of a small arch with the release code's outputs, and the release's key layouts.
DATA_DIR = os.path.join(ROOT, 'tests', 'data')
OFFICIAL_LAYOUT_DIR = os.path.join(DATA_DIR, 'official_layout')

CONFIG_ROOT = Path(ROOT) / 'configs'
# the paper's configs (COCO, ADE20K), relative to CONFIG_ROOT
LEAF_CONFIGS = sorted(
    str(path.relative_to(CONFIG_ROOT)) for task in ('detection', 'segmentation')
    for path in (CONFIG_ROOT / task).rglob('*.py')
    if '_base_' not in path.parts and 'builtin' not in path.name)
# the built-in configs, which train on the built-in shapes dataset
BUILTIN_CONFIGS = sorted(str(path.relative_to(CONFIG_ROOT)) for path in CONFIG_ROOT.rglob('*_builtin.py'))


# The interpreter of Triton 3.2 to 3.6 (not 3.9) reads a kernel's loop bound with int() of a one-element numpy
# array, which numpy 1.25 deprecates: Triton 3.4, torch 2.8's, warns at each such loop under Python 3.9's numpy 2.0.
# Triton's own warning, which pytest.ini ignores and the tests that count warnings, or make them errors, set aside
INTERPRETER_DEPRECATION = dict(message='Conversion of an array with ndim > 0 to a scalar', category=DeprecationWarning,
                               module=r'triton\.runtime\.interpreter')


def ignore_interpreter_deprecation() -> None:
    """Inside ``warnings.catch_warnings()`` or ``pytest.warns``: the interpreter's deprecation (above) ignored, ahead
    of the filters that the block set."""
    warnings.filterwarnings('ignore', **INTERPRETER_DEPRECATION)


@contextlib.contextmanager
def warnings_as_errors():
    """Every warning raised as an error inside, but the interpreter's deprecation."""
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        ignore_interpreter_deprecation()
        yield


def load_config(path) -> Config:
    """``Config.fromfile(path)`` for a config of this repository, which does not change during the suite: parsed
    once (a paper config's chain of bases takes about a second), each call given its own copy to change."""
    return copy.deepcopy(_parsed_config(os.path.abspath(str(path))))


@functools.lru_cache(maxsize=None)
def _parsed_config(path: str) -> Config:
    return Config.fromfile(path)


# A small arch that keeps every structural feature of the released ones (4 stages, both attention kinds).
# torch.compile of the blocks and of mala_mm::conv2d needs custom operators (torch.library.custom_op, torch 2.4)
NEEDS_CUSTOM_OPS = pytest.mark.skipif(not HAS_CUSTOM_OPS, reason=f'torch {torch.__version__} has no custom operators '
                                      '(torch.library.custom_op, torch 2.4), which compiling MALA needs')

SMALL_ARCH = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 2, 1], num_heads=[1, 2, 3, 4])


def feature_loss(features, seed: int = 1) -> torch.Tensor:
    """A loss that depends on every feature value: the mean of each map weighted by fixed random numbers. (A
    function of the maps' mean squares would not do: each output passes a LayerNorm, which at its initialisation
    fixes that mean square, and the gradient into the network would be rounding noise alone.)"""
    generator = torch.Generator().manual_seed(seed)
    return sum((f.float() * torch.randn(f.shape, generator=generator)).mean() for f in features)


def bf16_matmul_slowdown(size: int = 256, repeats: int = 5) -> float:
    """Median time of a bf16 matmul over that of the same fp32 one, measured on this CPU."""
    def median_time(a):
        a @ a
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ a
            times.append(time.perf_counter() - start)
        return sorted(times)[repeats // 2]

    a = torch.randn(size, size)
    return median_time(a.bfloat16()) / median_time(a)


def free_port() -> str:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return str(s.getsockname()[1])


def git_env(home) -> dict:
    """The environment of a git command in a test: no user or system configuration of this machine (no excludes,
    hooks or templates of its own), ``home`` as HOME, and an author and committer for commits."""
    return {**os.environ, 'HOME': str(home), 'XDG_CONFIG_HOME': str(home), 'GIT_CONFIG_NOSYSTEM': '1',
            'GIT_CONFIG_GLOBAL': os.devnull, 'GIT_AUTHOR_NAME': 'Test', 'GIT_AUTHOR_EMAIL': 'test@example.com',
            'GIT_COMMITTER_NAME': 'Test', 'GIT_COMMITTER_EMAIL': 'test@example.com'}


def config_with_hooks(path, base: str, hooks, *lines: str, leave_out=()) -> str:
    """Write, at ``path``, the config ``base`` with ``hooks`` (config source of hook dicts) as its custom hooks,
    beside the default hooks it has (this project's among them) but those named in ``leave_out``, the hooks of
    tests/helpers/fault_injection.py registered (the run has HELPERS_DIR on its PYTHONPATH), and any further config
    ``lines``; returns the path."""
    # mmengine's Runner takes None for its own default hooks only, so a hook is left out by rewriting the dict
    kept = (f"default_hooks = dict(_delete_=True, **{{name: hook for name, hook in _base_.default_hooks.items() "
            f"if name not in {sorted(leave_out)!r}}})\n") if leave_out else ''
    path.write_text(
        f'_base_ = [{str(base)!r}]\n'
        "custom_imports = dict(imports=['mala_mm', 'fault_injection'], allow_failed_imports=False)\n"
        f"custom_hooks = [{', '.join(hooks)}]\n" + kept + ''.join(f'{line}\n' for line in lines))
    return str(path)


# The tools' runs in these tests are CPU runs, on a GPU host too: bit-identical resume and two-node weights hold
# on CPU only (CUDA's flash attention and RoIAlign backward add with atomics, in varying order; cuBLAS refuses
# deterministic mode without CUBLAS_WORKSPACE_CONFIG), and two-process runs would need two GPUs.
CPU_ONLY = dict(CUDA_VISIBLE_DEVICES='', MALA_MM_ALLOW_CPU='1')


def tool_env(**env) -> dict:
    """The environment of a tool run: this interpreter, on CPU, and no PORT, so that single-node launches let
    torchrun choose a free port, as a user's do."""
    inherited = {key: value for key, value in os.environ.items() if key != 'PORT'}
    return {**inherited, 'PYTHON': sys.executable, **CPU_ONLY, **env}


def run_tool(args, cwd, timeout=1800, **env) -> subprocess.CompletedProcess:
    """Run ``tools/<args[0]>`` as a user would: ``.py`` tools with this interpreter, ``.sh`` ones with PYTHON set
    to it."""
    tool = os.path.join(ROOT, 'tools', args[0])
    command = [sys.executable, tool, *args[1:]] if tool.endswith('.py') else ['bash', tool, *args[1:]]
    env = tool_env(**env)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


# A tool's process for call_tool is forked from a server process that has imported the stack once, for the
# whole suite, and nothing else: each tool starts as a fresh interpreter would, without the 3-5 s of imports.
_TOOL_PROCESSES = multiprocessing.get_context('forkserver')
_TOOL_PROCESSES.set_forkserver_preload(['torch', 'mmengine.runner', 'mmdet.models', 'mmseg.models', 'mala_mm'])


def call_tool(args, cwd, timeout=1800, **env) -> subprocess.CompletedProcess:
    """Run ``tools/<args[0]>`` (a ``.py`` tool) as ``python tools/<args[0]> args[1:]`` would, from ``cwd`` with the
    environment of :func:`tool_env` and ``env``, in a process forked from one that has the stack imported: its
    exit status and what it printed. For the tools' refusals and short runs; tests of what only a launch shows (a
    launcher, a kill, a fresh interpreter) use :func:`run_tool`, and so does this on a machine whose GPUs this
    process sees, where the tool must not inherit a CUDA context."""
    if torch.cuda.is_available():
        return run_tool(args, cwd, timeout, **env)
    tool = os.path.join(ROOT, 'tools', args[0])
    assert tool.endswith('.py'), f'{args[0]}: only Python tools run in a forked process'
    with tempfile.TemporaryDirectory() as folder:
        stdout, stderr = os.path.join(folder, 'stdout'), os.path.join(folder, 'stderr')
        process = _TOOL_PROCESSES.Process(target=_run_as_main,
                                          args=(tool, args[1:], str(cwd), tool_env(**env), stdout, stderr))
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(args, timeout)
        with open(stdout) as out, open(stderr) as err:
            return subprocess.CompletedProcess(args, process.exitcode, out.read(), err.read())


def _run_as_main(tool: str, args, cwd: str, env: dict, stdout: str, stderr: str):
    """In a forked process: run ``tool`` as the interpreter runs a script, its output into the files ``stdout`` and
    ``stderr``, and end with the status the interpreter would."""
    for stream, path in ((1, stdout), (2, stderr)):
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(descriptor, stream)
        os.close(descriptor)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [tool, *args]
    try:
        runpy.run_path(tool, run_name='__main__')
        status = 0
    except SystemExit as exit:
        if exit.code is None or isinstance(exit.code, int):
            status = exit.code or 0
        else:  # sys.exit(message): Python prints the message and ends with status 1
            print(exit.code, file=sys.stderr)
            status = 1
    except BaseException:  # as the interpreter ends on an uncaught error: its traceback, status 1
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(status)
