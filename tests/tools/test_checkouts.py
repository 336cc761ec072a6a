"""The tests that read the repository as a whole pass in the other forms a checkout takes: a source archive
without .git (``git archive``), and a shallow clone (``git clone --depth 1``), each in a path with a space.

Each copy holds this working tree's files (mala_tools.source_tree: what the .gitignore leaves, uncommitted
changes included, so that what is tested is the tree at hand); the shallow clone has a one-commit history of
HEAD under them. The tests run there in a new interpreter, with the copy's own tests, package and tools first
on its path."""
import os
import shutil
import subprocess
import sys

import pytest

from mala_tools.source_tree import copy_source_files
from tests.helpers import ROOT, git_env

# the tests whose subject is the repository's files: its layout against the tree, its pages
REPOSITORY_TESTS = ('tests/tools/test_repository.py', 'tests/tools/test_docs.py')


def archive(folder) -> None:
    copy_source_files(ROOT, str(folder))


def shallow_clone(folder) -> None:
    if shutil.which('git') is None or not os.path.exists(os.path.join(ROOT, '.git')):
        pytest.skip(f'{ROOT} is not a git checkout: there is nothing to clone')
    subprocess.run(['git', 'clone', '--quiet', '--depth', '1', '--no-checkout', f'file://{ROOT}', str(folder)],
                   env=git_env(folder.parent), check=True, timeout=120)
    copy_source_files(ROOT, str(folder))


@pytest.mark.parametrize('make', [archive, shallow_clone], ids=['archive', 'shallow clone'])
def test_the_repository_tests_pass_in_a_copy_in_a_path_with_a_space(tmp_path, make):
    copy = tmp_path / 'a folder with spaces' / 'mala_mm'
    copy.parent.mkdir()
    make(copy)
    assert os.path.isdir(copy / '.git') == (make is shallow_clone)
    env = {key: value for key, value in os.environ.items() if key != 'PYTEST_ADDOPTS'}
    env['PYTHONPATH'] = os.pathsep.join([str(copy), str(copy / 'tools')])
    result = subprocess.run([sys.executable, '-m', 'pytest', '-p', 'no:cacheprovider', *REPOSITORY_TESTS],
                            cwd=copy, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f'rootdir: {copy}' in result.stdout and ' passed' in result.stdout
