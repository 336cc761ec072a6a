"""The launchers run what the user runs: the interpreter they choose and why, the line that says so, and their
refusal to train on CPU on a machine with NVIDIA GPUs; and the shell logic of tools/setup_env.sh.

Every launcher run here stops at a check before torchrun starts (more processes than the machine has, or a
config whose dataset is missing), so each test takes seconds. The NVIDIA probes are replaced in every run, so
that the tests behave alike on machines with and without GPUs."""
import os
import os.path as osp
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import mmcv.ops
import pytest
import torch

from tests.helpers import ROOT, call_tool, run_tool, tool_env

DET_CONFIG = osp.join(ROOT, 'configs/detection/mask_rcnn_mala_t_builtin.py')
SEG_CONFIG = osp.join(ROOT, 'configs/segmentation/upernet_mala_t_builtin.py')
FIRST_LINE = re.compile(r'\[mala_mm\] python: (?P<python>.+?) \(torch (?P<torch>\S+), (?P<cuda>[^)]+)\), '
                        r'chosen by (?P<reason>.+)')


def executable(path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def python_wrapper(path) -> str:
    """An interpreter at ``path`` that is this test's interpreter, as a venv's bin/python would be."""
    return executable(path, f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')


def fake_nvidia_smi(path, gpus: int) -> str:
    listing = ''.join(f'echo "GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d})"\n' for i in range(gpus))
    return executable(path, f'#!/bin/sh\n{listing}')


def fake_torch_interpreter(path, torch_version: str, cuda: str, gpus: int) -> str:
    """An interpreter whose torch is the given build: this test's Python with a stand-in torch module first on its
    path, answering the launchers' check (tools/mala_tools/device.py) with that build's version, CUDA version and
    usable GPUs, and failing ``torch.cuda.init()`` as a CUDA build without a usable driver does."""
    stand_in = path.parent / 'torch_build' / 'torch'
    stand_in.mkdir(parents=True, exist_ok=True)
    (stand_in / '__init__.py').write_text(
        f'__version__ = {torch_version!r}\n'
        f'class version:\n    cuda = {None if cuda == "none" else cuda!r}\n'
        f'class cuda:\n    is_available = staticmethod(lambda: {gpus} > 0)\n'
        f'    device_count = staticmethod(lambda: {gpus})\n'
        f'    def init():\n        raise RuntimeError("Found no NVIDIA driver on your system.")\n')
    return executable(path, f'#!/bin/sh\nPYTHONPATH={shlex.quote(str(stand_in.parent))}:$PYTHONPATH '
                            f'exec {shlex.quote(sys.executable)} "$@"\n')


def cpu_torch(tmp_path) -> str:
    """An interpreter whose torch is a CPU build, on any host: the chosen python of a GPU machine set up wrong."""
    return fake_torch_interpreter(tmp_path / 'cpu_torch' / 'python', '2.13.0+cpu', 'none', 0)


def launcher_env(tmp_path, **changes) -> dict:
    """The environment of a new shell: no PYTHON, no active environment, no CPU opt-in, no multi-node or port
    settings, and NVIDIA probes that find no GPU; then ``changes``."""
    env = {key: value for key, value in os.environ.items()
           if key not in ('PYTHON', 'VIRTUAL_ENV', 'CONDA_PREFIX', 'MALA_MM_ALLOW_CPU', 'PORT', 'NNODES', 'NODE_RANK',
                          'MASTER_ADDR', 'MAX_RESTARTS', 'RDZV_ID')}
    env.update(MALA_MM_NVIDIA_SMI='false', MALA_MM_NVIDIA_GPUS_DIR=str(tmp_path / 'no_nvidia_driver'))
    env.update(changes)
    return env


def launch(args, env, cwd, tools=osp.join(ROOT, 'tools')) -> subprocess.CompletedProcess:
    return subprocess.run(['bash', osp.join(tools, args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def more_processes_than_the_machine_has() -> int:
    if torch.cuda.is_available():
        return torch.cuda.device_count() + 1
    return len(os.sched_getaffinity(0)) + 1


def refused_for_too_many_processes(tmp_path, env, tools=osp.join(ROOT, 'tools')) -> re.Match:
    """Run dist_train.sh with more processes than the machine has; returns its first line, parsed."""
    result = launch(['dist_train.sh', DET_CONFIG, str(more_processes_than_the_machine_has())], env, tmp_path, tools)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.splitlines()
    assert 'processes, but this machine has' in lines[-1], result.stderr
    first = FIRST_LINE.fullmatch(lines[0])
    assert first, result.stderr
    return first


@pytest.mark.parametrize('variables, chosen, reason', [
    (('PYTHON', 'VIRTUAL_ENV', 'CONDA_PREFIX'), 'python_variable/python', 'PYTHON'),
    (('VIRTUAL_ENV', 'CONDA_PREFIX'), 'venv/bin/python', 'the active environment (VIRTUAL_ENV)'),
    (('CONDA_PREFIX',), 'conda/bin/python', 'the active environment (CONDA_PREFIX)'),
])
def test_the_interpreter_the_user_names_or_activates(tmp_path, variables, chosen, reason):
    python_wrapper(tmp_path / 'python_variable' / 'python')
    python_wrapper(tmp_path / 'venv' / 'bin' / 'python')
    python_wrapper(tmp_path / 'conda' / 'bin' / 'python')
    values = {'PYTHON': str(tmp_path / 'python_variable' / 'python'), 'VIRTUAL_ENV': str(tmp_path / 'venv'),
              'CONDA_PREFIX': str(tmp_path / 'conda')}
    first = refused_for_too_many_processes(tmp_path, launcher_env(tmp_path, **{v: values[v] for v in variables}))
    assert first['python'] == str(tmp_path / chosen)
    assert first['reason'] == reason


def checkout_with_launchers(checkout) -> str:
    """A checkout at ``checkout`` with the launcher and what it runs, without a .venv; returns its tools folder."""
    tools = checkout / 'tools'
    tools.mkdir(parents=True)
    for script in ('dist_checks.sh', 'dist_train.sh'):
        shutil.copy(osp.join(ROOT, 'tools', script), tools)
    shutil.copytree(osp.join(ROOT, 'tools', 'mala_tools'), tools / 'mala_tools')
    return str(tools)


def test_the_repository_venv_without_an_active_environment(tmp_path):
    # a checkout of its own: the repository this suite runs from has no .venv where it was installed otherwise
    checkout_tools = checkout_with_launchers(tmp_path / 'checkout')
    venv_python = python_wrapper(tmp_path / 'checkout' / '.venv' / 'bin' / 'python')
    first = refused_for_too_many_processes(tmp_path, launcher_env(tmp_path), tools=checkout_tools)
    assert first['python'] == venv_python
    assert first['reason'] == 'the repository .venv, as neither PYTHON nor an active environment names one'


def test_python_on_path_in_a_checkout_without_venv(tmp_path):
    checkout_tools = checkout_with_launchers(tmp_path / 'checkout')
    on_path = python_wrapper(tmp_path / 'bin' / 'python')
    env = launcher_env(tmp_path, PATH=f'{tmp_path / "bin"}:{os.environ["PATH"]}')
    first = refused_for_too_many_processes(tmp_path, env, tools=checkout_tools)
    assert first['python'] == on_path
    assert first['reason'] == 'PATH, as neither PYTHON, an active environment nor a repository .venv names one'


def test_the_first_line_names_the_interpreter_its_torch_and_cuda(tmp_path):
    first = refused_for_too_many_processes(tmp_path, launcher_env(tmp_path, PYTHON=sys.executable))
    assert first['python'] == sys.executable and first['torch'] == torch.__version__
    if torch.version.cuda is None:
        assert first['cuda'] == 'CUDA: none'
    else:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        assert first['cuda'] == f'CUDA {torch.version.cuda}, {gpus} GPU' + ('' if gpus == 1 else 's')


@pytest.mark.parametrize('probe', ['nvidia-smi', '/proc/driver/nvidia/gpus'])
def test_a_gpu_machine_refuses_a_cpu_torch(tmp_path, probe):
    if probe == 'nvidia-smi':
        gpus = dict(MALA_MM_NVIDIA_SMI=fake_nvidia_smi(tmp_path / 'nvidia-smi', gpus=2))
    else:  # a driver whose nvidia-smi is missing: one folder per GPU
        for bus in ('0000:17:00.0', '0000:65:00.0'):
            (tmp_path / 'gpus' / bus).mkdir(parents=True)
        gpus = dict(MALA_MM_NVIDIA_GPUS_DIR=str(tmp_path / 'gpus'))
    # one process and a config whose dataset is missing here: past the check, it would start and fail later
    python = cpu_torch(tmp_path)
    result = launch(['dist_test.sh', DET_CONFIG, DET_CONFIG, '1'], launcher_env(tmp_path, PYTHON=python, **gpus),
                    tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    first, error = result.stderr.splitlines()
    assert FIRST_LINE.fullmatch(first)
    assert error == (f'error: {socket.gethostname()} has 2 NVIDIA GPUs, but torch 2.13.0+cpu is built without CUDA; '
                     f'install the torch build for this driver (docs/get_started.md#which-torch-for-which-driver), '
                     f'or set MALA_MM_ALLOW_CPU=1 to run on CPU anyway')


def test_the_opt_in_runs_a_cpu_torch_on_a_gpu_machine(tmp_path):
    env = launcher_env(tmp_path, PYTHON=cpu_torch(tmp_path), MALA_MM_ALLOW_CPU='1',
                       MALA_MM_NVIDIA_SMI=fake_nvidia_smi(tmp_path / 'nvidia-smi', gpus=2))
    result = launch(['dist_train.sh', DET_CONFIG, '65'], env, tmp_path)
    # past the GPU check: the process count is then checked against the machine's CPU cores
    assert result.returncode == 2, result.stderr[-3000:]
    first, note, error = result.stderr.splitlines()
    assert FIRST_LINE.fullmatch(first)
    assert note == '[mala_mm] MALA_MM_ALLOW_CPU=1: running on CPU although this machine has 2 NVIDIA GPUs'
    assert 'CPU cores and no CUDA GPU' in error


@pytest.mark.parametrize('torch_gpus, machine_gpus, processes, error', [
    (8, 8, '9', re.escape('error: asked for 9 processes, but this machine has 8 CUDA GPUs; pass GPUS <= 8')),
    (0, 1, '1', 'error: .*' + re.escape('has 1 NVIDIA GPU, but torch 2.5.1+cu124 (CUDA 12.4) cannot use them: '
                                        'Found no NVIDIA driver on your system.') + '.*'),
])
def test_a_cuda_torch_is_shown_with_the_gpus_it_sees_and_they_bound_the_launch(
        tmp_path, torch_gpus, machine_gpus, processes, error):
    """With 8 GPUs they bound the process count; a CUDA torch that sees none of the machine's GPUs is refused.
    ``error`` is a pattern of the whole error line."""
    env = launcher_env(tmp_path, PYTHON=fake_torch_interpreter(tmp_path / 'python', '2.5.1+cu124', '12.4',
                                                               torch_gpus),
                       MALA_MM_NVIDIA_SMI=fake_nvidia_smi(tmp_path / 'nvidia-smi', gpus=machine_gpus))
    result = launch(['dist_train.sh', DET_CONFIG, processes], env, tmp_path)
    assert result.returncode == 2
    first, line = result.stderr.splitlines()
    assert first == (f'[mala_mm] python: {tmp_path / "python"} (torch 2.5.1+cu124, CUDA 12.4, {torch_gpus} GPUs), '
                     'chosen by PYTHON')
    assert re.fullmatch(error, line), line


@pytest.mark.parametrize('interpreter', ['no torch', 'missing'])
def test_an_interpreter_that_cannot_run_the_launch_is_one_line(tmp_path, interpreter):
    if interpreter == 'no torch':
        python = executable(tmp_path / 'python', '#!/bin/sh\necho "Traceback (most recent call last):" >&2\n'
                                                 'echo "ModuleNotFoundError: No module named \'torch\'" >&2\nexit 1\n')
        expected = (f"error: {python} (chosen by PYTHON) cannot run the launch check: ModuleNotFoundError: No "
                    f"module named 'torch'; activate the environment that has the stack (docs/get_started.md) or "
                    f"set PYTHON to its python")
    else:
        python = str(tmp_path / 'no_such_python')
        expected = (f"error: the interpreter '{python}' (chosen by PYTHON) does not exist; set PYTHON to the python "
                    f"of the environment that has torch and mala_mm")
    result = launch(['dist_train.sh', DET_CONFIG, '1'], launcher_env(tmp_path, PYTHON=python), tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [expected]


def test_slurm_launchers_check_the_interpreter_before_submitting(tmp_path):
    fake_srun = executable(tmp_path / 'bin' / 'srun', '#!/bin/sh\necho submitted\n')
    env = launcher_env(tmp_path, PYTHON=cpu_torch(tmp_path), PATH=f'{osp.dirname(fake_srun)}:{os.environ["PATH"]}')
    result = launch(['slurm_train.sh', 'gpu', 'job', DET_CONFIG, 'work'], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == 'submitted\n'
    assert any(FIRST_LINE.fullmatch(line) for line in result.stderr.splitlines())
    env['MALA_MM_NVIDIA_SMI'] = fake_nvidia_smi(tmp_path / 'nvidia-smi', gpus=8)
    result = launch(['slurm_train.sh', 'gpu', 'job', DET_CONFIG, 'work'], env, tmp_path)
    assert result.returncode == 2 and result.stdout == ''
    assert re.search(r'error: \S+ has 8 NVIDIA GPUs', result.stderr), result.stderr


@pytest.mark.parametrize('tool, args, expected', [
    ('slurm_train.sh', ['CONFIG', 'WORK'], ['train.py', 'CONFIG', '--work-dir=WORK', '--launcher=slurm', '--amp']),
    ('slurm_test.sh', ['CONFIG', 'CKPT'], ['test.py', 'CONFIG', 'CKPT', '--launcher=slurm', '--amp']),
])
def test_slurm_launchers_start_one_task_per_gpu(tmp_path, tool, args, expected):
    # an srun that prints what it was asked to run
    fake_srun = executable(tmp_path / 'bin' / 'srun', '#!/bin/sh\nprintf "%s\\n" "$@"\n')
    result = run_tool([tool, 'gpu-partition', 'job', *args, '--amp'], cwd=tmp_path,
                      PATH=f'{osp.dirname(fake_srun)}:{os.environ["PATH"]}', GPUS='16', SRUN_ARGS='--time=1:00:00')
    assert result.returncode == 0, result.stderr
    srun_args = result.stdout.split('\n')
    assert srun_args[:8] == ['--kill-on-bad-exit=1', '-p', 'gpu-partition', '--job-name=job', '--gres=gpu:8',
                             '--ntasks=16', '--ntasks-per-node=8', '--cpus-per-task=5']
    assert srun_args[8:10] == ['--time=1:00:00', sys.executable]
    assert srun_args[11] == osp.join(ROOT, 'tools', expected[0]) and srun_args[12:-1] == expected[1:]


@pytest.mark.slow  # a training run
def test_launchers_run_the_repository_venv_from_a_new_shell(builtin_workspace, tmp_path):
    """In a new shell (PYTHON unset, no environment active) whose `python` has no torch, dist_train.sh still
    trains: it takes the repository's .venv, which tools/setup_env.sh made."""
    assert osp.isfile(osp.join(ROOT, '.venv', 'bin', 'python')), 'tools/setup_env.sh makes .venv'
    executable(tmp_path / 'bin' / 'python', '#!/bin/sh\necho "ModuleNotFoundError: No module named \'torch\'" >&2\n'
                                            'exit 1\n')
    env = launcher_env(tmp_path, PATH=f'{tmp_path / "bin"}:{os.environ["PATH"]}')
    result = launch(['dist_train.sh', SEG_CONFIG, '1', '--work-dir', str(tmp_path / 'work'),
                     '--cfg-options', 'train_cfg.max_iters=1', 'param_scheduler=None',
                     'default_hooks.checkpoint.interval=1', 'val_cfg=None', 'val_dataloader=None',
                     'val_evaluator=None'], env, builtin_workspace)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / 'work' / 'iter_1.pth').is_file()


# tools/setup_env.sh, sourced: its functions without the installation


def setup_env_function(call: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(['bash', '-c', f'source "{ROOT}/tools/setup_env.sh" && {call}', 'setup_env', *args],
                          capture_output=True, text=True, timeout=120)


# mmcv 2.1.0's get_version, as its setup.py has it: Python 3.13 stops on it with KeyError: '__version__'
MMCV_GET_VERSION = """def get_version():
    version_file = 'mmcv/version.py'
    with open(version_file, encoding='utf-8') as f:
        exec(compile(f.read(), version_file, 'exec'))
    return locals()['__version__']
"""


def test_mmcv_source_comes_from_pips_find_links_with_a_setup_py_that_reads_its_version(tmp_path):
    sdist = tmp_path / 'src' / 'mmcv-2.1.0'
    (sdist / 'mmcv').mkdir(parents=True)
    (sdist / 'mmcv' / 'version.py').write_text("__version__ = '2.1.0'\n")
    (sdist / 'setup.py').write_text(f"{MMCV_GET_VERSION}\nextra_compile_args = ['-std=c++17']\n")
    links = tmp_path / 'links'
    links.mkdir()
    subprocess.run(['tar', '-czf', str(links / 'mmcv-2.1.0.tar.gz'), '-C', str(tmp_path / 'src'), 'mmcv-2.1.0'],
                   check=True)
    result = subprocess.run(
        ['bash', '-c', f'source "{ROOT}/tools/setup_env.sh" && PY="$1" && mmcv_source "$2" 20', 'setup_env',
         sys.executable, str(tmp_path / 'unpacked')],
        capture_output=True, text=True, timeout=120, env={**os.environ, 'PIP_FIND_LINKS': str(links),
                                                          'PIP_NO_INDEX': '1'})
    assert result.returncode == 0, result.stderr
    unpacked = result.stdout.strip()
    setup = open(osp.join(unpacked, 'setup.py')).read()
    assert 'locals()' not in setup and "'-std=c++20'" in setup
    namespace = {}
    exec(setup[:setup.index('\nextra_compile_args')], namespace)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(unpacked)
        assert namespace['get_version']() == '2.1.0'


def test_mmcv_source_stops_where_pip_finds_no_archive(tmp_path):
    result = subprocess.run(
        ['bash', '-c', f'source "{ROOT}/tools/setup_env.sh" && PY="$1" && mmcv_source "$2" 17', 'setup_env',
         sys.executable, str(tmp_path / 'unpacked')],
        capture_output=True, text=True, timeout=120, env={**os.environ, 'PIP_FIND_LINKS': str(tmp_path),
                                                          'PIP_NO_INDEX': '1'})
    assert result.returncode == 1
    assert "mmcv-2.1.0.tar.gz is in none of pip's find-links folders, and pip uses no index" in result.stderr


def test_strip_wheel_removes_the_debug_information_of_its_shared_objects(tmp_path):
    package = tmp_path / 'tree' / 'demo'
    package.mkdir(parents=True)
    (tmp_path / 'twice.c').write_text('int twice(int x) { return 2 * x; }\n')
    subprocess.run(['gcc', '-g', '-O2', '-shared', '-fPIC', '-o', str(package / '_ext.so'), str(tmp_path / 'twice.c')],
                   check=True)
    info = tmp_path / 'tree' / 'demo-1.0.dist-info'
    info.mkdir()
    (info / 'METADATA').write_text('Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n')
    tag = 'cp%d%d-cp%d%d-linux_x86_64' % (sys.version_info[:2] * 2)  # this interpreter's, for pip to install
    (info / 'WHEEL').write_text(f'Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n')
    (info / 'RECORD').write_text('')
    subprocess.run([sys.executable, '-m', 'wheel', 'pack', '-d', str(tmp_path), str(tmp_path / 'tree')], check=True,
                   capture_output=True)
    wheel = tmp_path / f'demo-1.0-{tag}.whl'

    def sections():
        subprocess.run(['unzip', '-o', '-q', str(wheel), 'demo/_ext.so', '-d', str(tmp_path / 'out')], check=True)
        return subprocess.run(['readelf', '-S', str(tmp_path / 'out' / 'demo' / '_ext.so')], capture_output=True,
                              text=True, check=True).stdout
    assert '.debug_info' in sections()
    result = setup_env_function('PY="$1" && strip_wheel "$2"', sys.executable, str(wheel))
    assert result.returncode == 0, result.stderr
    assert '.debug_info' not in sections() and '.text' in sections()
    # the wheel's RECORD was written anew: pip installs it
    installed = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-deps', '--target', str(tmp_path / 'site'),
                                str(wheel)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr


# The cuda-toolkit that torch 2.11's and 2.13's CUDA 13.0 builds require (their Requires-Dist)
CUDA_TOOLKIT = '13.0.2'


@pytest.mark.slow  # installs PyPI's CUDA compiler (about 200 MB)
def test_the_setups_cuda_toolkit_compiles_for_one_architecture(tmp_path):
    """The compiler parts the setup installs from PyPI work together: nvcc 13.0 with an nvvm of another version
    wrote PTX its ptxas refused. One kernel compiled for sm_90, no GPU needed."""
    requirement = setup_env_function('cuda_toolkit_requirement "$1"', CUDA_TOOLKIT).stdout.split()
    site = tmp_path / 'site'
    installed = subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--target', str(site), *requirement],
                               capture_output=True, text=True, timeout=1200)
    assert installed.returncode == 0, installed.stderr[-3000:]
    home = site / 'nvidia' / 'cu13'
    (tmp_path / 'scale.cu').write_text('__global__ void scale(float *x) { x[threadIdx.x] *= 2.0f; }\n')
    compiled = subprocess.run([str(home / 'bin' / 'nvcc'), '-arch=sm_90', '-c', str(tmp_path / 'scale.cu'), '-o',
                               str(tmp_path / 'scale.o')], capture_output=True, text=True, timeout=300,
                              env={**os.environ, 'CUDA_HOME': str(home),
                                   'PATH': f'{home / "bin"}:{os.environ["PATH"]}'})
    assert compiled.returncode == 0, compiled.stderr
    assert (tmp_path / 'scale.o').stat().st_size > 0


def test_build_progress_counts_ninja_lines_as_pip_indents_them(tmp_path):
    build_log = tmp_path / 'build.log'
    build_log.write_text(
        'Collecting mmcv==2.1.0\n'
        '  Running command python setup.py bdist_wheel\n'
        '  running build_ext\n'
        '  [11/77] c++ -MMD -MF build/temp.linux-x86_64-cpython-311/mmcv/ops/csrc/pytorch/nms.o.d -c nms.cpp\n'
        '  [12/77] /usr/local/cuda/bin/nvcc --generate-dependencies-with-compile -c roi_align_cuda.cu\n'
        '  [13/77] c++ -MMD -MF build/temp.linux-x86_64-cpython-311/mmcv/ops/csrc/pytorch/info.o.d -c info.cpp\n'
        '  In file included from /usr/include/c++/12/bits/stl_algo.h:61,\n'
        '  note: parameter passing for argument of type [2/3] changed\n')
    result = setup_env_function('build_progress "$1" 4', str(build_log))
    assert result.returncode == 0, result.stderr
    assert result.stdout == 'building mmcv: 4 min, files compiled: 13/77\n'
    build_log.write_text('Collecting mmcv==2.1.0\n  Running command python setup.py bdist_wheel\n')
    assert setup_env_function('build_progress "$1" 1', str(build_log)).stdout.endswith('files compiled: none yet\n')


def test_mmcv_wheels_are_cached_per_build():
    cpu = setup_env_function('mmcv_build_name 2.13.0+cpu cpu none cp311').stdout.strip()
    cuda = setup_env_function('mmcv_build_name 2.5.1+cu124 12.4 8.0_9.0 cp311').stdout.strip()
    assert cpu == 'mmcv2.1.0-torch2.13.0+cpu-cpu-cp311'
    assert cuda == 'mmcv2.1.0-torch2.5.1+cu124-cuda12.4-sm8.0_9.0-cp311'


def test_a_failed_download_of_mmcvs_source_stops_the_build_naming_it(tmp_path):
    """The fetch's error, then one line, and the build does not start (before, tar and pip went on to fail in
    turn)."""
    fetch_fails = executable(tmp_path / 'python', '#!/bin/sh\necho "error: <urlopen error timed out>" >&2\nexit 1\n')
    result = setup_env_function('PY="$1" && build_mmcv "$2/cache" cpu none none 17; echo "still running"',
                                fetch_fails, str(tmp_path))
    assert result.returncode == 1 and result.stdout == ''
    assert result.stderr == ("error: <urlopen error timed out>\n"
                             "[setup_env] error: could not fetch mmcv 2.1.0's source (above: why)\n")


def test_mmcv_works_runs_the_compiled_nms():
    """This stack's mmcv passes with the ops it was built with (CPU ops with a CUDA torch too, where the setup
    saw no GPU); one of another version is named as such."""
    ops = 'cpu' if mmcv.ops.get_compiling_cuda_version() == 'not available' else 'cuda'
    result = setup_env_function(f'PY="$1" && mmcv_works {ops}', sys.executable)
    assert (result.returncode, result.stdout) == (0, ''), result.stdout + result.stderr
    result = setup_env_function('PY="$1" && MMCV_VERSION=9.9.9 && mmcv_works', sys.executable)
    assert result.returncode == 1
    assert result.stdout == f'AssertionError: mmcv {mmcv.__version__} is installed, not 9.9.9\n'


# The tools themselves refuse CPU on a GPU machine: on a slurm compute node, no launcher of this machine ran first


@pytest.mark.parametrize('tool', ['train.py', 'test.py'])
def test_the_tools_refuse_cpu_on_a_machine_with_gpus(tmp_path, tool):
    args = [tool, DET_CONFIG] + (['missing.pth'] if tool == 'test.py' else [])
    smi = fake_nvidia_smi(tmp_path / 'nvidia-smi', gpus=4)
    refused = call_tool(args, tmp_path, MALA_MM_ALLOW_CPU='', MALA_MM_NVIDIA_SMI=smi)
    assert refused.returncode == 2
    error, = refused.stderr.splitlines()
    assert re.fullmatch(r'error: \S+ has 4 NVIDIA GPUs, but torch \S+ (is built without CUDA|\(CUDA [0-9.]+\) '
                        r'(cannot use them: .+|sees no GPU.*)); install the torch build for this driver '
                        r'\(docs/get_started.md#which-torch-for-which-driver\), or set MALA_MM_ALLOW_CPU=1 to run '
                        r'on CPU anyway', error), error
    # a node's other processes stop as well, silently: its first process speaks for the node
    quiet = call_tool(args, tmp_path, MALA_MM_ALLOW_CPU='', MALA_MM_NVIDIA_SMI=smi, LOCAL_RANK='1')
    assert (quiet.returncode, quiet.stderr) == (2, '')
    # past the check with the opt-in, or where the machine has no GPU: the next check refuses the missing data
    for env in (dict(MALA_MM_ALLOW_CPU='1', MALA_MM_NVIDIA_SMI=smi),
                dict(MALA_MM_ALLOW_CPU='', MALA_MM_NVIDIA_SMI='false',
                     MALA_MM_NVIDIA_GPUS_DIR=str(tmp_path / 'no_driver'))):
        passed = call_tool(args, tmp_path, **env)
        assert passed.returncode == 2 and 'NVIDIA' not in passed.stderr, passed.stderr[-2000:]


def fake_slurm(tmp_path, srun_body: str) -> dict:
    """srun and scontrol on PATH that append their arguments, a line per call, to srun.calls and
    scontrol.calls; srun then runs ``srun_body`` (sh)."""
    bin_dir = tmp_path / 'slurm_bin'
    executable(bin_dir / 'srun', f'#!/bin/sh\necho "$@" >> {tmp_path}/srun.calls\n{srun_body}\n')
    executable(bin_dir / 'scontrol', f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol.calls\n'
                                     f'touch {tmp_path}/requeued\n')
    return dict(PATH=f'{bin_dir}:{os.environ["PATH"]}')


def calls(tmp_path, program: str) -> list:
    path = tmp_path / f'{program}.calls'
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize('variables, rendezvous', [
    (dict(), '--standalone'),
    (dict(MAX_RESTARTS='3'), '--standalone --max-restarts=3'),
    (dict(PORT='29611'), '--nnodes=1 --node_rank=0 --master_addr=127.0.0.1 --master_port=29611'),
    (dict(NNODES='2', NODE_RANK='1', MASTER_ADDR='10.0.0.1'),
     '--nnodes=2 --node_rank=1 --master_addr=10.0.0.1 --master_port=29500'),
    (dict(NNODES='2', MASTER_ADDR='10.0.0.1', PORT='29611', MAX_RESTARTS='3'),
     '--nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=10.0.0.1:29611 --rdzv-id=mala_mm --max-restarts=3'),
])
def test_one_node_without_port_lets_torchrun_choose_a_free_port(tmp_path, variables, rendezvous):
    """The torchrun arguments of tools/dist_checks.sh's launch: on one node without PORT, --standalone (a free
    port, so that two jobs on one machine both start); with several nodes or PORT, the nodes' meeting point."""
    echo_python = executable(tmp_path / 'python', '#!/bin/sh\necho "$@"\n')
    result = subprocess.run(['bash', '-c', f'source "{ROOT}/tools/dist_checks.sh" && launch 2 train.py CONFIG'],
                            env=launcher_env(tmp_path, PYTHON=echo_python, **variables), capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ['-m', 'torch.distributed.run', '--nproc_per_node=2', *rendezvous.split(),
                                     'train.py', 'CONFIG']


@pytest.mark.parametrize('first_status, starts', [(1, 2), (2, 1)])
def test_slurm_train_restarts_a_failed_step_from_the_latest_checkpoint(tmp_path, first_status, starts):
    """--max-restarts through slurm: a step that died (exit 1: a killed rank, a lost node) starts again with
    --resume; one that the tool itself refused (exit 2) does not, as no restart fixes a config."""
    srun = f'if [ ! -e {tmp_path}/failed_once ]; then touch {tmp_path}/failed_once; exit {first_status}; fi'
    result = run_tool(['slurm_train.sh', 'gpu', 'job', DET_CONFIG, 'work', '--max-restarts', '3', '--amp'],
                      tmp_path, **fake_slurm(tmp_path, srun))
    assert result.returncode == (0 if starts == 2 else 2), result.stderr[-2000:]
    started = calls(tmp_path, 'srun')
    assert len(started) == starts
    for line in started:
        assert line.startswith('--kill-on-bad-exit=1 -p gpu --job-name=job ')
        assert line.endswith(f'tools/train.py {DET_CONFIG} --work-dir=work --launcher=slurm --amp --resume')
    assert ('restart 1 of 3, resuming from the latest checkpoint' in result.stderr) == (starts == 2)


def test_slurm_batch_resumes_and_requeues_itself_before_the_time_limit(tmp_path):
    """The batch script as sbatch would start it on the job's first node: the step runs train.py --resume in the
    allocation; slurm's signal before the time limit makes the job requeue itself, and the script then waits
    for the step, which slurm ends."""
    srun = f'for i in $(seq 300); do [ -e {tmp_path}/requeued ] && exit 0; sleep 0.1; done; exit 9'
    env = tool_env(**fake_slurm(tmp_path, srun), SLURM_SUBMIT_DIR=ROOT, SLURM_JOB_ID='4242')
    batch = subprocess.Popen(['bash', osp.join(ROOT, 'tools', 'slurm_batch.sh'), DET_CONFIG, 'work'], cwd=tmp_path,
                             env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not calls(tmp_path, 'srun') and time.monotonic() < deadline:
        time.sleep(0.1)
    started, = calls(tmp_path, 'srun')
    assert started == f'--kill-on-bad-exit=1 {sys.executable} -u {ROOT}/tools/train.py {DET_CONFIG} --work-dir=work ' \
                      f'--launcher=slurm --resume'
    batch.send_signal(signal.SIGUSR1)
    _, stderr = batch.communicate(timeout=60)
    assert batch.returncode == 0, stderr
    assert calls(tmp_path, 'scontrol') == ['requeue 4242']
    assert 'job 4242 requeues itself and resumes from the latest checkpoint' in stderr


@pytest.mark.parametrize('version, refused', [('3.8', False), ('3.10', False), ('3.13', False), ('3.7', True),
                                              ('3.14', True)])
def test_setup_checks_the_python_before_downloading_anything(tmp_path, version, refused):
    python = executable(tmp_path / 'python3', f'#!/bin/sh\necho {version}\n')
    result = setup_env_function('check_python "$1" && echo accepted', python)
    if refused:
        assert result.returncode == 2 and result.stdout == ''
        assert result.stderr == (
            f"[setup_env] error: {python} is Python {version}, and the stack sets up with Python 3.8, 3.9, 3.10, "
            f"3.11, 3.12, 3.13 only (mmcv 2.1.0 is built here from source): install Python 3.13 (e.g. 'uv python "
            f"install 3.13' or pyenv) and run again with PYTHON=python3.13\n")
    else:
        assert (result.returncode, result.stdout) == (0, 'accepted\n'), result.stderr


@pytest.mark.parametrize('version, torch', [('3.8', 'torch==2.4.1'), ('3.9', 'torch==2.8.0'), ('3.10', 'torch==2.13.0'),
                                            ('3.13', 'torch==2.13.0')])
def test_setup_installs_the_newest_torch_the_python_has_wheels_for(version, torch):
    result = setup_env_function('default_torch_spec "$1"', version)
    assert (result.returncode, result.stdout) == (0, f'{torch}\n'), result.stderr


def fake_toolkit(root, release: str, headers=('cuda_runtime.h', 'cublas_v2.h', 'cusparse.h'), runtime=()):
    """A CUDA toolkit folder whose nvcc reports ``release``, with the given headers and lib/ files."""
    executable(root / 'bin' / 'nvcc', f'#!/bin/sh\necho "Cuda compilation tools, release {release}, V{release}.1"\n')
    (root / 'include').mkdir()
    for header in headers:
        (root / 'include' / header).write_text('')
    (root / 'lib').mkdir()
    for name in runtime:
        (root / 'lib' / name).write_text('')
    return str(root)


def test_a_cuda_toolkit_is_complete_with_nvcc_of_torchs_major_and_the_headers_mmcv_includes(tmp_path):
    gaps = lambda home, cuda: setup_env_function('toolkit_gaps "$1" "$2"', home, cuda).stdout.strip()  # noqa: E731
    assert gaps(fake_toolkit(tmp_path / 'complete', '13.0'), '13.0') == ''
    assert gaps(str(tmp_path / 'complete'), '13.2') == ''  # minor versions may differ, as torch allows
    assert gaps(str(tmp_path / 'complete'), '12.8') == 'nvcc is CUDA 13.0'
    # the nvcc of some distributions comes without the math libraries' headers
    assert gaps(fake_toolkit(tmp_path / 'no_cusparse', '13.0', headers=('cuda_runtime.h', 'cublas_v2.h')),
                '13.0') == 'no include/cusparse.h'
    assert gaps(str(tmp_path / 'nothing'), '13.0') == 'no bin/nvcc'


def test_the_link_gets_an_unversioned_cudart_where_the_toolkit_has_only_the_versioned_one(tmp_path):
    pypi = fake_toolkit(tmp_path / 'pypi', '13.0', runtime=('libcudart.so.13', 'libcudart_static.a'))
    links = setup_env_function('unversioned_cudart "$1"', pypi).stdout.strip()
    assert os.readlink(osp.join(links, 'libcudart.so')) == osp.join(pypi, 'lib', 'libcudart.so.13')
    full = fake_toolkit(tmp_path / 'full', '13.0', runtime=('libcudart.so', 'libcudart.so.13'))
    assert setup_env_function('unversioned_cudart "$1"', full).stdout == ''


def test_torch_build_facts_read_the_cxx_standard_and_toolkit_from_torch_itself():
    """This torch's facts: a CPU build's ops are CPU ops, and the C++ standard is the one its headers ask for."""
    result = setup_env_function('PY="$1" && torch_build_facts', sys.executable)
    assert result.returncode == 0, result.stderr
    version, cuda, archs, py_tag, _, standard, toolkit = result.stdout.split()
    assert version == torch.__version__ and py_tag == f'cp{sys.version_info.major}{sys.version_info.minor}'
    headers = osp.join(osp.dirname(torch.__file__), 'include', 'ATen', 'ATen.h')
    assert standard == ('20' if 'C++20 or later' in open(headers).read() else '17')
    if torch.version.cuda is None:
        assert (cuda, archs, toolkit) == ('cpu', 'none', 'none')
