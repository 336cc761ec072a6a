"""The repository's files read without git (mala_tools.source_tree): the repository's .gitignore leaves out what a
checkout gathers, and the patterns are read as git reads them."""
import os
import shutil
import subprocess

import pytest

from mala_tools.source_tree import source_files
from tests.helpers import ROOT, git_env

# what a working checkout gathers beside its files: the environment, caches, builds, runs, datasets, weights
CHECKOUT_LEFTOVERS = ('.venv/bin/python', '.venv/lib/site.py', 'mala_mm/__pycache__/mala.cpython-311.pyc',
                      'mala_mm.egg-info/PKG-INFO', 'tools/mala_mm_tools.egg-info/PKG-INFO', '.pytest_cache/README.md',
                      'work_dirs/run/epoch_1.pth', 'work_dirs/run/config.py', 'data/builtin/images/a.png',
                      'checkpoints/mala_t_in1k.pth', 'onnxruntime_profile_2025.json', '.git/HEAD', '.git/hooks/a.sh')
SOURCES = ('setup.py', 'mala_mm/__init__.py', 'tools/run_tests.sh', 'tests/data/official_det_ckpt.pth',
           'tests/data/official_layout/keys.pth', 'configs/data/coco.py', 'docs/work_dirs.md')

# gitignore(5)'s forms: anchored and not, folders only, negation (which cannot bring back a file of an ignored
# folder), '**', character classes, a nested .gitignore
PATTERNS = '# a comment\n\n*.log\n!keep.log\n/top_only.txt\nbuild/\n!build/out.o\ndocs/**/draft_*.md\n' \
           'cache_[0-9].bin\na/**/deep.txt\n[!x]y.tmp\nlogs/\n!logs/\n'
NESTED_PATTERNS = '*.txt\n!notes.txt\n/local.md\n'
TREE = ('run.log', 'keep.log', 'sub/run.log', 'sub/keep.log', 'top_only.txt', 'sub/top_only.txt', 'build/out.o',
        'sub/build/out.o', 'build.py', 'docs/draft_a.md', 'docs/x/draft_b.md', 'docs/x/y/draft_c.md', 'docs/final.md',
        'cache_1.bin', 'cache_a.bin', 'a/deep.txt', 'a/b/c/deep.txt', 'b/deep.txt', 'ay.tmp', 'xy.tmp',
        'logs/today.log', 'logs/today.txt', 'pkg/a.txt', 'pkg/notes.txt', 'pkg/local.md', 'pkg/sub/local.md',
        'pkg/sub/b.txt')
LEFT = ['b/deep.txt', 'build.py', 'docs/final.md', 'keep.log', 'logs/today.txt', 'pkg/notes.txt', 'pkg/sub/local.md',
        'sub/keep.log', 'sub/top_only.txt', 'xy.tmp', 'cache_a.bin']


def make_tree(root, files, gitignores):
    for path in files:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(path)
    for folder, text in gitignores.items():
        (root / folder / '.gitignore').write_text(text)


def test_the_repositorys_gitignore_leaves_out_what_a_checkout_gathers(tmp_path):
    make_tree(tmp_path, CHECKOUT_LEFTOVERS + SOURCES, {})
    shutil.copy(os.path.join(ROOT, '.gitignore'), tmp_path / '.gitignore')
    assert source_files(str(tmp_path)) == sorted(SOURCES + ('.gitignore',))


def test_patterns_are_read_as_git_reads_them(tmp_path):
    make_tree(tmp_path, TREE, {'.': PATTERNS, 'pkg': NESTED_PATTERNS})
    assert source_files(str(tmp_path)) == sorted(LEFT + ['.gitignore', 'pkg/.gitignore'])


@pytest.mark.skipif(shutil.which('git') is None, reason='git is not installed')
def test_git_lists_the_same_files(tmp_path):
    """git's own answer for the same tree, with no configuration of this machine's that could add patterns."""
    make_tree(tmp_path, TREE, {'.': PATTERNS, 'pkg': NESTED_PATTERNS})
    env = git_env(tmp_path)
    subprocess.run(['git', 'init', '-q', str(tmp_path)], env=env, check=True)
    listed = subprocess.run(['git', 'ls-files', '--others', '--exclude-standard'], cwd=tmp_path, env=env,
                            capture_output=True, text=True, check=True).stdout.split('\n')
    assert sorted(filter(None, listed)) == source_files(str(tmp_path))
