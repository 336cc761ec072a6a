"""tools/check_commits.py, CI's check of the commit messages (docs/dev/commits.md), on repositories made here: it
names each commit whose subject is too long or lacks the blank line, and says why where the history to check is
not there (a shallow clone, a source archive) rather than passing."""
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT, git_env

pytestmark = pytest.mark.skipif(shutil.which('git') is None, reason='git is not installed')

LONG_SUBJECT = 'x' * 73


def git(repo, *args, home) -> str:
    return subprocess.run(['git', '-C', str(repo), *args], env=git_env(home), capture_output=True, text=True,
                          check=True).stdout.strip()


def repository(folder, home, messages) -> list:
    """A repository at ``folder`` with tools/check_commits.py and what it imports, one commit per message; the
    commits' abbreviated hashes."""
    for path in ('tools/check_commits.py', 'tools/mala_tools/__init__.py', 'tools/mala_tools/errors.py'):
        os.makedirs(folder / os.path.dirname(path), exist_ok=True)
        shutil.copy(os.path.join(ROOT, path), folder / path)
    git(folder.parent, 'init', '-q', folder.name, home=home)
    commits = []
    for number, message in enumerate(messages):
        (folder / 'file.txt').write_text(str(number))
        git(folder, 'add', '.', home=home)
        git(folder, 'commit', '-q', '--cleanup=verbatim', '-m', message, home=home)
        commits.append(git(folder, 'rev-parse', '--short', 'HEAD', home=home))
    return commits


def check(folder, *args, home) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(folder / 'tools' / 'check_commits.py'), *args], env=git_env(home),
                          capture_output=True, text=True)


def test_each_commit_after_the_start_that_breaks_the_rule_is_named(tmp_path):
    repo = tmp_path / 'repo'
    start, _, long, no_blank, _ = repository(repo, tmp_path, [
        LONG_SUBJECT, 'a subject\n\nits body', LONG_SUBJECT, 'a subject\nits body', 'x' * 72])
    result = check(repo, '--since', start, home=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f'error: {no_blank}: no blank line after the subject',
                                          f'error: {long}: a subject of 73 characters (at most 72)']
    assert check(repo, '--since', no_blank, home=tmp_path).returncode == 0


def test_a_shallow_clone_is_not_passed_as_checked(tmp_path):
    repo = tmp_path / 'repo'
    start, *_ = repository(repo, tmp_path, ['first', 'second', 'third'])
    subprocess.run(['git', 'clone', '-q', '--depth', '1', f'file://{repo}', str(tmp_path / 'shallow')],
                   env=git_env(tmp_path), check=True)
    result = check(tmp_path / 'shallow', '--since', start, home=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (f'error: this clone is shallow and its history stops before {start}, so the commits '
                             'after it cannot be checked: git fetch --unshallow, then run this again\n')


def test_a_start_that_is_not_in_the_history_is_named(tmp_path):
    repo = tmp_path / 'repo'
    repository(repo, tmp_path, ['first'])
    result = check(repo, home=tmp_path)  # the default start, a994b86, is this repository's
    assert result.returncode == 2
    assert result.stderr == 'error: a994b86 is not in the history of HEAD: nothing to check the commits after\n'


def test_a_source_archive_has_no_history_to_check(tmp_path):
    """Also where the archive lies inside another checkout, whose history is not its own."""
    repo = tmp_path / 'repo'
    repository(repo, tmp_path, ['first'])
    archive = repo / 'unpacked'
    shutil.copytree(repo / 'tools', archive / 'tools')
    result = check(archive, '--since', 'HEAD', home=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(f'error: {archive} is not a git checkout (a source archive?)')


def test_one_message_as_the_commit_msg_hook_passes_it(tmp_path):
    """The message file of an editor session: git's comment lines do not count as lines of the message."""
    repo = tmp_path / 'repo'
    repository(repo, tmp_path, ['first'])
    message = tmp_path / 'COMMIT_EDITMSG'
    message.write_text('a subject\n# Please enter the commit message for your changes.\n\nits body\n')
    assert check(repo, '--message', str(message), home=tmp_path).returncode == 0
    message.write_text(f'{LONG_SUBJECT}\nits body\n# a comment\n')
    result = check(repo, '--message', str(message), home=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == ['error: a subject of 73 characters (at most 72)',
                                          'error: no blank line after the subject']
