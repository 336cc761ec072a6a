"""An offline bundle: everything beyond torch that the stack needs on a machine without a package index.

The bundle is one folder, made where PyPI is reachable, for one Python version and platform::

    BUNDLE/install.sh       installs it with no network (tools/bundle_install.sh)
    BUNDLE/bundle.json      the manifest: Python, platforms, the packages bundled and those left out
    BUNDLE/wheels/          binary wheels of mmengine, mmdet, mmsegmentation and their dependencies, pinned to the
                            versions of the environment the bundle is made from (the tested .venv), mmcv's sdist
                            (it has no wheels: it is built on the node against the node's torch), and the wheels of
                            mala_mm and of its tools' mala_tools (tools/setup.py)
    BUNDLE/source/          this repository's files (less what .gitignore names: mala_tools/source_tree.py):
                            configs, benchmarks (gpu_check.py), the test fixture, and tools/setup_env.sh, whose
                            functions build mmcv
    BUNDLE/mmcv/            with ``mmcv_wheel``: a prebuilt mmcv wheel for the node's torch and Python (a CUDA
                            build made without a GPU by tools/setup_env.sh), which the install takes instead of
                            building mmcv, where it works there

Packages that torch brings itself (filelock, sympy, jinja2, ...) are not bundled: the node's torch environment has
them. Packages named in ``leave_out`` (e.g. numpy, scipy, opencv-python, which a torch environment often has) are
not bundled either; the install stops, naming them, where the node lacks them.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from typing import Dict, Iterable, List, Sequence

from packaging.markers import default_environment
from packaging.requirements import Requirement

from .errors import ToolError
from .source_tree import copy_source_files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# what the stack needs beyond torch and mmcv (setup.py's install_requires), with the build tools of mmcv's build
ROOTS = ('mmengine==0.10.7', 'mmdet==3.3.0', 'mmsegmentation==1.2.2', 'ftfy', 'regex', 'setuptools<82', 'wheel',
         'ninja')
MMCV_VERSION = '2.1.0'
# glibc 2.28 and older (pip's --platform takes each tag literally): the tested numpy, scipy and pillow have
# manylinux_2_28 wheels only, and torch's own wheels need glibc 2.28 anyway
DEFAULT_PLATFORMS = ('manylinux2014_x86_64', *(f'manylinux_2_{minor}_x86_64' for minor in range(17, 29)))
# the pip settings of this machine (extra indexes, find-links, constraints) are not the user's view of PyPI
_MACHINE_PIP_SETTINGS = ('PIP_FIND_LINKS', 'PIP_INDEX_URL', 'PIP_EXTRA_INDEX_URL', 'PIP_CONSTRAINT', 'PIP_NO_INDEX',
                         'PIP_CONFIG_FILE')


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503): ``Pillow`` and ``pillow``, ``typing_extensions`` and
    ``typing-extensions`` are one."""
    return re.sub(r'[-_.]+', '-', name).lower()


def python_tag(python: str) -> str:
    """``'3.12'`` -> ``'312'``; a ToolError for anything but a CPython ``major.minor`` version."""
    if not re.fullmatch(r'3\.\d{1,2}', python):
        raise ToolError(f'--python takes a Python version as major.minor (e.g. 3.12), not {python!r}')
    return python.replace('.', '')


def marker_environment(python: str) -> Dict[str, str]:
    """The environment markers of a CPython ``python`` on Linux x86_64, for the dependencies that depend on the
    Python version (``numpy>=2; python_version >= "3.9"``)."""
    env = default_environment()
    env.update(python_version=python, python_full_version=f'{python}.0', implementation_name='cpython',
               platform_python_implementation='CPython', sys_platform='linux', platform_system='Linux',
               os_name='posix', platform_machine='x86_64')
    return env


def installed_closure(requirements: Iterable[str], env: Dict[str, str]) -> Dict[str, str]:
    """``{canonical name: installed version}`` of ``requirements`` and everything they depend on, under the markers
    ``env``, read from the installed distributions of this interpreter's environment (the pins of the bundle).
    Raises ToolError naming what is needed but not installed here, or installed at a version a requirement
    excludes."""
    found: Dict[str, str] = {}
    pending = [Requirement(r) for r in requirements]
    problems: List[str] = []
    while pending:
        requirement = pending.pop()
        name = canonical(requirement.name)
        if name in found:
            continue
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            problems.append(f'{requirement} is not installed')
            continue
        if not requirement.specifier.contains(distribution.version, prereleases=True):
            problems.append(f'{requirement} is needed, {name} {distribution.version} is installed')
        found[name] = distribution.version
        for line in distribution.requires or ():
            dependency = Requirement(line)
            if dependency.marker is None or dependency.marker.evaluate({**env, 'extra': ''}):
                pending.append(dependency)
    if problems:
        raise ToolError(f'the environment of {sys.executable}, whose versions the bundle pins, lacks what the stack '
                        f'needs: {"; ".join(sorted(problems))} (make the bundle from the tested environment, '
                        f'.venv after tools/setup_env.sh)')
    return found


