"""The offline bundle (tools/make_bundle.py, its install.sh) and the check run from it (benchmarks/gpu_check.py).

The end-to-end test makes a bundle for Python 3.11 from PyPI, installs it with the network off into a fresh
virtual environment that has torch, and runs the check's quick mode from it."""
import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

from mala_tools.bundle import bundle_packages, installed_closure, make_bundle, marker_environment, python_tag
from mala_tools.errors import ToolError
from tests.helpers import ROOT

INSTALL_SH = os.path.join(ROOT, 'tools', 'bundle_install.sh')
# every phase of the quick check but the compiled backbone's, which test_compile.py checks with this torch; the
# kernels launched are counted on CUDA only
PHASES = ('install', 'fidelity', 'attention', 'backbone', 'launches', 'dense')
CUDA_ONLY_PHASES = ('launches',)
# the suite's bounds on the release fixture (tests/unit/models/test_backbone.py, BACKBONE of
# tests/unit/models/test_mixed_precision.py)
FP32_MAX_ABS_ERROR = 1e-4
RELATIVE_BOUNDS = {'bf16 autocast': 12 * torch.finfo(torch.bfloat16).eps,
                   'fp16 autocast': 12 * torch.finfo(torch.float16).eps}
THIS_PYTHON = '%d.%d' % sys.version_info[:2]


@pytest.mark.parametrize('python', ['3', '3.12.1', 'cp312', '312'])
def test_the_python_version_is_major_dot_minor(python):
    with pytest.raises(ToolError, match='major.minor'):
        python_tag(python)


def test_the_bundle_holds_the_stack_less_what_torch_brings():
    packages = bundle_packages(THIS_PYTHON)['bundled']
    assert {'mmengine', 'mmdet', 'mmsegmentation', 'opencv-python', 'scipy', 'ninja', 'wheel'} <= set(packages)
    assert packages['mmengine'] == '0.10.7' and packages['mmdet'] == '3.3.0'
    assert int(packages['setuptools'].split('.')[0]) < 82   # named by the roots, though torch depends on it too
    assert not {'torch', 'sympy', 'filelock', 'jinja2', 'networkx', 'mmcv', 'mala-mm'} & set(packages)


def test_left_out_packages_are_recorded_with_their_tested_version():
    packages = bundle_packages(THIS_PYTHON, ['numpy', 'OpenCV_Python'])
    assert set(packages['left_out']) == {'numpy', 'opencv-python'}
    assert not {'numpy', 'opencv-python'} & set(packages['bundled'])


def test_leaving_out_a_package_the_bundle_does_not_hold_is_refused():
    with pytest.raises(ToolError, match='--leave-out sympy: not among the packages'):
        bundle_packages(THIS_PYTHON, ['sympy'])


def test_a_dependency_missing_from_the_pinning_environment_is_named():
    with pytest.raises(ToolError, match='no-such-package-here'):
        installed_closure(['no-such-package-here==1.0'], marker_environment(THIS_PYTHON))


def test_the_bundle_goes_into_an_empty_folder(tmp_path):
    (tmp_path / 'something').write_text('')
    with pytest.raises(ToolError, match='is not empty'):
        make_bundle(str(tmp_path), THIS_PYTHON)


@pytest.mark.parametrize('name, message', [
    ('mmcv-2.1.0-cp311-cp311-linux_x86_64.whl', 'not an mmcv 2.1.0 wheel for Python 3.12'),
    ('mmcv-2.2.0-cp312-cp312-linux_x86_64.whl', 'not an mmcv 2.1.0 wheel for Python 3.12'),
    ('mmcv-2.1.0.tar.gz', 'not an mmcv 2.1.0 wheel for Python 3.12')])
