"""The repository as a place to work: docs/dev/layout.md names every module and script there is and no other, and
CI's script runs on any machine.

The files are read from the file system (mala_tools.source_tree: what the .gitignore leaves), not from git, so
that this holds in a shallow clone and a source archive as in a full clone. The commit messages' rule, which
needs the history, is checked by tools/check_commits.py (.ci/run; docs/dev/commits.md)."""
import os
import re

from mala_tools.source_tree import source_files
from tests.helpers import ROOT

LAYOUT = os.path.join(ROOT, 'docs', 'dev', 'layout.md')
# the folders whose every module and script the layout names: its unit of description
DESCRIBED = ('mala_mm/', 'tools/', 'benchmarks/', 'tests/helpers/', 'tests/conftest.py')
# an entry's name starts within this column; a line indented further continues the description above it
DESCRIPTION_COLUMN = 34


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
    present = {path for path in source_files(ROOT) if path.startswith(DESCRIBED) and path.endswith(('.py', '.sh'))
               and not path.endswith('__init__.py')}
    assert present, f'no module found under {ROOT}'
    missing = sorted(present - {path for path in named if not path.endswith('/')})
    assert not missing, f'docs/dev/layout.md does not name {missing}'
    stale = [path for path in named if not os.path.exists(os.path.join(ROOT, path))]
    assert not stale, f'docs/dev/layout.md names what is not there: {stale}'


def test_ci_names_no_path_of_a_machine():
    """.ci/run's paths are the repository's, relative to it, or come from the environment (MMCV_WHEEL_DIR)."""
    with open(os.path.join(ROOT, '.ci', 'run')) as f:
        code = [line for line in f.read().splitlines() if not line.lstrip().startswith('#')]
    absolute = [line for line in code if re.search(r'(?<![\w.}])/(?!dev/null\b)\w', line)]
    assert code and not absolute, absolute
