import collections
import contextlib
import copy
import functools
import io
import os
import runpy
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import torch

# Where there is no GPU, the Triton kernels run on CPU tensors in Triton's interpreter, which Triton reads when a
# kernel is defined: before the first import of mala_mm
if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')

from mmengine.config import Config  # noqa: E402
from mmengine.utils import ManagerMixin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Release-format checkpoint of a small arch with the release code's outputs, and the release's key layouts.
DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data')
OFFICIAL_LAYOUT_DIR = os.path.join(DATA_DIR, 'official_layout')

CONFIG_ROOT = Path(ROOT) / 'configs'
# the paper's configs (COCO, ADE20K), relative to CONFIG_ROOT
LEAF_CONFIGS = sorted(
    str(path.relative_to(CONFIG_ROOT)) for task in ('detection', 'segmentation')
    for path in (CONFIG_ROOT / task).rglob('*.py')
    if '_base_' not in path.parts and 'builtin' not in path.name)
# the built-in configs, which train on the built-in shapes dataset
BUILTIN_CONFIGS = sorted(str(path.relative_to(CONFIG_ROOT)) for path in CONFIG_ROOT.rglob('*_builtin.py'))


def load_config(path) -> Config:
    """``Config.fromfile(path)`` for a config of this repository, which does not change during the suite: parsed
    once (a paper config's chain of bases takes about a second), each call given its own copy to change."""
    return copy.deepcopy(_parsed_config(os.path.abspath(str(path))))


@functools.lru_cache(maxsize=None)
def _parsed_config(path: str) -> Config:
    return Config.fromfile(path)

# A small arch that keeps every structural feature of the released ones (4 stages, both attention kinds).
SMALL_ARCH = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 2, 1], num_heads=[1, 2, 3, 4])


def feature_loss(features, seed: int = 1) -> torch.Tensor:
    """A loss that depends on every feature value: the mean of each map weighted by fixed random numbers. (A
    function of the maps' mean squares would not do: each output passes a LayerNorm, which at its initialisation
    fixes that mean square, and the gradient into the network would be rounding noise alone.)"""
    generator = torch.Generator().manual_seed(seed)
    return sum((f.float() * torch.randn(f.shape, generator=generator)).mean() for f in features)


def pytest_report_header(config):
    """The machine and stack the suite runs on. CPUs without bf16 units emulate bf16 matmuls, tens of times
    slower than fp32, and a source-built mmcv means that the first run spent its time compiling."""
    import mmcv
    source_file = os.path.join(sys.prefix, '.mala_mm_mmcv_source')
    if os.path.isfile(source_file):
        with open(source_file) as f:
            mmcv_source = f.read().strip()
    else:
        mmcv_source = 'installed before tools/setup_env.sh ran'
    return [f'cpu: capability {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores, '
            f'{torch.get_num_threads()} torch threads; a bf16 matmul takes {bf16_matmul_slowdown():.1f}x '
            f'the time of fp32',
            f'torch {torch.__version__}, mmcv {mmcv.__version__} ({mmcv_source})']


def pytest_configure(config):
    """Under pytest-xdist, each worker's torch, and each tool process it starts, takes the worker's share of the
    cores: with more threads than cores, OpenMP threads wait for each other (the bf16 training of
    tests/test_end_to_end.py, 39 s on its own, took 155 s beside another worker with 2 threads each)."""
    workers = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', 1))
    if workers > 1:
        share = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(share)
        os.environ.setdefault('OMP_NUM_THREADS', str(share))


# The files that take longest, longest first (seconds in `.ci/run` on 2 cores: docs/dev/testing.md).
# The suite's wall time is at least that of its longest file, which therefore has to start at once.
LONGEST_FILES = ('test_end_to_end.py', 'test_custom_dataset.py', 'test_bundle.py', 'test_cluster.py',
                 'test_export.py', 'test_compile.py')


@pytest.hookimpl(trylast=True)  # after pytest has grouped the tests by their fixtures' parameters
def pytest_collection_modifyitems(items):
    """The longest files first, then the other slow tests, each file's in its order: under pytest-xdist, which
    hands out whole files in this order, the long runs start at once and the short ones fill the workers' time
    around them."""
    def rank(item):
        name = item.path.name
        return (LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES),
                item.get_closest_marker('slow') is None)
    items.sort(key=rank)


_SECONDS_BY_FILE = collections.Counter()
_SESSION_START = []


def pytest_sessionstart(session):
    _SESSION_START.append(time.monotonic())


def pytest_runtest_logreport(report):
    _SECONDS_BY_FILE[report.nodeid.split('::')[0]] += report.duration