def test_a_prebuilt_mmcv_must_fit_the_bundles_python(tmp_path, name, message):
    (tmp_path / name).write_text('')
    with pytest.raises(ToolError, match=message):
        make_bundle(str(tmp_path / 'bundle'), '3.12', mmcv_wheel=str(tmp_path / name))
    with pytest.raises(ToolError, match='no such file'):
        make_bundle(str(tmp_path / 'bundle'), '3.12',
                    mmcv_wheel=str(tmp_path / 'mmcv-2.1.0-cp312-cp312-linux_x86_64.whl'))


def fake_bundle(folder, python=THIS_PYTHON, left_out=()):
    """A bundle folder with install.sh, setup_env.sh and a manifest, and no wheels: enough for the checks made
    before anything is installed."""
    os.makedirs(folder / 'source' / 'tools')
    shutil.copy(INSTALL_SH, folder / 'install.sh')
    shutil.copy(os.path.join(ROOT, 'tools', 'setup_env.sh'), folder / 'source' / 'tools')
    (folder / 'bundle.json').write_text(json.dumps(dict(python=python, roots=[], bundled={},
                                                        left_out={name: '1.0' for name in left_out})))
    return folder


def run_install(bundle, *args):
    return subprocess.run(['bash', str(bundle / 'install.sh'), *args], capture_output=True, text=True, timeout=120)


def test_install_stops_naming_the_left_out_packages_the_python_lacks(tmp_path):
    bundle = fake_bundle(tmp_path / 'b', left_out=['numpy', 'no-such-package-here'])
    result = run_install(bundle, '--python', sys.executable)
    assert result.returncode == 2
    assert 'the bundle was made without no-such-package-here (--leave-out)' in result.stderr
    assert 'tested: no-such-package-here 1.0' in result.stderr and 'numpy' not in result.stderr


def test_any_build_of_opencv_stands_in_for_a_left_out_one(tmp_path):
    # a GPU container's opencv-python-headless for a bundle made --leave-out opencv-python: this environment has
    # opencv-python, and the bundle left out another build of OpenCV
    bundle = fake_bundle(tmp_path / 'b', left_out=['opencv-contrib-python-headless'])
    result = run_install(bundle, '--python', sys.executable, '--target', str(tmp_path / 'site'))
    assert '[install] opencv-python provides cv2 in place of opencv-contrib-python-headless' in result.stderr
    assert 'the bundle was made without' not in result.stderr


def test_install_stops_on_another_python_version(tmp_path):
    result = run_install(fake_bundle(tmp_path / 'b', python='3.99'), '--python', sys.executable)
    assert result.returncode == 2
    assert f'the bundle is for Python 3.99, {sys.executable} is Python {THIS_PYTHON}' in result.stderr


@pytest.mark.parametrize('args, message', [(['--bogus'], "unknown argument '--bogus'"),
                                           (['--target'], '--target needs a value'),
                                           (['--python', 'no-such-python'], '--python no-such-python: no such')])
def test_install_argument_errors(tmp_path, args, message):
    result = run_install(fake_bundle(tmp_path / 'b'), *args)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def prebuilt_mmcv_dir():
    """MMCV_WHEEL_DIR, else the folder of the mmcv wheel this environment was set up with (tools/setup_env.sh
    names it in .mala_mm_mmcv_source): the install then takes that wheel instead of a 15-30 minute build."""
    if os.environ.get('MMCV_WHEEL_DIR'):
        return os.environ['MMCV_WHEEL_DIR']
    with open(os.path.join(sys.prefix, '.mala_mm_mmcv_source')) as f:
        return os.path.dirname(f.read().split()[-1])


def torch_freeze(python):
    freeze = subprocess.run([python, '-m', 'pip', 'freeze'], capture_output=True, text=True, check=True).stdout
    return [line for line in freeze.splitlines() if line.lower().startswith('torch')]


def offline(command):
    """``command`` with the network off (a new network namespace) where unshare can make one; else as it is,
    where install.sh's PIP_NO_INDEX alone keeps pip off the network."""
    probe = shutil.which('unshare') and subprocess.run(['unshare', '--net', 'true'], capture_output=True)
    return ['unshare', '--net', *command] if probe and probe.returncode == 0 else command


