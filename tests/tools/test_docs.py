"""The user pages name only what a user has: no path of a development environment or a scratch folder, shell lines
that work in zsh as in bash, and links to files that exist; the README stays short enough to read."""
import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

PAGES = sorted([Path(ROOT, 'README.md'), *Path(ROOT, 'docs').glob('**/*.md')])
# a sibling checkout's shared folder, scratch and home folders, a development machine's work tree
FOREIGN_PATH = re.compile(r'(?<![\w.])(\.\./shared/|/tmp/|/work/|/root/|/home/\w+)')
# pip's extras unquoted: zsh expands the brackets as a glob and stops with "no matches found"
UNQUOTED_EXTRAS = re.compile(r'pip install[^\n`]*\s(-e\s+)?[\w./-]*\[[\w,]+\](?!\')')
# a Markdown link's target within the repository: not a URL, without its #anchor
LOCAL_LINK = re.compile(r'\]\((?!https?://|mailto:|#)([^)#\s]+)')
# the README is for users; what does not fit belongs in docs/
README_BYTES = 16000


@pytest.mark.parametrize('page', PAGES, ids=lambda page: page.name)
def test_a_page_names_no_path_of_a_development_machine(page):
    found = [(number, line) for number, line in enumerate(page.read_text().splitlines(), 1)
             if FOREIGN_PATH.search(line)]
    assert not found, found


@pytest.mark.parametrize('page', PAGES, ids=lambda page: page.name)
def test_pip_extras_are_quoted(page):
    assert not UNQUOTED_EXTRAS.findall(page.read_text())


@pytest.mark.parametrize('page', PAGES, ids=lambda page: page.name)
def test_a_pages_links_lead_to_files_of_the_repository(page):
    missing = [target for target in LOCAL_LINK.findall(page.read_text()) if not (page.parent / target).exists()]
    assert not missing, missing


def test_the_readme_stays_short():
    assert Path(ROOT, 'README.md').stat().st_size < README_BYTES


def test_the_checks_find_what_they_look_for():
    assert FOREIGN_PATH.search('python tools/verify_checkpoint.py ../shared/fixtures/official_det_ckpt.pth')
    assert FOREIGN_PATH.search('--config /tmp/mask_rcnn_mala_narrow.py')
    assert not FOREIGN_PATH.search('work_dirs/mask_rcnn_mala_s/epoch_12.pth and tests/data/official_det_ckpt.pth')
    assert UNQUOTED_EXTRAS.search('pip install -e .[deploy]')
    assert not UNQUOTED_EXTRAS.search("pip install -e '.[deploy]'")
    assert LOCAL_LINK.findall('[a](docs/cluster.md#2-the-weights) [b](https://x.org/a.md) [c](#here)') == [
        'docs/cluster.md']
