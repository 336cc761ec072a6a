"""Finding, before a run, the images of a config's datasets that cannot be decoded (tools/check_dataset.py); during
a run ``LoadImageOrSkip`` skips them (mala_mm.datasets)."""
import importlib
import os
from multiprocessing import Pool
from typing import Iterable, List, Optional, Tuple

from mala_mm.datasets import decode_problem

from .data_paths import keyed_dataset_cfgs


def _problem_of(path: str) -> Tuple[str, Optional[str]]:
    return path, decode_problem(path)


def undecodable_images(paths: Iterable[str], workers: int = 0) -> List[Tuple[str, str]]:
    """(path, reason) of every image among ``paths`` that cannot be decoded, decoding in ``workers``
    processes (0: all cores)."""
    paths = list(dict.fromkeys(paths))
    with Pool(workers or os.cpu_count()) as pool:
        return [(path, reason) for path, reason in pool.imap(_problem_of, paths, chunksize=32) if reason]


def split_image_paths(cfg, split: str) -> List[str]:
    """The image files the ``<split>_dataloader`` of ``cfg`` reads (mmdet or mmseg datasets, any wrapper)."""
    from mmengine.registry import init_default_scope
    init_default_scope(cfg.default_scope)
    datasets = importlib.import_module(f'{cfg.default_scope}.registry').DATASETS
    paths = []
    for _, dataset_cfg in keyed_dataset_cfgs(cfg[f'{split}_dataloader']['dataset'], ''):
        dataset = datasets.build({**dataset_cfg, 'pipeline': [], 'lazy_init': False})
        paths += [dataset.get_data_info(i)['img_path'] for i in range(len(dataset))]
    return paths
