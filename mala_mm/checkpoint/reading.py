"""Reading a checkpoint as data: a restricted unpickler that builds only the globals torch allows for
``weights_only`` loading and :data:`SAFE_GLOBALS`, equally strict on every torch, and a message for each way a file
can fail to be a checkpoint."""
import _codecs
import _compat_pickle
import argparse
import collections
import functools
import os
import pickle
from typing import Dict, List
from urllib.error import URLError
from urllib.parse import urlparse

import numpy as np
import torch
from mmengine.logging import HistoryBuffer

_numpy_core = np.core if np.__version__.startswith('1.') else np._core  # renamed in numpy 2


HISTORY_BUFFER_STATISTICS = ('min', 'max', 'mean', 'current')  # HistoryBuffer's own statistics methods


def _history_buffer_statistic(owner, name: str):
    """Stands in for ``getattr`` while unpickling: mmengine's HistoryBuffer pickles its statistics methods as
    ``getattr(HistoryBuffer, 'mean')``; nothing else may be looked up."""
    if owner is HistoryBuffer and name in HISTORY_BUFFER_STATISTICS:
        return getattr(owner, name)
    owner_name = f'{getattr(owner, "__module__", "?")}.{getattr(owner, "__qualname__", owner)}'
    raise pickle.UnpicklingError(f'refused: getattr({owner_name}, {name!r})')


SAFE_GLOBALS = [
    argparse.Namespace,  # `args` of the release's DeiT-style classification checkpoints
    HistoryBuffer,  # mmengine's message hub, saved under `meta`
    (_history_buffer_statistic, 'builtins.getattr'),
    # numpy arrays and scalars inside mmengine's `meta`
    np.ndarray, np.dtype, _numpy_core.multiarray._reconstruct, _numpy_core.multiarray.scalar,
    # data types that newer torch allows and torch 2.1 does not: numpy 1.x pickles an array's bytes through
    # _codecs.encode, MultiStepLR's state holds its milestones as a Counter
    _codecs.encode, collections.Counter, set, complex, bytearray,
    *{type(np.dtype(code)) for code in '?bhilqBHILQefdgFDGUSO'},
]


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read, or that does not fit the model."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint path that names no file."""


def _local_path(filename: str) -> str:
    filename = os.path.expanduser(filename)
    if urlparse(filename).scheme in ('http', 'https'):
        cache_dir = os.path.join(torch.hub.get_dir(), 'checkpoints')
        path = os.path.join(cache_dir, os.path.basename(urlparse(filename).path))
        if not os.path.exists(path):
            os.makedirs(cache_dir, exist_ok=True)
            # a file of this process's own, moved into place whole: the processes of a job download at once
            partial = f'{path}.{os.getpid()}.part'
            try:
                torch.hub.download_url_to_file(filename, partial)
            except URLError as err:  # an HTTPError (404, 403, ...) too
                raise CheckpointNotFoundError(f'checkpoint {filename!r} could not be downloaded: {err}') from None
            os.replace(partial, path)
        return path
    if not os.path.isfile(filename):
        raise CheckpointNotFoundError(f'checkpoint {filename!r} does not exist; pass a file path or an http(s) URL')
    return filename


@functools.lru_cache(maxsize=None)
def _allowed_objects() -> Dict[str, object]:
    """'module.name' -> object, for every global a checkpoint's pickle may name: torch's own allow-list for
    ``weights_only`` loading and :data:`SAFE_GLOBALS` (a ``(callable, name)`` entry stands in for ``name``)."""
    # The one private member of another library that this package reads. torch has no public view of the default
    # allow-list (torch.serialization.get_safe_globals() lists only what add_safe_globals added), and its public
    # route, torch.load(weights_only=True) with add_safe_globals, starts at torch 2.4 while setup.py allows 2.1;
    # the tested torch 2.1.2 and 2.13 both have this function.
    from torch import _weights_only_unpickler
    allowed = dict(_weights_only_unpickler._get_allowed_globals())
    for entry in SAFE_GLOBALS:
        if isinstance(entry, tuple):
            allowed[entry[1]] = entry[0]
        else:
            allowed[f'{entry.__module__}.{entry.__qualname__}'] = entry
    return allowed


def _python3_name(module: str, name: str) -> str:
    """'module.name' as Python 3 resolves a global of a protocol-2 pickle (``__builtin__.set`` is
    ``builtins.set``), which is the protocol torch saves with."""
    module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
    return f'{_compat_pickle.IMPORT_MAPPING.get(module, module)}.{name}'


class _RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that builds nothing but the allowed globals: any other name is refused before it is
    imported, so nothing a hostile pickle names is run."""

    def find_class(self, module: str, name: str):
        full_name = _python3_name(module, name)
        try:
            return _allowed_objects()[full_name]
        except KeyError:
            raise pickle.UnpicklingError(f'refused: {full_name}') from None


class _RestrictedPickle:
    """The ``pickle_module`` torch.load reads a checkpoint's pickle with."""
    Unpickler = _RestrictedUnpickler
    UnpicklingError = pickle.UnpicklingError

    @staticmethod
    def load(file, **kwargs):
        return _RestrictedUnpickler(file, **kwargs).load()