def bundle_packages(python: str, leave_out: Sequence[str] = ()) -> Dict[str, Dict[str, str]]:
    """The packages of a bundle for CPython ``python``: ``{'bundled': {name: version}, 'left_out': {name:
    version}}``. Bundled: ROOTS and mmcv's dependencies with everything they depend on, less what torch depends on
    (a torch environment has it) unless a ROOT names it (setuptools<82), less ``leave_out``. Raises ToolError for
    a ``leave_out`` name that the bundle would not hold anyway."""
    env = marker_environment(python)
    mmcv_dependencies = [str(r) for r in map(Requirement, metadata.requires('mmcv') or ())
                         if r.marker is None or r.marker.evaluate({**env, 'extra': ''})]
    needed = installed_closure([*ROOTS, *mmcv_dependencies], env)
    roots = {canonical(Requirement(r).name) for r in ROOTS}
    with_torch = set(installed_closure(['torch'], env)) - roots
    bundled = {name: version for name, version in sorted(needed.items()) if name not in with_torch}
    unknown = sorted(set(map(canonical, leave_out)) - set(bundled))
    if unknown:
        raise ToolError(f'--leave-out {" ".join(unknown)}: not among the packages the bundle holds '
                        f'({", ".join(bundled)})')
    left_out = {name: bundled.pop(name) for name in map(canonical, leave_out)}
    return dict(bundled=bundled, left_out=left_out)


def pip_environment() -> Dict[str, str]:
    """This process's environment with pip seeing PyPI only, as a user's machine does."""
    env = {k: v for k, v in os.environ.items() if k not in _MACHINE_PIP_SETTINGS}
    env['PIP_CONFIG_FILE'] = os.devnull
    return env


def download_command(pins: Dict[str, str], python: str, platforms: Sequence[str], dest: str) -> List[str]:
    """pip's command that downloads the binary wheels of ``pins`` (``{name: version}``, their dependencies
    already in it) for CPython ``python`` on ``platforms`` into ``dest``."""
    tag = python_tag(python)
    command = [sys.executable, '-m', 'pip', 'download', '--disable-pip-version-check', '--quiet', '--no-deps',
               '--only-binary=:all:', '--python-version', python, '--implementation', 'cp', '--abi', f'cp{tag}',
               '--dest', dest]
    for platform in platforms:
        command += ['--platform', platform]
    return command + [f'{name}=={version}' for name, version in pins.items()]


def _run(command: List[str], what: str, env: Dict[str, str] = None) -> None:
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode:
        raise ToolError(f'{what} failed: {(result.stderr or result.stdout).strip()}')


def folder_mib(folder: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files) / 2**20


def check_mmcv_wheel(path: str, python: str) -> str:
    """``path`` if it is an mmcv MMCV_VERSION wheel for CPython ``python`` on Linux x86_64, else a ToolError."""
    name = os.path.basename(path)
    tag = python_tag(python)
    if not os.path.isfile(path):
        raise ToolError(f'--mmcv-wheel {path}: no such file')
    if not re.fullmatch(rf'mmcv-{re.escape(MMCV_VERSION)}-cp{tag}-cp{tag}-linux_x86_64\.whl', name):
        raise ToolError(f'--mmcv-wheel {path}: not an mmcv {MMCV_VERSION} wheel for Python {python} on Linux '
                        f'x86_64 (mmcv-{MMCV_VERSION}-cp{tag}-cp{tag}-linux_x86_64.whl)')
    return path


def make_bundle(out: str, python: str, platforms: Sequence[str] = DEFAULT_PLATFORMS,
                leave_out: Sequence[str] = (), mmcv_wheel: str = None) -> dict:
    """Make the bundle in the new or empty folder ``out`` (layout in the module's docstring); returns its
    manifest. Needs PyPI (wheels, mmcv's sdist) and this environment's torch (pip runs mala_mm's setup.py)."""
    python_tag(python)
    if mmcv_wheel is not None:
        check_mmcv_wheel(mmcv_wheel, python)
    if os.path.exists(out) and os.listdir(out):
        raise ToolError(f'{out} is not empty; the bundle goes into a new or empty folder')
    packages = bundle_packages(python, leave_out)
    wheels = os.path.join(out, 'wheels')
    os.makedirs(wheels, exist_ok=True)
    env = pip_environment()
    _run(download_command(packages['bundled'], python, platforms, wheels), 'downloading the wheels from PyPI', env)
    # not through pip download, which would run mmcv's setup.py, unpatched (tools/mala_tools/sdist.py)
    _run([sys.executable, os.path.join(os.path.dirname(__file__), 'sdist.py'), 'mmcv', MMCV_VERSION, wheels],
         "downloading mmcv's source from PyPI", env)
    if mmcv_wheel is not None:
        os.makedirs(os.path.join(out, 'mmcv'))
        shutil.copy2(mmcv_wheel, os.path.join(out, 'mmcv'))
    source = os.path.join(out, 'source')
    copy_source_files(ROOT, source)
    for project, name in ((source, 'mala_mm'), (os.path.join(source, 'tools'), 'mala_mm_tools')):
        _run([sys.executable, '-m', 'pip', 'wheel', '--disable-pip-version-check', '--quiet', '--no-deps',
              '--no-build-isolation', '--wheel-dir', wheels, project], f"building {name}'s wheel")
        for leftover in ('build', f'{name}.egg-info'):  # the wheel build's, in the copy
            shutil.rmtree(os.path.join(project, leftover), ignore_errors=True)
    shutil.copy2(os.path.join(ROOT, 'tools', 'bundle_install.sh'), os.path.join(out, 'install.sh'))
    manifest = dict(python=python, platforms=list(platforms), mmcv=MMCV_VERSION, roots=list(ROOTS), **packages,
                    mmcv_wheel=None if mmcv_wheel is None else os.path.basename(mmcv_wheel))
    with open(os.path.join(out, 'bundle.json'), 'w') as f:
        json.dump(manifest, f, indent=1)
    return manifest
