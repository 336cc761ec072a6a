"""The repository's files read from the file system: those its ``.gitignore`` files leave, as git would list them.

A source archive (``git archive``) or a copy has no ``.git`` to ask, and a shallow clone has no history; the
layout test, the offline bundle's copy of the source and the copies that tests/tools/test_checkouts.py makes read
the tree here instead, so that they see the same files in a full clone, a shallow one and an archive. What this
leaves out is what the ``.gitignore`` files name (``.venv/``, ``__pycache__/``, ``*.egg-info/``, ``/work_dirs/``,
``/data/``, checkpoints) and ``.git`` itself; a file not yet added to git is listed like a committed one, as
``git archive`` of a commit that adds it would hold it.

The patterns are read as gitignore(5) reads them: ``#`` comments, ``!`` negation (the last matching pattern
decides), a trailing ``/`` for folders alone, a pattern with a ``/`` before its end anchored to its
``.gitignore``'s folder and one without it matched against names at any depth, ``*``, ``?``, ``[...]`` and
``**``. An ignored folder's contents are ignored whatever a later pattern says, as in git. Not read: escapes with
a backslash, trailing spaces, ``.git/info/exclude`` and the user's global excludes (a copy has none of them).
"""
import os
import re
import shutil
from typing import List, NamedTuple


class IgnoreRule(NamedTuple):
    folder: str  # the .gitignore's folder, relative to the root ('' for the root), '/'-terminated
    pattern: re.Pattern
    negated: bool
    folders_only: bool


def glob_regex(glob: str) -> str:
    """The regular expression of a gitignore glob (no leading or trailing '/') over '/'-separated paths."""
    parts, i = [], 0
    while i < len(glob):
        if glob.startswith('**/', i):
            parts.append('(?:.*/)?')
            i += 3
        elif glob.startswith('**', i):
            parts.append('.*')
            i += 2
        elif glob[i] == '*':
            parts.append('[^/]*')
            i += 1
        elif glob[i] == '?':
            parts.append('[^/]')
            i += 1
        elif glob[i] == '[' and glob.find(']', i + 2) != -1:
            end = glob.find(']', i + 2)
            body = glob[i + 1:end]
            parts.append('[' + ('^' + body[1:] if body.startswith('!') else body) + ']')
            i = end + 1
        else:
            parts.append(re.escape(glob[i]))
            i += 1
    return ''.join(parts)


def read_rules(path: str, folder: str) -> List[IgnoreRule]:
    """The rules of the .gitignore at ``path``, which sits in ``folder`` (relative to the root, '/'-terminated)."""
    rules = []
    with open(path, encoding='utf-8') as f:
        for line in f.read().splitlines():
            line = line.rstrip()
            if not line or line.startswith('#'):
                continue
            negated = line.startswith('!')
            glob = line[1:] if negated else line
            folders_only = glob.endswith('/')
            glob = glob.rstrip('/')
            anchored = '/' in glob
            regex = glob_regex(glob.lstrip('/'))
            rules.append(IgnoreRule(folder, re.compile(regex if anchored else '(?:.*/)?' + regex), negated,
                                    folders_only))
    return rules


def is_ignored(rules: List[IgnoreRule], path: str, is_folder: bool) -> bool:
    """Whether the last rule that matches ``path`` (relative to the root, '/'-separated) ignores it."""
    ignored = False
    for rule in rules:
        if path.startswith(rule.folder) and (is_folder or not rule.folders_only) and \
                rule.pattern.fullmatch(path[len(rule.folder):]):
            ignored = not rule.negated
    return ignored


def source_files(root: str) -> List[str]:
    """Every file under ``root`` that its .gitignore files leave, as sorted '/'-separated relative paths."""
    rules_by_folder = {}
    found = []
    for folder, subfolders, files in os.walk(root):
        relative = os.path.relpath(folder, root).replace(os.sep, '/')
        prefix = '' if relative == '.' else relative + '/'
        # a folder's rules apply to it and below, after (so above) those of the folders that hold it
        rules = rules_by_folder.get(prefix, [])
        if '.gitignore' in files:
            rules = rules + read_rules(os.path.join(folder, '.gitignore'), prefix)
        subfolders[:] = sorted(name for name in subfolders
                               if name != '.git' and not is_ignored(rules, prefix + name, True))
        for name in subfolders:
            rules_by_folder[prefix + name + '/'] = rules
        found += [prefix + name for name in files if name != '.git' and not is_ignored(rules, prefix + name, False)]
    return sorted(found)


def copy_source_files(root: str, dest: str) -> None:
    """The files ``source_files`` lists under ``root`` copied into ``dest``, in their folders."""
    for path in source_files(root):
        os.makedirs(os.path.dirname(os.path.join(dest, path)), exist_ok=True)
        shutil.copy2(os.path.join(root, path), os.path.join(dest, path))
