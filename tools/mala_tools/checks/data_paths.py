"""Checking, before a run starts, that the folders a config's datasets read exist and (where cheap) hold no empty
files."""
import os
import os.path as osp
from typing import Iterator, List, Optional, Tuple

from ..config_tree import config_dicts

# what makes the built-in dataset, which can be made on the spot (any other has to be downloaded)
GENERATE_COMMAND = 'python tools/make_builtin_dataset.py --out {root}'

ALL_DATALOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')
# The image and label folders are searched for empty files where that is cheap: up to this many files in all (the
# built-in dataset, a small dataset of one's own). One size lookup per file would cost every start of a COCO run
# (123k images) minutes on a network file system; tools/check_dataset.py decodes every image when asked.
EMPTY_SCAN_LIMIT = 10_000


class DatasetNotFoundError(FileNotFoundError):
    """A dataset folder or annotation file that a config needs is missing."""


class EmptyDataFileError(OSError):
    """A dataset file is empty: the image decoder would stop on it without naming it."""


def keyed_dataset_cfgs(dataset_cfg, key: str) -> Iterator[Tuple[str, dict]]:
    """(dotted config key, config) of each leaf dataset under ``dataset_cfg``, which is at ``key``, looking
    through wrappers such as RepeatDataset (``dataset``) and ConcatDataset (``datasets``)."""
    wrapped = ('dataset', 'datasets')
    for where, part in config_dicts(dataset_cfg, key, only=wrapped):
        if not any(name in part for name in wrapped):
            yield where, part


def _paths(dataset_cfg: dict) -> Iterator[str]:
    root = dataset_cfg.get('data_root') or ''
    if dataset_cfg.get('ann_file'):
        yield osp.join(root, dataset_cfg['ann_file'])
    for prefix in (dataset_cfg.get('data_prefix') or {}).values():
        if isinstance(prefix, str) and prefix:
            yield osp.join(root, prefix)


def keyed_leaf_datasets(cfg, dataloaders) -> List[Tuple[str, dict]]:
    """(dotted config key, config) of each leaf dataset of ``cfg``'s ``dataloaders`` (names such as
    'train_dataloader'), e.g. ('train_dataloader.dataset.dataset', ...) under a RepeatDataset."""
    return [keyed for key in dataloaders if cfg.get(key) is not None
            for keyed in keyed_dataset_cfgs(cfg[key]['dataset'], f'{key}.dataset')]


def _leaf_datasets(cfg, dataloaders) -> List[dict]:
    return [leaf for _, leaf in keyed_leaf_datasets(cfg, dataloaders)]


def evaluator_files(cfg, dataloaders) -> List[Tuple[str, str]]:
    """(dotted config key, path) of the annotation file of each evaluator that goes with ``dataloaders``
    ('val_dataloader' -> 'val_evaluator'), such as CocoMetric's ``ann_file``. mmdet's dataset configs fix it
    apart from the dataset's ``data_root``, when the base config is read."""
    files = []
    for loader in dataloaders:
        key = loader.replace('_dataloader', '_evaluator')
        evaluators = cfg.get(key) if cfg.get(loader) is not None else None
        if isinstance(evaluators, dict):
            keyed = [(key, evaluators)]
        else:
            keyed = [(f'{key}.{index}', evaluator) for index, evaluator in enumerate(evaluators or [])]
        files += [(f'{key}.ann_file', evaluator['ann_file']) for key, evaluator in keyed
                  if isinstance(evaluator, dict) and isinstance(evaluator.get('ann_file'), str)]
    return files


def missing_data_paths(cfg, dataloaders=ALL_DATALOADERS) -> List[str]:
    """Annotation files and image/label folders named by ``cfg``'s dataloaders and their evaluators that do
    not exist."""
    paths = [p for dataset_cfg in _leaf_datasets(cfg, dataloaders) for p in _paths(dataset_cfg)]
    paths += [path for _, path in evaluator_files(cfg, dataloaders)]
    return [p for p in dict.fromkeys(paths) if not osp.exists(p)]


def _files_under(folders: List[str], limit: int) -> Optional[List[os.DirEntry]]:
    """The files in ``folders`` at any depth, or None as soon as there are more than ``limit``. Listing reads
    names and types only, a few calls per thousand files even on a network file system."""
    files: List[os.DirEntry] = []
    pending = list(folders)
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.is_dir():
                    pending.append(entry.path)
                elif entry.is_file():
                    files.append(entry)
                    if len(files) > limit:
                        return None
    return files


def empty_data_files(cfg, dataloaders=ALL_DATALOADERS, limit: int = EMPTY_SCAN_LIMIT) -> List[str]:
    """Empty files (what a download or copy stopped part way leaves) among the annotation files of ``cfg``'s
    dataloaders and their evaluators, and in their image/label folders at any depth where these hold ``limit``
    files or fewer in all. Sizes only: no file is opened."""
    paths = {path: None for dataset_cfg in _leaf_datasets(cfg, dataloaders) for path in _paths(dataset_cfg)}
    paths.update((path, None) for _, path in evaluator_files(cfg, dataloaders))
    empty = [path for path in paths if osp.isfile(path) and osp.getsize(path) == 0]
    files = _files_under([path for path in paths if osp.isdir(path)], limit) or []
    return empty + [entry.path for entry in files if entry.stat().st_size == 0]


def _roots(cfg, dataloaders) -> List[str]:
    return sorted({d.get('data_root') or '.' for d in _leaf_datasets(cfg, dataloaders)})


def _generate_command(roots: List[str], force: bool = False) -> str:
    """The command that makes the built-in datasets among ``roots``, or '' if there are none."""
    builtin_roots = [root for root in roots if 'builtin' in osp.basename(osp.normpath(root))]
    return ' && '.join(
        GENERATE_COMMAND.format(root=osp.normpath(root)) + (' --force' if force else '') for root in builtin_roots)


def _pointing_options(cfg, dataloaders) -> str:
    """``--cfg-options`` that point every key holding the dataset's location at PATH: the data_root of each
    dataset of ``dataloaders`` and the annotation file of their evaluators (as PATH/<its path under the
    data_root>)."""
    options = [f'{key}.data_root=PATH' for key, _ in keyed_leaf_datasets(cfg, dataloaders)]
    roots = [osp.normpath(root) for root in _roots(cfg, dataloaders)]
    for key, path in evaluator_files(cfg, dataloaders):
        path = osp.normpath(path)
        under = next((osp.relpath(path, root) for root in roots if path.startswith(root + os.sep)), path)
        options.append(f'{key}=PATH/{under}')
    return ' '.join(options)


def _shown(paths: List[str]) -> str:
    return ', '.join(paths[:4]) + (f' and {len(paths) - 4} more' if len(paths) > 4 else '')


def check_data_paths(cfg, dataloaders=ALL_DATALOADERS) -> None:
    """Raise DatasetNotFoundError naming what is missing and how to get it, or EmptyDataFileError naming the
    empty files and how to replace them."""
    roots = _roots(cfg, dataloaders)
    missing = missing_data_paths(cfg, dataloaders)
    if missing:
        command = _generate_command(roots)
        how = (f'generate it with: {command}' if command else
               'download and prepare the dataset as the MMDetection/MMSegmentation dataset guides describe, '
               f'or point the config at it: --cfg-options {_pointing_options(cfg, ALL_DATALOADERS)} (or, in a '
               f'config of your own, the same keys: docs/custom_dataset.md)')
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
