"""Checking, before a run starts, that the folders a config's datasets read exist and hold no empty files."""
import os
import os.path as osp
from typing import Iterator, List

from .builtin import GENERATE_COMMAND


class DatasetNotFoundError(FileNotFoundError):
    """A dataset folder or annotation file that a config needs is missing."""


class EmptyDataFileError(OSError):
    """A dataset file is empty: the image decoder would stop on it without naming it."""


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


def _empty_files(path: str) -> Iterator[str]:
    if osp.isfile(path):
        if osp.getsize(path) == 0:
            yield path
    elif osp.isdir(path):
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_dir():
                    yield from _empty_files(entry.path)
                elif entry.is_file() and entry.stat().st_size == 0:
                    yield entry.path


def empty_data_files(cfg, dataloaders=('train_dataloader', 'val_dataloader', 'test_dataloader')) -> List[str]:
    """Empty files (what a download or copy stopped part way leaves) among the annotation files and in the
    image/label folders, at any depth, of ``cfg``'s dataloaders. Sizes only: no file is opened."""
    paths = {path: None for dataset_cfg in _leaf_datasets(cfg, dataloaders) for path in _paths(dataset_cfg)}
    return [empty for path in paths for empty in _empty_files(path)]


def _roots(cfg, dataloaders) -> List[str]:
    return sorted({d.get('data_root') or '.' for d in _leaf_datasets(cfg, dataloaders)})


def _generate_command(roots: List[str], force: bool = False) -> str:
    """The command that makes the built-in datasets among ``roots``, or '' if there are none."""
    # the built-in dataset can be made on the spot; any other has to be downloaded
    builtin_roots = [root for root in roots if 'builtin' in osp.basename(osp.normpath(root))]
    return ' && '.join(
        GENERATE_COMMAND.format(root=osp.normpath(root)) + (' --force' if force else '') for root in builtin_roots)


def _shown(paths: List[str]) -> str:
    return ', '.join(paths[:4]) + (f' and {len(paths) - 4} more' if len(paths) > 4 else '')


def check_data_paths(cfg, dataloaders=('train_dataloader', 'val_dataloader', 'test_dataloader')) -> None:
    """Raise DatasetNotFoundError naming what is missing and how to get it, or EmptyDataFileError naming the
    empty files and how to replace them."""
    roots = _roots(cfg, dataloaders)
    missing = missing_data_paths(cfg, dataloaders)
    if missing:
        command = _generate_command(roots)
        how = (f'generate it with: {command}' if command else
               'download and prepare the dataset as the MMDetection/MMSegmentation dataset guides describe, '
               'or point the config at it, e.g. --cfg-options train_dataloader.dataset.data_root=PATH')
        raise DatasetNotFoundError(
            f'dataset not found under {", ".join(map(repr, roots))}: missing {_shown(missing)}. To fix it, {how}')
    empty = empty_data_files(cfg, dataloaders)
    if empty:
        command = _generate_command(roots, force=True)
        how = (f'generate it again with: {command}' if command else
               'copy or download these files again, or remove them from the dataset')
        raise EmptyDataFileError(
            f'empty files in the dataset under {", ".join(map(repr, roots))}: {_shown(empty)} (a download or '
            f'copy that stopped part way leaves these). To fix it, {how}')