def pytest_terminal_summary(terminalreporter):
    """The time each test file took (set-up, call and tear-down of its tests, shared fixtures charged to the
    first test that asks for them) and the suite's wall time: what a new test is sized against
    (docs/dev/testing.md)."""
    if not _SECONDS_BY_FILE:
        return
    terminalreporter.section('time per test file')
    for path, seconds in _SECONDS_BY_FILE.most_common():
        terminalreporter.write_line(f'{seconds:8.1f} s  {path}')
    wall = time.monotonic() - _SESSION_START[0]
    terminalreporter.write_line(f'{sum(_SECONDS_BY_FILE.values()):8.1f} s  in all tests; the suite ran {wall:.0f} s')


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


@pytest.fixture
def small_arch():
    return dict(SMALL_ARCH)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def free_port() -> str:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return str(s.getsockname()[1])


def config_with_hooks(path, base: str, hooks, *lines: str) -> str:
    """Write, at ``path``, the config ``base`` with ``hooks`` (config source of hook dicts) as its custom hooks,
    the hooks of tests/fault_injection.py registered, and any further config ``lines``; returns the path."""
    path.write_text(
        f'_base_ = [{str(base)!r}]\n'
        "custom_imports = dict(imports=['mala_mm', 'fault_injection'], allow_failed_imports=False)\n"
        f"custom_hooks = [{', '.join(hooks)}]\n" + ''.join(f'{line}\n' for line in lines))
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


def call_tool(args, cwd, **env) -> subprocess.CompletedProcess:
    """Run ``tools/<args[0]>`` (a ``.py`` tool) in this process, as ``python tools/<args[0]> args[1:]`` would run it
    from ``cwd`` with the environment of :func:`tool_env` and ``env``: its exit status, as a process would end with
    it, and what it printed. For the tools' refusals and short runs: the interpreter and the stack are imported
    once for the suite, not once per call (3-5 s each); on a machine whose GPUs this process sees, in a process of its
    own (:func:`run_tool`). Tests of what only a process shows (a launcher, a kill, a fresh interpreter) use
    :func:`run_tool`."""
    if torch.cuda.is_available():
        # CUDA_VISIBLE_DEVICES='' hides a GPU host's GPUs only from a process that has not yet asked for them, and
        # this one may have: the tool runs in a process of its own, on CPU as CPU_ONLY says
        return run_tool(args, cwd, **env)
    tool = os.path.join(ROOT, 'tools', args[0])
    assert tool.endswith('.py'), f'{args[0]}: only Python tools run in-process'
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch, _mmengine_instances_of_its_own():
        patch.chdir(cwd)
        for key, value in {**CPU_ONLY, **env}.items():
            patch.setenv(key, value)
        patch.setattr(sys, 'argv', [tool, *args[1:]])
        patch.setattr(sys, 'stdout', out)
        patch.setattr(sys, 'stderr', err)
        try:
            runpy.run_path(tool, run_name='__main__')
            status = 0
        except SystemExit as exit:
            if exit.code is None or isinstance(exit.code, int):
                status = exit.code or 0
            else:  # sys.exit(message): Python prints the message and ends with status 1
                print(exit.code, file=err)
                status = 1
        except Exception:  # as the interpreter ends on an uncaught error: its traceback, status 1
            traceback.print_exc(file=err)
            status = 1
    return subprocess.CompletedProcess(args, status, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _mmengine_instances_of_its_own():
    """None of mmengine's named global instances (loggers, message hubs, visualizers, default scopes) in the block,
    as in a new process, and those of before once it ends: what a tool's process takes with it when it exits. A
    Runner reuses an instance of the name it asks for, and mmdet's and mmseg's configs and inferencers name their
    visualizer alike: a run in this process would write into the folder of an earlier one."""
    def manager_classes(cls=ManagerMixin):
        for subclass in cls.__subclasses__():
            yield subclass
            yield from manager_classes(subclass)

    before = {cls: dict(cls._instance_dict) for cls in manager_classes()}
    for cls in before:
        cls._instance_dict.clear()
    try:
        yield
    finally:
        for cls in manager_classes():
            cls._instance_dict.clear()
            cls._instance_dict.update(before.get(cls, {}))


@pytest.fixture(scope='session')
def builtin_workspace(tmp_path_factory):
    """A working directory with the built-in dataset at data/builtin, as the configs expect. Shared: tests
    only add work dirs to it."""
    cwd = tmp_path_factory.mktemp('builtin')
    result = run_tool(['make_builtin_dataset.py', '--out', 'data/builtin'], cwd)
    assert result.returncode == 0, result.stderr
    return cwd
