"""Installing this package into an environment that already has the stack changes nothing else in it."""
import json
import os
import subprocess
import sys

from tests.helpers import ROOT


def _planned(report, *editables) -> list:
    """The distributions pip would install for ``pip install -e E ...`` in this interpreter's environment, resolved
    from what is installed with no index (a requirement that it does not meet fails the resolution); pip's report
    goes to the file ``report``."""
    command = [sys.executable, '-m', 'pip', 'install', '--dry-run', '--no-index', '--no-build-isolation', '--quiet',
               '--report', str(report)]
    for editable in editables:
        command += ['-e', editable]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    with open(report) as f:
        return [item['metadata']['name'] for item in json.load(f)['install']]


def test_pip_install_into_a_ready_environment_installs_this_package_alone(tmp_path):
    """``pip install -e .`` where torch, mmcv, mmengine, mmdet and mmseg are installed (this interpreter's
    environment) installs mala_mm and nothing else: no torch, setuptools or mmcv is replaced. ``-e tools`` adds the
    tools' distribution (tools/setup.py), and nothing else either."""
    assert _planned(tmp_path / 'plugin.json', ROOT) == ['mala_mm']
    assert _planned(tmp_path / 'with_tools.json', ROOT, os.path.join(ROOT, 'tools')) == ['mala_mm', 'mala_mm_tools']
