"""Fetch a package's source archive where pip would find it, without running its setup.py.

``pip download --no-binary`` prepares the archive's metadata by running its setup.py, and mmcv 2.1.0's stops on
Python 3.13 and newer before anything can patch it (its ``get_version`` reads what ``exec`` defined back through
``locals()``, which PEP 667 made a snapshot). This looks where pip looks, in pip's own settings: the find-links
folders first (an offline bundle's ``wheels/``), then, unless pip is told to use no index, the index's simple page,
whose link's sha256 is checked.

    python tools/mala_tools/sdist.py NAME VERSION DEST_DIR      (prints the archive's path)
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from typing import List, Optional

DEFAULT_INDEX = 'https://pypi.org/simple'


class SdistNotFound(RuntimeError):
    """The archive is in none of the places pip would look."""


def pip_setting(name: str) -> Optional[str]:
    """pip's setting ``name`` (e.g. 'index-url'), from its environment variable or its configuration files."""
    value = os.environ.get('PIP_' + name.upper().replace('-', '_'))
    if value is not None:
        return value
    found = subprocess.run([sys.executable, '-m', 'pip', 'config', 'get', f'global.{name}'],
                           capture_output=True, text=True)
    return found.stdout.strip() or None if found.returncode == 0 else None


def archive_name(name: str, version: str) -> str:
    return f'{name}-{version}.tar.gz'


def from_find_links(filename: str, dest: str) -> Optional[str]:
    for folder in (pip_setting('find-links') or '').split():
        folder = folder[len('file://'):] if folder.startswith('file://') else folder
        path = os.path.join(folder, filename)
        if os.path.isfile(path):
            return shutil.copy(path, dest)
    return None


def from_index(name: str, filename: str, dest: str) -> str:
    index = (pip_setting('index-url') or DEFAULT_INDEX).rstrip('/')
    page_url = f'{index}/{name}/'
    with urllib.request.urlopen(page_url, timeout=120) as page:
        links: List[str] = re.findall(r'href="([^"]+)"', page.read().decode())
    for link in links:
        url, _, fragment = urllib.parse.urljoin(page_url, link).partition('#')
        if urllib.parse.unquote(url.rsplit('/', 1)[-1]) != filename:
            continue
        path = os.path.join(dest, filename)
        with urllib.request.urlopen(url, timeout=600) as response, open(path, 'wb') as out:
            shutil.copyfileobj(response, out)
        algorithm, _, expected = fragment.partition('=')
        if algorithm == 'sha256':
            with open(path, 'rb') as archive:
                if hashlib.sha256(archive.read()).hexdigest() != expected:
                    os.remove(path)
                    raise SdistNotFound(f'{url}: the download does not match the index\'s sha256 {expected}')
        return path
    raise SdistNotFound(f'{page_url} lists no {filename}')


def fetch(name: str, version: str, dest: str) -> str:
    """The path of ``name``'s ``version`` source archive, copied or downloaded into ``dest``."""
    filename = archive_name(name, version)
    os.makedirs(dest, exist_ok=True)
    path = from_find_links(filename, dest)
    if path is not None:
        return path
    if (pip_setting('no-index') or '').lower() in ('1', 'true', 'yes', 'on'):
        raise SdistNotFound(f'{filename} is in none of pip\'s find-links folders, and pip uses no index')
    return from_index(name, filename, dest)


if __name__ == '__main__':
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    try:
        print(fetch(*sys.argv[1:]))
    except (SdistNotFound, OSError) as err:
        sys.exit(f'error: {err}')