def safe_load(filename: str, map_location='cpu'):
    """``torch.load`` a local file or URL as data only.

    Raises:
        CheckpointNotFoundError: no such file, or a URL that could not be downloaded (a FileNotFoundError).
        CheckpointError: the file cannot be read (empty, text, truncated, a zip or pickle that is not a
            checkpoint), or its pickle names a global outside :data:`SAFE_GLOBALS` and torch's own allow-list
            (reported by name; nothing of it is executed). The message says which and what to do.
    """
    path = _local_path(filename)
    try:
        # weights_only=False only hands the unpickling to _RestrictedPickle, which is as strict
        return torch.load(path, map_location=map_location, pickle_module=_RestrictedPickle, weights_only=False)
    except Exception as err:  # the unpickler and the zip reader fail in many ways on bytes that are no checkpoint
        raise CheckpointError(_why_unreadable(filename, path, err)) from None


def pickle_globals(data: bytes) -> List[str]:
    """The 'module.name' of every global a pickle stream names, in order, read without unpickling anything.

    Python 2 names that protocol-2 pickles use (``commands.Popen``) are given as Python 3 names
    (``subprocess.Popen``), as the unpickler would resolve them.
    """
    import pickletools
    names, strings, memo = [], [], {}
    try:
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name in ('SHORT_BINUNICODE', 'BINUNICODE', 'BINUNICODE8', 'UNICODE'):
                strings.append(arg)
            elif opcode.name == 'MEMOIZE' and strings:
                memo[len(memo)] = strings[-1]
            elif opcode.name in ('PUT', 'BINPUT', 'LONG_BINPUT') and strings:
                memo[arg] = strings[-1]
            elif opcode.name in ('GET', 'BINGET', 'LONG_BINGET') and isinstance(memo.get(arg), str):
                strings.append(memo[arg])
            if opcode.name in ('GLOBAL', 'INST'):
                module, name = arg.split(' ', 1)
            elif opcode.name == 'STACK_GLOBAL' and len(strings) >= 2:
                module, name = strings[-2], strings[-1]
            else:
                continue
            names.append(_python3_name(module, name))
    except Exception:  # a truncated stream: the globals before the cut are what matters
        pass
    return names


def _pickle_streams(path: str) -> List[bytes]:
    """The pickles of a checkpoint: data.pkl of a zip checkpoint, or the whole file of a legacy one."""
    import zipfile
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            return [archive.read(name) for name in archive.namelist() if name.endswith('.pkl')]
    with open(path, 'rb') as f:
        return [f.read()]


def _why_unreadable(filename: str, path: str, err: Exception) -> str:
    """An accurate, actionable message for a file torch.load turned down."""
    import zipfile
    size = os.path.getsize(path)
    if size == 0:
        return f'cannot read checkpoint {filename!r}: the file is empty (0 bytes); download or copy it again'
    with open(path, 'rb') as f:
        head = f.read(512)
    if head.startswith(b'PK'):
        if not zipfile.is_zipfile(path):
            return (f'cannot read checkpoint {filename!r}: it is truncated or corrupted ({size} bytes; its zip '
                    f'archive has no end); download or copy it again')
        with zipfile.ZipFile(path) as archive:
            if not any(name.endswith('data.pkl') for name in archive.namelist()):
                return (f'cannot read checkpoint {filename!r}: it is a zip archive but not a PyTorch checkpoint '
                        f'(no data.pkl among {archive.namelist()[:5]})')
    elif _is_text(head):
        first_line = head.decode('utf-8', 'replace').strip().splitlines()[0][:60]
        return (f'cannot read checkpoint {filename!r}: it is a text file, not a PyTorch checkpoint (it begins '
                f'{first_line!r}); a failed download often saves an error page')
    allowed = _allowed_objects()
    refused = [name for stream in _pickle_streams(path) for name in pickle_globals(stream) if name not in allowed]
    refused = list(dict.fromkeys(refused))
    own_refusal = next((line.split('refused: ', 1)[1].strip() for line in str(err).splitlines()
                        if 'refused: ' in line), None)
    if refused or own_refusal:
        # posix.system is how os.system pickles on Linux (nt.system on Windows)
        what = ', '.join(f'{name} (os.{name.split(".", 1)[1]})' if name.startswith(('posix.', 'nt.')) else name
                         for name in refused) if refused else own_refusal
        return (f'refused to load {filename!r}: its pickle calls {what}, which a checkpoint of plain tensors '
                f'never needs, so nothing of it was run. Treat the file as unsafe: do not load it with '
                f'weights_only=False. Get the weights from a source you trust, or have its maker save a '
                f'tensor-only state dict.')
    last = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
    return f'cannot read checkpoint {filename!r}: it is truncated or not a PyTorch checkpoint ({last})'


def _is_text(head: bytes) -> bool:
    try:
        text = head.decode('utf-8')
    except UnicodeDecodeError:
        text = head[:-3].decode('utf-8', 'ignore') if len(head) == 512 else ''  # a character cut at byte 512
    return bool(text) and all(c.isprintable() or c in '\r\n\t' for c in text)
