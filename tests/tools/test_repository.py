"""The repository as a place to work: docs/dev/layout.md names every module and script there is and no other,
and commit subjects fit in 72 characters (docs/dev/commits.md)."""
import os
import re
import subprocess

from tests.helpers import ROOT

LAYOUT = os.path.join(ROOT, 'docs', 'dev', 'layout.md')
# the folders whose every module and script the layout names: its unit of description
DESCRIBED = ('mala_mm/', 'tools/', 'benchmarks/', 'tests/helpers/', 'tests/conftest.py')
# an entry's name starts within this column; a line indented further continues the description above it
DESCRIPTION_COLUMN = 34
# the last commit whose subject is longer than the convention allows; every later one follows it
LAST_LONG_SUBJECT = 'a994b86'
SUBJECT_LIMIT = 72


def layout_paths(text: str):
    """The paths the layout's tree names: folders end with '/', each entry indented two spaces per level."""
    tree = re.search(r'```\n(.*?)```', text, re.S).group(1)
    folders, paths = [], []
    for line in tree.splitlines():
        indent = len(line) - len(line.lstrip(' '))
        if not line.strip() or indent >= DESCRIPTION_COLUMN:
            continue
        assert indent % 2 == 0, f'layout.md: odd indentation in {line!r}'
        name = line.split()[0]
        folders = folders[:indent // 2]
        path = ''.join(folders) + name
        paths.append(path)
        if name.endswith('/'):
            folders.append(name)
    return paths


def test_the_layout_names_every_module_and_script_and_nothing_else():
    named = layout_paths(open(LAYOUT).read())
    tracked = subprocess.run(['git', 'ls-files'], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    present = {path for path in tracked.split() if path.startswith(DESCRIBED) and path.endswith(('.py', '.sh'))
               and not path.endswith('__init__.py')}
    assert present, 'git ls-files listed no module'
    missing = sorted(present - {path for path in named if not path.endswith('/')})
    assert not missing, f'docs/dev/layout.md does not name {missing}'
    stale = [path for path in named if not os.path.exists(os.path.join(ROOT, path))]
    assert not stale, f'docs/dev/layout.md names what is not there: {stale}'


def test_commit_subjects_since_the_convention_fit_72_characters():
    """Every commit after the last one with a longer subject: a subject of at most 72 characters, then a blank
    line before any body."""
    log = subprocess.run(['git', 'log', '--format=%h%x00%B%x01', f'{LAST_LONG_SUBJECT}..HEAD'], cwd=ROOT,
                         capture_output=True, text=True)
    assert log.returncode == 0, f'the history since {LAST_LONG_SUBJECT} is needed: {log.stderr}'
    problems = []
    for entry in filter(str.strip, log.stdout.split('\x01')):
        commit, message = entry.strip('\n').split('\x00')
        lines = message.strip('\n').split('\n')
        if len(lines[0]) > SUBJECT_LIMIT:
            problems.append(f'{commit}: a subject of {len(lines[0])} characters')
        if len(lines) > 1 and lines[1].strip():
            problems.append(f'{commit}: no blank line after the subject')
    assert not problems, problems