@pytest.mark.slow
def test_bundle_installs_offline_into_a_fresh_torch_environment_and_the_quick_check_runs(tmp_path):
    """Python 3.11: the bundle from PyPI; a new venv with torch from the same source as this environment's; the
    install with no network and mmcv's prebuilt wheel, then gpu_check.py --quick through install.sh --check,
    without its compile phase (79 s of the quick check's 142 here; inductor with this torch is test_compile.py's).
    torch is the same before and after; every phase wrote its table, all numbers finite, the fixture within
    bounds."""
    bundle, venv, results = tmp_path / 'bundle', tmp_path / 'venv', tmp_path / 'results'
    # the bundle carries the prebuilt mmcv this environment was set up with, as a GPU node's CUDA build would be
    prebuilt, = [os.path.join(prebuilt_mmcv_dir(), name) for name in os.listdir(prebuilt_mmcv_dir())
                 if name.startswith('mmcv-2.1.0-cp311-')]
    made = subprocess.run([sys.executable, os.path.join(ROOT, 'tools', 'make_bundle.py'), '--python', '3.11',
                           '--out', str(bundle), '--mmcv-wheel', prebuilt], capture_output=True, text=True,
                          timeout=600)
    assert made.returncode == 0, made.stderr
    subprocess.run([shutil.which('python3.11'), '-m', 'venv', str(venv)], check=True, timeout=120)
    python = str(venv / 'bin' / 'python')
    subprocess.run([python, '-m', 'pip', 'install', '-q', f'torch=={torch.__version__.split("+")[0]}'], check=True,
                   timeout=600)
    torch_before = torch_freeze(python)
    env = {key: value for key, value in os.environ.items() if not key.startswith('PIP_')}
    env = {key: value for key, value in env.items() if key != 'MMCV_WHEEL_DIR'}
    env.update(PIP_CONFIG_FILE=os.devnull, CUDA_VISIBLE_DEVICES='')
    installed = subprocess.run(offline(['bash', str(bundle / 'install.sh'), '--python', python, '--check',
                                        '--quick', '--skip', 'compile', '--out', str(results)]),
                               env=env, capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    assert torch_freeze(python) == torch_before == [f'torch=={torch.__version__}']

    summary = json.loads((results / 'summary.json').read_text())['rows']
    assert [row['phase'] for row in summary[1:]] == list(PHASES)
    for phase in CUDA_ONLY_PHASES:
        assert json.loads((results / f'{phase}.json').read_text())['rows'] == [
            dict(note='not measured: CUDA kernels only')]
    for phase in (phase for phase in PHASES if phase not in CUDA_ONLY_PHASES):
        rows = json.loads((results / f'{phase}.json').read_text())['rows']
        assert rows and (results / f'{phase}.md').is_file()
        numbers = [value for row in rows for value in row.values()
                   if isinstance(value, (int, float)) and not isinstance(value, bool)]
        assert numbers and all(math.isfinite(value) for value in numbers), (phase, rows)
    record = json.loads((results / 'install.json').read_text())['rows'][0]
    assert record['mmcv'] == f'wheel directory {bundle}/mmcv/{os.path.basename(prebuilt)}'
    assert record['torch'] == torch.__version__
    for row in json.loads((results / 'fidelity.json').read_text())['rows']:
        if row['precision'] in ('fp32', 'tf32'):  # TF32 is CUDA's: on CPU it is fp32
            assert row['max_abs_error'] < FP32_MAX_ABS_ERROR, row
        else:
            assert row['relative_error'] < RELATIVE_BOUNDS[row['precision']], row
    dense = json.loads((results / 'dense.json').read_text())['rows']
    # --quick trains our two configs, without Swin-T's beside them
    assert [row['model'] for row in dense] == ['Mask R-CNN MALA-T', 'UperNet MALA-T']
    assert [row['first step skipped'] for row in dense] == [False, False]
    assert all(row['optim wrapper'].startswith('OptimWrapper (') for row in dense)
