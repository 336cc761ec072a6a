"""The one way a command-line tool stops on an error: ``error: <message>`` on stderr and exit status 2.

The functions of this package raise :class:`ToolError` (or their own typed errors); :func:`tool_main`, the entry
of every tool, turns them into that line and status, and is the one place that exits. A check tool whose answer
is "no" (a checkpoint that fits no variant, images that do not decode, model-zoo tables that are out of date)
stops the same way, with the reason.
"""
import os
import re
import sys
from typing import Callable, List, NoReturn

ERROR_STATUS = 2


def is_main_process() -> bool:
    return int(os.environ.get('RANK', os.environ.get('SLURM_PROCID', 0))) == 0


def local_rank() -> int:
    """The process's index on its node (torchrun's LOCAL_RANK, srun's SLURM_LOCALID); 0 outside a job."""
    return int(os.environ.get('LOCAL_RANK', os.environ.get('SLURM_LOCALID', 0)))


def print_error(message: str) -> None:
    print(f'error: {message}', file=sys.stderr, flush=True)


class ToolError(Exception):
    """A problem that stops a tool, its message the tool's ``error:`` line(s). ``printed``: this process has
    printed it already (a distributed pre-flight prints before its last barrier, so that no line is lost when
    the launcher stops the other processes)."""

    def __init__(self, message: str, printed: bool = False):
        super().__init__(message)
        self.printed = printed


def fail(message: str) -> NoReturn:
    """Stop the tool with ``message``: raise :class:`ToolError`."""
    raise ToolError(message)


def tool_main(main: Callable[[], object]) -> None:
    """Run a tool's ``main``. A :class:`ToolError`, or an error of this package that explains itself (a
    checkpoint that cannot be read or does not fit, arguments that cannot build a MALA), ends the process with
    ``error: <message>`` on stderr (once per job, not once per process) and exit status 2; anything else stays a
    traceback. (``ending_the_run`` turns a run's other typed errors, too many undecodable images or skipped steps,
    into ToolError.)"""
    from mala_mm.checkpoint import CheckpointError
    from mala_mm.models import MALAConfigError
    try:
        main()
    except ToolError as err:
        if not err.printed and is_main_process():
            print_error(str(err))
        raise SystemExit(ERROR_STATUS) from None
    except (CheckpointError, MALAConfigError) as err:
        if is_main_process():
            print_error(build_error_message(err))
        raise SystemExit(ERROR_STATUS) from None


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
