"""A config's learning-rate schedule as the points where it changes: the factor of the base lr at the start, when the
warm-up ends, at each milestone and at the end of the run.

mmengine composes the param_scheduler entries by multiplying what each does to the lr (a warm-up over the first
iterations times the decay of the whole run), so the factor at a point is the product of each scheduler's own factor
there, each read in its own unit (epochs or iterations). In an epoch-based run, an iteration-based scheduler is read
at its iteration for the points in the first epoch (a warm-up), and as ended at the later ones.
"""
import math
from typing import List, NamedTuple, Optional


class Point(NamedTuple):
    """Where the lr changes: ``label`` (e.g. 'iteration 500', 'epoch 8'), ``fraction`` of the run (0 to 1) and the
    ``factor`` of the base lr from there on."""
    label: str
    fraction: float
    factor: float


def run_length(cfg) -> tuple:
    """(unit, count): ('epoch', max_epochs) or ('iteration', max_iters), from ``train_cfg``."""
    train_cfg = cfg.get('train_cfg') or {}
    if 'max_epochs' in train_cfg:
        return 'epoch', train_cfg['max_epochs']
    return 'iteration', train_cfg.get('max_iters')


def _unit(scheduler: dict) -> str:
    return 'epoch' if scheduler.get('by_epoch', True) else 'iteration'


def _factor(scheduler: dict, t: float, base_lr: float) -> float:
    """What ``scheduler`` multiplies the lr by at step ``t`` of its unit (mmengine's closed forms; a schedule type
    not listed here counts as 1, and the check still compares its arguments as written)."""
    kind, begin = scheduler['type'], scheduler.get('begin', 0)
    end = scheduler.get('end', math.inf)
    if t < begin:
        return 1.0
    t = min(t, end)
    if kind == 'LinearLR':
        start, stop = scheduler.get('start_factor', 1 / 3), scheduler.get('end_factor', 1.0)
        return start + (stop - start) * (t - begin) / (end - begin)
    if kind == 'MultiStepLR':
        return scheduler.get('gamma', 0.1) ** sum(t >= milestone for milestone in scheduler['milestones'])
    if kind in ('PolyLR', 'CosineAnnealingLR'):
        floor = scheduler.get('eta_min', 0.0) / base_lr
        progress = (t - begin) / (end - begin)
        shape = ((1 - progress) ** scheduler.get('power', 1.0) if kind == 'PolyLR'
                 else (1 + math.cos(math.pi * progress)) / 2)
        return floor + (1 - floor) * shape
    return 1.0


def _changes(scheduler: dict) -> List[int]:
    """The steps, in its unit, after which ``scheduler`` changes its course."""
    if scheduler['type'] == 'MultiStepLR':
        return list(scheduler['milestones'])
    if scheduler['type'] == 'LinearLR':  # a warm-up: where it reaches its end factor
        return [scheduler['end']]
    return []


def schedule_points(schedulers: List[dict], cfg, base_lr: float) -> Optional[List[Point]]:
    """The lr's factor at the start, where a warm-up ends, at each milestone and at the end of the run; None where
    the run's length is not set."""
    unit, length = run_length(cfg)
    if not length:
        return None
    changes = {(_unit(s), step) for s in schedulers for step in _changes(s)} - {(unit, 0), (unit, length)}
    # the start, then the changes inside the first epoch of an epoch-based run (a warm-up's), then the rest
    steps = [(unit, 0)] + sorted(changes, key=lambda us: (us[0] == unit, us[1])) + [(unit, length)]
    points = []
    for step_unit, step in steps:
        if step_unit == unit:
            at = {unit: step, 'iteration': step if step == 0 else math.inf}
            fraction = step / length
        else:
            at = {'iteration': step, 'epoch': 0}
            fraction = 0.0
        factor = math.prod(_factor(s, at[_unit(s)], base_lr) for s in schedulers)
        label = {0: 'the start', length: f'the end ({unit} {length})'}.get(step, f'{step_unit} {step}') \
            if step_unit == unit else f'{step_unit} {step}'
        points.append(Point(label, fraction, factor))
    return points


def describe(points: List[Point]) -> str:
    """The points as one phrase: 'x0.001 at iteration 0, x1 at iteration 500, x0.1 at epoch 8 (67%), ...'."""
    return ', '.join(f'x{point.factor:.4g} at {point.label}'
                     + (f' ({point.fraction:.0%})' if 0 < point.fraction < 1 else '') for point in points)
