"""What the tools change in a config to run it on the machine they run on, each change named by its key.

The tools print the changes once and make them in the config the Runner dumps into the work dir, so that the
dumped config reproduces the run, with these tools or with mmdet's and mmseg's own.
"""
import sys
from dataclasses import dataclass
from itertools import groupby
from typing import List

from .config_tree import config_dicts
from .errors import is_main_process

SYNC_BN_TYPES = ('SyncBN', 'MMSyncBN', 'TorchSyncBN')  # mmcv's names for SyncBatchNorm
REMOVED = '(removed)'


@dataclass(frozen=True)
class ConfigChange:
    key: str  # dotted, e.g. 'model.backbone.norm_cfg.type'
    before: object
    after: object  # REMOVED for a key taken out
    why: str


def sync_bn_to_bn(node, key: str = 'model') -> List[ConfigChange]:
    """Turn every ``type='SyncBN'`` (or another SyncBatchNorm name) in the config node at ``key`` into ``'BN'``, in
    place, for processes on CPU."""
    changes = []
    for where, part in config_dicts(node, key):
        if part.get('type') in SYNC_BN_TYPES:
            changes.append(ConfigChange(f'{where}.type', part['type'], 'BN', 'torch runs SyncBN only on CUDA '
                                        'tensors: on CPU each process normalises over its own batch'))
            part['type'] = 'BN'
    return changes


def fit_optim_wrapper_to_device(optim_wrapper: dict, amp: bool, cuda: bool) -> List[ConfigChange]:
    """Set ``optim_wrapper`` (in place) to the mixed precision the device runs: with ``amp``, fp16 on CUDA (a
    config's own ``AmpOptimWrapper`` keeps its loss scale, the paper configs' static 512; any other wrapper gets a
    dynamic one) and bfloat16 on CPU (which needs no loss scale). Without CUDA a config's own fp16
    ``AmpOptimWrapper`` becomes fp32 training: fp16 autocast needs CUDA, and mmcv's CPU ops (nms) do not take
    bfloat16 either."""
    def change(name, value, why):
        changes.append(ConfigChange(f'optim_wrapper.{name}', optim_wrapper.get(name), value, why))
        if value is REMOVED:
            optim_wrapper.pop(name)
        else:
            optim_wrapper[name] = value

    changes = []
    if amp and cuda:
        if optim_wrapper.get('type') != 'AmpOptimWrapper':
            why = '--amp: fp16 with a dynamic loss scale'
            change('type', 'AmpOptimWrapper', why)
            change('loss_scale', 'dynamic', why)
        return changes
    if cuda or not (amp or optim_wrapper.get('type') == 'AmpOptimWrapper'):
        return changes
    why = ('--amp on CPU: bfloat16, which needs no loss scale' if amp else
           'fp16 mixed precision needs CUDA, so this run trains in fp32 (--amp trains in bfloat16 on CPU)')
    change('type', 'CPUAmpOptimWrapper' if amp else 'OptimWrapper', why)
    for cuda_only in ('loss_scale', 'dtype'):
        if cuda_only in optim_wrapper:
            change(cuda_only, REMOVED, why)
    return changes


def describe_changes(changes: List[ConfigChange]) -> str:
    """The changes as lines for the log, those of one reason together; '' for none."""
    if not changes:
        return ''
    lines = ["this machine runs the config with these keys changed (so does the work dir's dumped config):"]
    for why, group in groupby(changes, key=lambda change: change.why):
        lines.append('  ' + ', '.join(f'{c.key}: {c.before!r} -> {c.after if c.after is REMOVED else repr(c.after)}'
                                      for c in group) + f' ({why})')
    return '\n'.join(lines)


def report_changes(changes: List[ConfigChange]) -> None:
    """Print, once per job, the keys a tool changed in the config for this machine."""
    if changes and is_main_process():
        print(describe_changes(changes), file=sys.stderr)
