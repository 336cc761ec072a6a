"""The differences between a config's facts and a paper row's, each as one line that says what differs and what it
does to the run."""
from typing import Callable, Dict, List

from .schedule import describe

# what a missing hook of this project's leaves undone
HOOK_EFFECTS = {
    'IterationSeedHook': 'random draws (drop path, augmentation) do not repeat on resume',
    'SyncNormStatsHook': "the saved BatchNorm statistics are one rank's, not the job's",
    'SkippedStepsHook': 'fp16 steps skipped for overflow at the fixed loss scale go uncounted, and a run that '
                        'skips most of them goes on',
}
BACKBONE_EFFECTS = {
    'arch': 'another network',
    'drop path': 'another strength of stochastic depth',
    'norm_eval': 'BatchNorm statistics frozen or trained otherwise',
    'frozen_stages': 'other stages trained',
    'out_indices': 'other feature maps for the neck',
}


def show(value) -> str:
    """A fact's value, short: dicts as ``k=v`` lists, lists in brackets, floats in %g."""
    if isinstance(value, dict):
        return '(' + ', '.join(f'{key}={show(item)}' for key, item in value.items()) + ')'
    if isinstance(value, list):
        return '[' + ', '.join(show(item) for item in value) + ']'
    if isinstance(value, float):
        return f'{value:g}'
    return 'none' if value is None else str(value)


def count(number: int, noun: str) -> str:
    """'1 GPU', '8 GPUs'."""
    return f"{number} {noun}{'s' if number != 1 else ''}"


def _transform(step: dict) -> str:
    return step['type'] + show({key: item for key, item in step.items() if key != 'type'})


def pipeline_lines(name: str, ours: list, row: list, row_name: str) -> List[str]:
    """A line for each transform that ``row``'s pipeline has and ours lacks, ours has and the row lacks, or both
    have with other arguments (transforms of a type matched in order)."""
    ours, row = list(ours or []), list(row or [])
    lines = []
    for step in row:
        match = next((other for other in ours if other.get('type') == step.get('type')), None)
        if match is None:
            lines.append(f'{name}: no {_transform(step)}, which {row_name} has: the images differ from the paper\'s')
            continue
        ours.remove(match)
        if match != step:
            lines.append(f'{name}: {_transform(match)} where {row_name} has {_transform(step)}')
    lines += [f'{name}: {_transform(step)}, which {row_name} does not have' for step in ours]
    return lines


def _batch(ours: dict, row: dict, name: str) -> List[str]:
    (gpus, per_gpu), (row_gpus, row_per_gpu) = ours['batch'], row['batch']
    total, row_total = gpus * per_gpu, row_gpus * row_per_gpu
    if total == row_total:
        return []
    line = (f'total batch: {total} images ({count(gpus, "GPU")} x {per_gpu}) where {name} trains {row_total} '
            f'({row_gpus} x {row_per_gpu})')
    if ours['lr'] == row['lr'] and ours['base batch']:
        return [f"{line}: the lr {show(ours['lr'])} is set for {ours['base batch']} images; --auto-scale-lr scales "
                f"it to {show(ours['lr'] * total / ours['base batch'])}"]
    if ours['lr'] == row['lr']:
        return [f"{line}: the lr {show(ours['lr'])} is {name}'s for {row_total} images"]
    return [f"{line}: the lr is {show(ours['lr'])} for it; the paper's numbers were measured at {row_total}"]


def _lr(ours: dict, row: dict, name: str) -> List[str]:
    """The lr, where it is not the row's and not the row's scaled to the batch (an unscaled lr for another batch is
    the batch line's)."""
    (gpus, per_gpu), (row_gpus, row_per_gpu) = ours['batch'], row['batch']
    if ours['lr'] is None:  # an optimizer that sets no lr: the optimizer line says which
        return []
    per_image, row_per_image = ours['lr'] / (gpus * per_gpu), row['lr'] / (row_gpus * row_per_gpu)
    if ours['lr'] == row['lr'] or abs(per_image - row_per_image) <= 1e-9 * row_per_image:
        return []
    return [f"lr: {show(ours['lr'])} for {gpus * per_gpu} images where {name} has {show(row['lr'])} for "
            f'{row_gpus * row_per_gpu}: {per_image / row_per_image:.3g}x its lr per image']


