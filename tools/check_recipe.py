"""Check that a config trains a paper row's recipe, and say where it departs from it.

    python tools/check_recipe.py CONFIG [--row NAME] [--gpus N] [--cfg-options K=V ...]

The row is the one of the config's method, backbone variant and dataset (mask_rcnn_mala_s for a Mask R-CNN with
MALA-S on COCO, its 1x or its 3x row, whichever the config departs from least), or the one --row names. It prints
a line for each difference in what decides the result, with what it does: the total batch on N GPUs (default: the
row's) and the lr after auto_scale_lr, the optimizer and each parameter's lr and decay multipliers (from the
optimizer built on the model), the lr schedule, mixed precision, loss scale and clipping, the backbone (arch, drop
path, norms, pretrained weights and whether their keys load, where the file is on disk), the train and test
pipelines, evaluation and checkpoints, and this project's hooks. Exits 0 where nothing differs, 2 where something
does or the config reproduces no row. tools/train.py makes the same check at its start.
"""
import argparse

from mmengine.config import DictAction

from mala_tools.config import read_config
from mala_tools.errors import fail, tool_main
from mala_tools.recipe import check_recipe, summary
from mala_tools.recipe.rows import paper_rows


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='config file')
    parser.add_argument('--row', help='the paper row to check against, e.g. mask_rcnn_mala_s_3x (model-index.yml)')
    parser.add_argument('--gpus', type=int, help="the GPUs the run trains on (default: the row's)")
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config entries')
    return parser.parse_args()


def main():
    args = parse_args()
    if args.gpus is not None and args.gpus < 1:
        fail(f'--gpus {args.gpus}: give the number of GPUs the run trains on, 1 or more')
    cfg = read_config(args.config, args.cfg_options)
    import mala_mm  # noqa: F401  (registers MALA)
    check = check_recipe(cfg, args.gpus, args.row)
    if check is None:
        fail(f'{args.config} reproduces no paper row: none has its method, MALA variant and dataset; name one with '
             f"--row ({', '.join(row.name for row in paper_rows())})")
    for line in check.differences:
        print(f'- {line}')
    for note in check.notes:
        print(f'note: {note}')
    if check.differences:
        fail(summary(check, args.config))
    print(summary(check, args.config))


if __name__ == '__main__':
    tool_main(main)
