import importlib.util
import os
import socket
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Release-format checkpoint of a small arch with the release code's outputs, and the release's key layouts.
DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data')
OFFICIAL_LAYOUT_DIR = os.path.join(DATA_DIR, 'official_layout')

# A small arch that keeps every structural feature of the released ones (4 stages, both attention kinds).
SMALL_ARCH = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 2, 1], num_heads=[1, 2, 3, 4])


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


def import_tool(path: str):
    """The module of ``tools/<path>``, to test its functions (tools are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0],
                                                  os.path.join(ROOT, 'tools', path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_tool(args, cwd, timeout=1800, **env) -> subprocess.CompletedProcess:
    """Run ``tools/<args[0]>`` as a user would: ``.py`` tools with this interpreter, ``.sh`` ones with PYTHON set
    to it; distributed runs get a free port."""
    tool = os.path.join(ROOT, 'tools', args[0])
    command = [sys.executable, tool, *args[1:]] if tool.endswith('.py') else ['bash', tool, *args[1:]]
    env = dict(os.environ, PYTHON=sys.executable, PORT=free_port(), **env)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope='session')
def builtin_workspace(tmp_path_factory):
    """A working directory with the built-in dataset at data/builtin, as the configs expect. Shared: tests
    only add work dirs to it."""
    cwd = tmp_path_factory.mktemp('builtin')
    result = run_tool(['make_builtin_dataset.py', '--out', 'data/builtin'], cwd)
    assert result.returncode == 0, result.stderr
    return cwd
