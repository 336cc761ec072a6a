"""Train a detector (mmdet config) or a segmentor (mmseg config).

    python tools/train.py CONFIG [--work-dir DIR] [--resume [CHECKPOINT]] [--amp] [--cfg-options K=V ...]
    tools/dist_train.sh CONFIG GPUS [same options]      # several processes; works on CPU too (gloo)
"""
import argparse
import sys

import torch
from mmengine.dist import get_world_size

from mala_tools.checks.batch import batch_notice
from mala_tools.checks.config_keys import config_errors, warn_about_config
from mala_tools.checks.head_classes import head_class_problems
from mala_tools.checks.preflight import data_problems, missing_weight_files, preflight
from mala_tools.config import add_common_args, load_config
from mala_tools.device import require_gpus_where_the_machine_has_them
from mala_tools.distributed import setup_distributed
from mala_tools.errors import is_main_process, tool_main
from mala_tools.machine_fit import fit_optim_wrapper_to_device, report_changes
from mala_tools.recipe import recipe_notice
from mala_tools.runner import build_runner, ending_the_run


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    parser.add_argument(
        '--resume', nargs='?', const='auto',
        help='resume from CHECKPOINT, or, without one, from the latest checkpoint in the work dir')
    parser.add_argument('--amp', action='store_true',
                        help='mixed precision: fp16 on CUDA (a dynamic loss scale unless the config has its own '
                        'AmpOptimWrapper), bfloat16 on CPU')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help="scale the lr by the total batch size over the config's auto_scale_lr.base_batch_size")
    return parser.parse_args()


def main():
    args = parse_args()
    require_gpus_where_the_machine_has_them()
    cfg = load_config(args)
    changes = fit_optim_wrapper_to_device(cfg.optim_wrapper, args.amp, torch.cuda.is_available())
    problems = []
    if args.amp and not torch.cuda.is_available() and torch.__version__.startswith('2.1.'):
        # measured with 2.1.2 (docs/dev/tested_versions.md); 2.13 trains in bfloat16 on CPU
        problems.append("--amp on CPU: torch 2.1's CPU attention kernel aborts the process in its bfloat16 "
                        'backward; train without --amp (fp32) or with a newer torch')
    if args.auto_scale_lr:
        if 'base_batch_size' in cfg.get('auto_scale_lr', {}):
            cfg.auto_scale_lr.enable = True
        else:
            problems.append(f'--auto-scale-lr: {args.config} has no auto_scale_lr.base_batch_size to scale from')
    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        cfg.resume, cfg.load_from = True, args.resume
    changes += setup_distributed(cfg)
    report_changes(changes)
    # a paper row's config: the recipe check's lines (the batch among them); any other: the batch line alone. The
    # main process alone prints them, so it alone reads the rows and builds the models the check compares.
    if is_main_process():
        notice = recipe_notice(cfg, args.config, get_world_size()) or batch_notice(cfg, get_world_size())
        if notice:
            print(notice, file=sys.stderr)
    warn_about_config(cfg, args.config)
    load_from_name = 'load_from' if args.resume in (None, 'auto') else '--resume checkpoint'
    loaders = ('train_dataloader', 'val_dataloader')
    preflight(lambda: [*config_errors(cfg, args.config, not args.skip_config_check), *problems,
                       *head_class_problems(cfg, loaders), *missing_weight_files(cfg, load_from_name),
                       *data_problems(cfg, loaders)])
    with ending_the_run():
        build_runner(cfg).train()


if __name__ == '__main__':
    tool_main(main)
