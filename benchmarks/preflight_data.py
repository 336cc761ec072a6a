"""What the training tool's pre-flight costs on a COCO-sized dataset: a generated tree of COCO's layout with
``--files`` small image files, checked as ``tools/train.py`` checks it before anything is built (empty files are
searched for up to EMPTY_SCAN_LIMIT files), and the same plus the size of every file (what it did before the cap),
timed in turn in one process.
Writes results/cpu/preflight_data.{md,json}.

    python -m benchmarks.preflight_data [--files 120000] [--repeats 3]
"""
import argparse
import os
import statistics
import tempfile
import time

import torch

from mala_tools.checks.config_keys import config_errors
from mala_tools.checks.data_paths import EMPTY_SCAN_LIMIT, empty_data_files
from mala_tools.checks.head_classes import head_class_problems
from mala_tools.checks.preflight import data_problems, missing_weight_files
from mala_tools.config import read_config

from .common import markdown_table, write_results

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      'configs/detection/mask_rcnn_mala_t.py')
LOADERS = ('train_dataloader', 'val_dataloader')
VAL_SHARE = 5000 / 123287  # COCO 2017's split


def make_coco_tree(root: str, files: int) -> None:
    """data/coco/ under ``root``: train2017/ and val2017/ with ``files`` 100-byte files in COCO's proportion,
    and the two annotation files (a stand-in JSON: the pre-flight reads no annotation)."""
    val = round(files * VAL_SHARE)
    for folder, count in (('train2017', files - val), ('val2017', val)):
        os.makedirs(os.path.join(root, 'data/coco', folder))
        for index in range(count):
            with open(os.path.join(root, 'data/coco', folder, f'{index:012d}.jpg'), 'wb') as f:
                f.write(b'\xff' * 100)
    os.makedirs(os.path.join(root, 'data/coco/annotations'))
    for split in ('train2017', 'val2017'):
        with open(os.path.join(root, f'data/coco/annotations/instances_{split}.json'), 'w') as f:
            f.write('{"images": [], "annotations": [], "categories": []}')


def preflight_seconds(cfg, every_file: bool) -> float:
    """The checks ``tools/train.py`` makes before building anything; with ``every_file`` also every file sized."""
    start = time.perf_counter()
    config_errors(cfg, CONFIG)
    head_class_problems(cfg, LOADERS)
    missing_weight_files(cfg)
    data_problems(cfg, LOADERS)
    if every_file:
        empty_data_files(cfg, LOADERS, limit=10**9)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--files', type=int, default=120000)
    parser.add_argument('--repeats', type=int, default=3)
    args = parser.parse_args()
    cfg = read_config(CONFIG)
    with tempfile.TemporaryDirectory() as root:
        start = time.perf_counter()
        make_coco_tree(root, args.files)
        print(f'{args.files} files generated in {time.perf_counter() - start:.1f} s')
        os.chdir(root)  # the config's data_root, data/coco/, is relative
        preflight_seconds(cfg, every_file=False)  # imports and registries, paid once by either
        times = {f'pre-flight (empty files searched up to {EMPTY_SCAN_LIMIT} files)': [],
                 'pre-flight + every file sized': []}
        for _ in range(args.repeats):
            for every_file, seconds in enumerate(times.values()):
                seconds.append(preflight_seconds(cfg, bool(every_file)))
    rows = [dict(check=check, files=args.files, median_s=statistics.median(seconds), runs=len(seconds))
            for check, seconds in times.items()]
    ratio = rows[1]['median_s'] / rows[0]['median_s']
    table = markdown_table(rows, ['check', 'files', 'median_s', 'runs'])
    note = f'sizing every file as well takes {ratio:.1f}x the pre-flight (warm page cache, local disk)'
    print(f'{table}\n\n{note}')
    write_results('preflight_data', torch.device('cpu'), rows, f'{table}\n\n{note}')


if __name__ == '__main__':
    main()
