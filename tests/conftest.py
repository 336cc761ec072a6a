import os
import socket
import subprocess
import sys
import time

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Release-format checkpoint of a small arch with the release code's outputs, and the release's key layouts.
DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data')
OFFICIAL_LAYOUT_DIR = os.path.join(DATA_DIR, 'official_layout')

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
    """The environment of a tool run: this interpreter, on CPU, a free port for distributed runs."""
    return {**os.environ, 'PYTHON': sys.executable, 'PORT': free_port(), **CPU_ONLY, **env}


def run_tool(args, cwd, timeout=1800, **env) -> subprocess.CompletedProcess:
    """Run ``tools/<args[0]>`` as a user would: ``.py`` tools with this interpreter, ``.sh`` ones with PYTHON set
    to it; distributed runs get a free port."""
    tool = os.path.join(ROOT, 'tools', args[0])
    command = [sys.executable, tool, *args[1:]] if tool.endswith('.py') else ['bash', tool, *args[1:]]
    env = tool_env(**env)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope='session')
def builtin_workspace(tmp_path_factory):
    """A working directory with the built-in dataset at data/builtin, as the configs expect. Shared: tests
    only add work dirs to it."""
    cwd = tmp_path_factory.mktemp('builtin')
    result = run_tool(['make_builtin_dataset.py', '--out', 'data/builtin'], cwd)
    assert result.returncode == 0, result.stderr
    return cwd
