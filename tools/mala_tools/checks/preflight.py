"""The pre-flight: what a job checks before it builds anything (weights files, datasets), with one verdict for
all its processes."""
from typing import Callable, Iterator, List, Tuple

import torch.distributed as dist

from ..config_tree import config_dicts
from ..distributed import close_distributed
from ..errors import ToolError, fail, local_rank, missing_local_file, print_error
from .data_paths import DatasetNotFoundError, EmptyDataFileError, check_data_paths


def _pretrained_checkpoints(node, path: str = 'model') -> Iterator[Tuple[str, str]]:
    """(dotted path, file) of every ``init_cfg=dict(type='Pretrained', checkpoint=...)`` under ``node``."""
    for where, part in config_dicts(node, path):
        if part.get('type') == 'Pretrained' and isinstance(part.get('checkpoint'), str):
            yield f'{where}.checkpoint', part['checkpoint']


def missing_weight_files(cfg, load_from_name: str = 'load_from') -> List[str]:
    """One line per local weights file that training ``cfg`` reads and that does not exist: the ``Pretrained``
    init_cfgs (read before a resumed run's checkpoint too) and ``load_from``, called ``load_from_name`` in the
    line. URLs are fetched by the loader and not checked here."""
    problems = [f'{problem}; the ImageNet weights and where they go: docs/get_started.md#weights'
                for where, file in _pretrained_checkpoints(cfg.get('model'))
                for problem in missing_local_file(file, where)]
    if cfg.get('load_from'):
        problems += missing_local_file(cfg.load_from, load_from_name)
    return problems


def data_problems(cfg, dataloaders) -> List[str]:
    """The datasets of ``dataloaders`` that are missing or hold empty files, with how to fix each."""
    try:
        check_data_paths(cfg, dataloaders)
    except (DatasetNotFoundError, EmptyDataFileError) as err:
        return [str(err)]
    return []


def preflight(find_problems: Callable[[], List[str]]) -> None:
    """Stop the job (:class:`ToolError`), before anything is built, if ``find_problems()`` reports any (one line
    each).

    In a distributed job (``setup_distributed`` first) the first process of each node checks, since data and
    weights may be local to a node, and the others wait for its verdict: one look at a shared filesystem per
    node, not one per process. Every process that found a problem prints it before the group's last barrier,
    so the lines reach the terminal whatever order the processes end in afterwards: the launcher stops the
    others as soon as one exits, and a line not yet printed then would be lost.
    """
    problems = find_problems() if local_rank() == 0 else []
    if not (dist.is_available() and dist.is_initialized()):
        if problems:
            fail('\n'.join(problems))
        return
    verdicts = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, problems)
    if not any(verdicts):
        return
    for problem in problems:
        print_error(problem)
    close_distributed(finished=True)
    raise ToolError('\n'.join(problems), printed=True)
