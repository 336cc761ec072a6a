"""Whether a config trains a paper row's recipe, and where it departs from it (``tools/check_recipe.py``)."""
import functools
from typing import List, NamedTuple, Optional

from .compare import count, differences
from .facts import recipe_facts, unloaded_backbone_tensors
from .rows import Row, candidate_rows, find_row, row_config


class RecipeCheck(NamedTuple):
    """The row a config was checked against, on how many GPUs, what differs (a line each) and notes on what could
    not be checked."""
    row: Row
    gpus: int
    differences: List[str]
    notes: List[str]


def row_gpus(row: Row) -> int:
    """The GPUs the row's recipe is for: its base batch over its batch a GPU."""
    cfg = row_config(row)
    return cfg.auto_scale_lr.base_batch_size // cfg.train_dataloader.batch_size


@functools.lru_cache(maxsize=None)
def row_facts(row: Row) -> dict:
    """The facts of the row's own config on its own GPUs; rows do not change while a process runs."""
    return recipe_facts(row_config(row), row_gpus(row))


def check_recipe(cfg, gpus: Optional[int] = None, row_name: Optional[str] = None) -> Optional[RecipeCheck]:
    """``cfg`` on ``gpus`` GPUs (default: the row's) against the row named ``row_name``, else against the paper row
    of its method, variant and dataset that it departs from least; None where it reproduces no row."""
    rows = [find_row(row_name)] if row_name else candidate_rows(cfg)
    ours, checks = {}, []
    for row in rows:
        own_gpus = row_gpus(row)
        run_gpus = gpus or own_gpus
        if run_gpus not in ours:
            ours[run_gpus] = recipe_facts(cfg, run_gpus)
        checks.append(RecipeCheck(row, run_gpus, differences(ours[run_gpus], row_facts(row), row.name), []))
    if not checks:
        return None
    check = min(checks, key=lambda c: len(c.differences))
    unloaded = unloaded_backbone_tensors(cfg)
    if unloaded is None:
        path = (cfg.model.backbone.get('init_cfg') or {}).get('checkpoint')
        if path:
            check.notes.append(f"the backbone's weights {path} are not on disk here: whether their keys load was not "
                               'checked')
    elif unloaded[0]:
        check.differences.append(f"backbone weights: {unloaded[0]} of the backbone's {unloaded[1]} tensors are not "
                                 'in the file (or have other shapes) and keep their initialisation')
    return check


def recipe_notice(cfg, config: str, gpus: int) -> Optional[str]:
    """What tools/train.py prints at its start for a config that reproduces a paper row: one line saying it trains
    the row's recipe, or one for each difference; None for a config of no row."""
    try:
        check = check_recipe(cfg, gpus)
    except Exception as err:  # the check informs a run and never stops it: the run's own build says what is wrong
        first_line = (str(err).splitlines() or [''])[0][:200]
        return f'recipe: not checked against a paper row: {type(err).__name__}: {first_line}'
    if check is None:
        return None
    return '\n'.join([f'recipe: {summary(check, config)}', *(f'recipe: - {line}' for line in check.differences)])


def summary(check: RecipeCheck, config: str) -> str:
    """One line: the row the config trains, or how many ways it departs from it."""
    gpus = count(check.gpus, 'GPU')
    if not check.differences:
        return f"{config} trains {check.row.name}'s recipe on {gpus}"
    return f"{config} departs from {check.row.name} on {gpus} in {count(len(check.differences), 'way')}"


__all__ = ['RecipeCheck', 'check_recipe', 'recipe_notice', 'summary']
