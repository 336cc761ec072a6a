"""Decode every image of a config's dataset splits and list those that cannot be decoded.

    python tools/check_dataset.py CONFIG [--splits train val test] [--workers N]

Exit status 0 when every image decodes, 2 with the list of those that do not (and what to do about them).
"""
import argparse
import time

from mmengine.config import DictAction

from mala_tools.checks.data_paths import DatasetNotFoundError, EmptyDataFileError, check_data_paths
from mala_tools.checks.images import split_image_paths, undecodable_images
from mala_tools.config import read_config
from mala_tools.errors import fail, tool_main


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config')
    parser.add_argument('--splits', nargs='+', default=['train', 'val', 'test'], choices=['train', 'val', 'test'])
    parser.add_argument('--workers', type=int, default=0, help='decoding processes (default: all cores)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config entries')
    args = parser.parse_args()
    cfg = read_config(args.config, args.cfg_options)
    splits = [s for s in args.splits if cfg.get(f'{s}_dataloader') is not None]
    try:
        check_data_paths(cfg, [f'{s}_dataloader' for s in splits])
    except DatasetNotFoundError as err:
        fail(str(err))
    except EmptyDataFileError:
        pass  # empty images are listed below with the other undecodable ones
    start = time.perf_counter()
    paths = {split: split_image_paths(cfg, split) for split in splits}
    everything = list(dict.fromkeys(p for split in splits for p in paths[split]))
    bad = undecodable_images(everything, args.workers)
    seconds = time.perf_counter() - start
    print(f'decoded {len(everything)} images of {", ".join(f"{s} ({len(paths[s])})" for s in splits)} '
          f'in {seconds:.1f} s')
    if not bad:
        print('every image decodes')
        return
    listing = '\n'.join(f'  {path}: {reason}' for path, reason in bad)
    fail(f'{len(bad)} of {len(everything)} images cannot be decoded:\n{listing}\n'
         'Replace them from the original dataset (re-download or re-extract), or remove them from the annotation '
         "file; or let training skip them: dict(type='LoadImageOrSkip', max_skipped=N) in place of "
         'LoadImageFromFile in the training pipeline (at most N skipped; docs/reliability.md).')


if __name__ == '__main__':
    tool_main(main)
