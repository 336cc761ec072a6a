"""Installing this package into an environment that already has the stack changes nothing else in it, and the
package, its distributions and its citation carry one version."""
import json
import os
import re
import subprocess
import sys

import mala_mm
from tests.helpers import ROOT


def _planned(report, *editables) -> list:
    """The distributions pip would install for ``pip install -e E ...`` in this interpreter's environment, resolved
    from what is installed with no index (a requirement that it does not meet fails the resolution), as (name,
    version); pip's report goes to the file ``report``."""
    command = [sys.executable, '-m', 'pip', 'install', '--dry-run', '--no-index', '--no-build-isolation', '--quiet',
               '--report', str(report)]
    for editable in editables:
        command += ['-e', editable]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    with open(report) as f:
        # names as setuptools writes them (mala-mm before setuptools 69), normalized as pip compares them
        return [(re.sub(r'[-_.]+', '_', item['metadata']['name']).lower(), item['metadata']['version'])
                for item in json.load(f)['install']]


def test_pip_install_into_a_ready_environment_installs_this_package_alone(tmp_path):
    """``pip install -e .`` where torch, mmcv, mmengine, mmdet and mmseg are installed (this interpreter's
    environment) installs mala_mm and nothing else: no torch, setuptools or mmcv is replaced. ``-e tools`` adds the
    tools' distribution (tools/setup.py), and nothing else either. Both setup files give the package's version
    (mala_mm/version.py)."""
    version = mala_mm.__version__
    assert _planned(tmp_path / 'plugin.json', ROOT) == [('mala_mm', version)]
    assert _planned(tmp_path / 'with_tools.json', ROOT, os.path.join(ROOT, 'tools')) == [
        ('mala_mm', version), ('mala_mm_tools', version)]


def test_the_citation_names_the_package_version():
    with open(os.path.join(ROOT, 'CITATION.cff'), encoding='utf-8') as f:
        assert re.findall(r'^version: (\S+)$', f.read(), re.M) == [mala_mm.__version__]
