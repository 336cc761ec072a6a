"""The suite's hooks and shared fixtures; what the tests import is in tests/helpers."""
import collections
import os
import sys
import time

import pytest
import torch

# Where there is no GPU, the Triton kernels run on CPU tensors in Triton's interpreter, which Triton reads when a
# kernel is defined: before the first import of mala_mm
if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')

from tests.helpers import SMALL_ARCH, bf16_matmul_slowdown, run_tool  # noqa: E402


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
    tests/e2e/test_end_to_end.py, 39 s on its own, took 155 s beside another worker with 2 threads each)."""
    workers = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', 1))
    if workers > 1:
        share = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(share)
        os.environ.setdefault('OMP_NUM_THREADS', str(share))


# The files that take longest, longest first, by the times per file that the end of a run prints
# (docs/dev/testing.md). The suite's wall time is at least that of its longest file, which therefore has to start
# at once.
LONGEST_FILES = ('test_end_to_end.py', 'test_custom_dataset.py', 'test_bundle.py', 'test_cluster.py',
                 'test_export_tool.py', 'test_compile.py', 'test_fallback.py')


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


@pytest.fixture
def small_arch():
    return dict(SMALL_ARCH)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _verdict_cache(monkeypatch, tmp_path):
    """The kernels' verdicts (mala_mm.ops.verdict_cache) kept in the test's own folder, not the user's cache: a
    test's planted kernels leave no verdict to the next."""
    monkeypatch.setenv('MALA_MM_CACHE', str(tmp_path / 'cache'))


@pytest.fixture(scope='session')
def builtin_workspace(tmp_path_factory):
    """A working directory with the built-in dataset at data/builtin, as the configs expect. Shared: tests
    only add work dirs to it."""
    cwd = tmp_path_factory.mktemp('builtin')
    result = run_tool(['make_builtin_dataset.py', '--out', 'data/builtin'], cwd)
    assert result.returncode == 0, result.stderr
    return cwd
