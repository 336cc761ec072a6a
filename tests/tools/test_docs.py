"""The user pages name only what a user has: no path of a development environment or a scratch folder, and shell
lines that work in zsh as in bash."""
import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

PAGES = sorted([Path(ROOT, 'README.md'), *Path(ROOT, 'docs').glob('**/*.md')])
# a sibling checkout's shared folder, scratch and home folders, a development machine's work tree
FOREIGN_PATH = re.compile(r'(?<![\w.])(\.\./shared/|/tmp/|/work/|/root/|/home/\w+)')
# pip's extras unquoted: zsh expands the brackets as a glob and stops with "no matches found"
UNQUOTED_EXTRAS = re.compile(r'pip install[^\n`]*\s(-e\s+)?[\w./-]*\[[\w,]+\](?!\')')


@pytest.mark.parametrize('page', PAGES, ids=lambda page: page.name)
def test_a_page_names_no_path_of_a_development_machine(page):
    found = [(number, line) for number, line in enumerate(page.read_text().splitlines(), 1)
             if FOREIGN_PATH.search(line)]
    assert not found, found


@pytest.mark.parametrize('page', PAGES, ids=lambda page: page.name)
def test_pip_extras_are_quoted(page):
    assert not UNQUOTED_EXTRAS.findall(page.read_text())


def test_the_checks_find_what_they_look_for():
    assert FOREIGN_PATH.search('python tools/verify_checkpoint.py ../shared/fixtures/official_det_ckpt.pth')
    assert FOREIGN_PATH.search('--config /tmp/mask_rcnn_mala_narrow.py')
    assert not FOREIGN_PATH.search('work_dirs/mask_rcnn_mala_s/epoch_12.pth and tests/data/official_det_ckpt.pth')
    assert UNQUOTED_EXTRAS.search('pip install -e .[deploy]')
    assert not UNQUOTED_EXTRAS.search("pip install -e '.[deploy]'")