def _multipliers(ours: dict, row: dict, name: str) -> List[str]:
    changed: Dict[tuple, List[str]] = {}
    for parameter, multipliers in row.items():
        if parameter in ours and ours[parameter] != multipliers:
            changed.setdefault((ours[parameter], multipliers), []).append(parameter)
    return [f'lr and decay multipliers: {count(len(names), "parameter")} ({", ".join(names[:2])}'
            f'{", ..." if len(names) > 2 else ""}) train at lr '
            f'x{show(o[0])}, weight decay x{show(o[1])} where {name} has lr x{show(r[0])}, weight decay x{show(r[1])}'
            for (o, r), names in changed.items()]


def _norms(ours: dict, row: dict, name: str) -> List[str]:
    return [f"norm layers of the {part}: {', '.join(ours.get(part, [])) or 'none'} where {name} has "
            f"{', '.join(kinds)}" + (': BatchNorm statistics per GPU, not over the whole batch'
                                     if any('SyncBatchNorm' in kind for kind in kinds) else '')
            for part, kinds in row.items() if ours.get(part) != kinds]


def _hooks(ours: list, row: list, name: str) -> List[str]:
    return [f'no {hook} ({name} has it, from configs/_base_/mala_runtime.py): {HOOK_EFFECTS[hook]}'
            for hook in row if hook not in ours]


def _plain(label: str, effect: str = '') -> Callable:
    def lines(ours, row, name):
        return [f'{label}: {show(ours)} where {name} has {show(row)}' + (f': {effect}' if effect else '')]
    return lines


def _schedule(ours, row, name):
    return [f'lr schedule: {describe(ours) if ours else "none"} where {name} has {describe(row)}']


def _pretrained(ours, row, name):
    if ours is None:
        return [f"backbone weights: none where {name} loads {row}: the backbone starts from random weights, not "
                'ImageNet\'s']
    return [f'backbone weights: {ours} where {name} loads {row}']


# fact name -> how a difference in it is said, for the facts compared value against value
LINES = {
    'base batch': _plain('auto_scale_lr.base_batch_size', '--auto-scale-lr scales the lr from this batch'),
    'optimizer': _plain('optimizer'),
    'precision': _plain('precision'),
    'loss scale': _plain('fp16 loss scale', 'another share of small gradients underflows, or of steps overflows'),
    'clipping': _plain('gradient clipping'),
    'length': lambda o, r, name: [f'length: {o[1]} {o[0]}s where {name} trains {r[1]} {r[0]}s'],
    'schedule': _schedule,
    'backbone pretrained': _pretrained,
    'data preprocessor': _plain('data preprocessor'),
    'test mode': _plain("model's test_cfg"),
    'evaluation': _plain('evaluation'),
    'validation interval': _plain('validation interval'),
    'checkpoint interval': _plain('checkpoint interval'),
    'best checkpoint': _plain('save_best', 'the release kept its best checkpoint, which a paper number may come from'),
    'checkpoints kept': _plain('max_keep_ckpts', 'disk use, not the result'),
}
LINES.update({f'backbone {key}': _plain(f'backbone {key}', effect) for key, effect in BACKBONE_EFFECTS.items()})
# the facts whose difference takes more than a value against a value
COMPOSITE = {'lr and decay multipliers': _multipliers, 'norm layers': _norms, 'hooks': _hooks}


def differences(ours: dict, row: dict, name: str) -> List[str]:
    """One line for each fact of ``ours`` that is not ``row``'s (the facts of
    :func:`~.facts.recipe_facts`), ``name`` naming the row."""
    lines = _batch(ours, row, name) + _lr(ours, row, name)
    for fact, say in LINES.items():
        if fact == 'loss scale' and ours['precision'] != row['precision']:
            continue  # the precision line says it: a loss scale only where both train in fp16
        if ours.get(fact) != row.get(fact):
            lines += say(ours.get(fact), row.get(fact), name)
    for fact, compare in COMPOSITE.items():
        lines += compare(ours[fact], row[fact], name)
    for fact in ('train pipeline', 'test pipeline'):
        lines += pipeline_lines(fact, ours[fact], row[fact], name)
    return lines
