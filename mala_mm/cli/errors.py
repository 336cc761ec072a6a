"""The one way a command-line tool stops on an error: ``error: <message>`` on stderr and exit status 2.

A check tool whose answer is "no" (a checkpoint that fits no variant, images that do not decode, model-zoo
tables that are out of date) stops the same way, with the reason.
"""
import os
import re
import sys
from typing import List, NoReturn

ERROR_STATUS = 2


def is_main_process() -> bool:
    return int(os.environ.get('RANK', os.environ.get('SLURM_PROCID', 0))) == 0


def local_rank() -> int:
    """The process's index on its node (torchrun's LOCAL_RANK, srun's SLURM_LOCALID); 0 outside a job."""
    return int(os.environ.get('LOCAL_RANK', os.environ.get('SLURM_LOCALID', 0)))


def print_error(message: str) -> None:
    print(f'error: {message}', file=sys.stderr, flush=True)


def fail(message: str) -> NoReturn:
    """Print ``error: message`` (once per job, not once per process) and exit with status 2."""
    if is_main_process():
        print_error(message)
    raise SystemExit(ERROR_STATUS)


def build_error_message(err: Exception) -> str:
    """The message of an error raised while a config was built into objects, as one ``fail`` line: without the
    "class `X` in its/file.py: " that mmengine's registry prefixes at every level of a nested build, and without
    the quotes that ``str`` puts around a KeyError's (the registry's "X is not in the ... registry")."""
    message = err.args[0] if isinstance(err, KeyError) and err.args else err
    return re.sub(r'class `\w+` in \S+: ', '', str(message))


def missing_file(path: str, what: str) -> List[str]:
    """``["<what> '<path>' does not exist"]`` unless ``path`` is a file, else ``[]``."""
    return [] if os.path.isfile(path) else [f'{what} {path!r} does not exist']


def missing_local_file(path: str, what: str) -> List[str]:
    """``missing_file`` for a path that may also be a URL (``https://``, ``s3://``, ``torchvision://`` ...), which
    the loader fetches and which is not checked here."""
    return [] if '://' in path else missing_file(path, what)


def require_file(path: str, what: str) -> None:
    """Stop with ``error: <what> '<path>' does not exist`` unless ``path`` is a file."""
    for problem in missing_file(path, what):
        fail(problem)
