"""Checking, before a run starts, that the folders a config's datasets read exist."""
import os.path as osp
from typing import Iterator, List

from .builtin import GENERATE_COMMAND


class DatasetNotFoundError(FileNotFoundError):
    """A dataset folder or annotation file that a config needs is missing."""


def _dataset_cfgs(dataset_cfg) -> Iterator[dict]:
    """The leaf dataset configs, looking through wrappers such as RepeatDataset and ConcatDataset."""
    if 'dataset' in dataset_cfg:
        yield from _dataset_cfgs(dataset_cfg['dataset'])
    elif 'datasets' in dataset_cfg:
        for child in dataset_cfg['datasets']:
            yield from _dataset_cfgs(child)
    else:
        yield dataset_cfg


def _paths(dataset_cfg: dict) -> Iterator[str]:
    root = dataset_cfg.get('data_root') or ''
    if dataset_cfg.get('ann_file'):
        yield osp.join(root, dataset_cfg['ann_file'])
    for prefix in (dataset_cfg.get('data_prefix') or {}).values():
        if isinstance(prefix, str) and prefix:
            yield osp.join(root, prefix)


def _leaf_datasets(cfg, dataloaders) -> List[dict]:
    return [leaf for key in dataloaders if cfg.get(key) is not None for leaf in _dataset_cfgs(cfg[key]['dataset'])]


def missing_data_paths(cfg, dataloaders=('train_dataloader', 'val_dataloader', 'test_dataloader')) -> List[str]:
    """Annotation files and image/label folders named by ``cfg``'s dataloaders that do not exist."""
    missing = []
    for dataset_cfg in _leaf_datasets(cfg, dataloaders):
        missing += [p for p in _paths(dataset_cfg) if not osp.exists(p) and p not in missing]
    return missing


def check_data_paths(cfg, dataloaders=('train_dataloader', 'val_dataloader', 'test_dataloader')) -> None:
    """Raise DatasetNotFoundError naming what is missing and how to get it."""
    missing = missing_data_paths(cfg, dataloaders)
    if not missing:
        return
    roots = sorted({d.get('data_root') or '.' for d in _leaf_datasets(cfg, dataloaders)})
    # the built-in dataset can be made on the spot; any other has to be downloaded
    builtin_roots = [root for root in roots if 'builtin' in osp.basename(osp.normpath(root))]
    if builtin_roots:
        how = 'generate it with: ' + ' && '.join(
            GENERATE_COMMAND.format(root=osp.normpath(root)) for root in builtin_roots)
    else:
        how = ('download and prepare the dataset as the MMDetection/MMSegmentation dataset guides describe, '
               'or point the config at it, e.g. --cfg-options train_dataloader.dataset.data_root=PATH')
    shown = ', '.join(missing[:4]) + (f' and {len(missing) - 4} more' if len(missing) > 4 else '')
    raise DatasetNotFoundError(
        f'dataset not found under {", ".join(map(repr, roots))}: missing {shown}. To fix it, {how}')
