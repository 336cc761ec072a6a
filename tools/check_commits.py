"""Check commit messages against docs/dev/commits.md: a subject of at most 72 characters, then a blank line before
any body.

Without arguments, every commit after the last one whose subject is longer (a994b86, the convention's start) up
to HEAD, as CI checks them (.ci/run); with --message, one message, as git's commit-msg hook passes it. Needs git
and the standard library alone (no environment to set up). Exits 0 when every message follows the rule, 2 with
an ``error:`` line per commit that does not, and 2 with the reason where the history to check is not here: a
source archive has no history at all, and a shallow clone's stops before a994b86, so that the commits between
could not be checked; that is said, rather than passed as if they had been (``git fetch --unshallow``).

Examples:
    python3 tools/check_commits.py                                # the history since a994b86
    python3 tools/check_commits.py --since origin/main            # the commits not yet pushed
    python3 tools/check_commits.py --message .git/COMMIT_EDITMSG  # one message (the commit-msg hook)
"""
import argparse
import os
import subprocess
import sys
from typing import List

from mala_tools.errors import ERROR_STATUS, print_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the last commit whose subject is longer than the convention allows; every later one follows it
LAST_LONG_SUBJECT = 'a994b86'
SUBJECT_LIMIT = 72


def message_problems(message: str) -> List[str]:
    """What breaks the rule in one commit message (no comment lines, as git stores it)."""
    lines = message.strip('\n').split('\n')
    problems = []
    if len(lines[0]) > SUBJECT_LIMIT:
        problems.append(f'a subject of {len(lines[0])} characters (at most {SUBJECT_LIMIT})')
    if len(lines) > 1 and lines[1].strip():
        problems.append('no blank line after the subject')
    return problems


def git(*args: str, stdin: str = None) -> subprocess.CompletedProcess:
    return subprocess.run(['git', '-C', ROOT, *args], input=stdin, capture_output=True, text=True)


def history_problems(since: str) -> List[str]:
    """The problems of each commit after ``since`` up to HEAD, each prefixed by its abbreviated hash; or the reason
    why that history is not here to check."""
    top = git('rev-parse', '--show-toplevel')  # not that of a checkout that the folder merely sits in
    if top.returncode or os.path.realpath(top.stdout.strip()) != os.path.realpath(ROOT):
        return [f'{ROOT} is not a git checkout (a source archive?): the commit messages are in the history of a '
                'clone; run this there']
    if git('merge-base', '--is-ancestor', since, 'HEAD').returncode:
        if git('rev-parse', '--is-shallow-repository').stdout.strip() == 'true':
            return [f'this clone is shallow and its history stops before {since}, so the commits after it cannot be '
                    'checked: git fetch --unshallow, then run this again']
        return [f'{since} is not in the history of HEAD: nothing to check the commits after']
    log = git('log', '--format=%h%x00%B%x01', f'{since}..HEAD')
    if log.returncode:
        return [f'git log: {log.stderr.strip()}']
    problems = []
    for entry in filter(str.strip, log.stdout.split('\x01')):
        commit, message = entry.strip('\n').split('\x00')
        problems += [f'{commit}: {problem}' for problem in message_problems(message)]
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--since', default=LAST_LONG_SUBJECT, metavar='REV',
                        help=f'check the commits after REV up to HEAD (default {LAST_LONG_SUBJECT})')
    parser.add_argument('--message', metavar='FILE', help='check the one message in FILE instead of the history')
    args = parser.parse_args()
    if args.message:
        with open(args.message, encoding='utf-8') as f:
            # as git will store it: without the comment lines of an editor session
            cleaned = git('stripspace', '--strip-comments', stdin=f.read()).stdout
        problems = message_problems(cleaned)
    else:
        problems = history_problems(args.since)
    for problem in problems:
        print_error(problem)
    return ERROR_STATUS if problems else 0


if __name__ == '__main__':
    sys.exit(main())
