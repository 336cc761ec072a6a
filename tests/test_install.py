"""Installing this package into an environment that already has the stack changes nothing else in it."""
import json
import subprocess
import sys

from conftest import ROOT


def test_pip_install_into_a_ready_environment_installs_this_package_alone(tmp_path):
    """``pip install -e .`` where torch, mmcv, mmengine, mmdet and mmseg are installed (this interpreter's
    environment): pip's plan, resolved from what is installed with no index (a requirement that they do not meet
    fails the resolution), installs mala_mm and nothing else: no torch, setuptools or mmcv is replaced."""
    report = tmp_path / 'report.json'
    result = subprocess.run(
        [sys.executable, '-m', 'pip', 'install', '--dry-run', '--no-index', '--no-build-isolation', '--quiet',
         '--report', str(report), '-e', ROOT],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    planned = [item['metadata']['name'] for item in json.loads(report.read_text())['install']]
    assert planned == ['mala_mm'], planned
