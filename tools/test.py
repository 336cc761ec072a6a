"""Evaluate a checkpoint of a detector (mmdet config) or a segmentor (mmseg config) on its test set.

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out PATH] [--show-dir DIR] [--cfg-options ...]
    tools/dist_test.sh CONFIG CHECKPOINT GPUS [same options]
"""
import argparse

from mala_tools.checks.config_keys import config_errors, warn_about_config
from mala_tools.checks.head_classes import head_class_problems
from mala_tools.checks.preflight import data_problems, preflight
from mala_tools.config import add_common_args, load_config
from mala_tools.device import require_gpus_where_the_machine_has_them
from mala_tools.distributed import setup_distributed
from mala_tools.errors import fail, missing_file, tool_main
from mala_tools.machine_fit import report_changes
from mala_tools.runner import build_runner, ending_the_run


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument(
        '--out', help='detection: a .pkl file to dump the predictions to; segmentation: a folder for the '
        'predicted label maps (.png)')
    parser.add_argument('--show', action='store_true', help='show the predictions in a window')
    parser.add_argument(
        '--show-dir', help='save pictures of the predictions, as upstream does: detection under '
        'WORK_DIR/<time>/SHOW_DIR, segmentation under SHOW_DIR/vis_data/vis_image')
    parser.add_argument('--wait-time', type=float, default=2, help='seconds each picture is shown with --show')
    return parser.parse_args()


def enable_visualization(cfg, args):
    hook = cfg.default_hooks.get('visualization')
    if hook is None:
        fail(f'{args.config} has no visualization hook in default_hooks, so --show/--show-dir cannot draw')
    hook.update(draw=True, show=args.show, wait_time=args.wait_time)
    if args.show_dir:
        if cfg.default_scope == 'mmdet':
            hook.test_out_dir = args.show_dir
        else:
            cfg.visualizer.save_dir = args.show_dir


def dump_predictions(cfg, args):
    if cfg.default_scope == 'mmdet':
        if not args.out.endswith(('.pkl', '.pickle')):
            fail(f'--out must be a .pkl file for a detection config, got {args.out!r}')
        evaluators = cfg.test_evaluator if isinstance(cfg.test_evaluator, list) else [cfg.test_evaluator]
        cfg.test_evaluator = [*evaluators, dict(type='DumpDetResults', out_file_path=args.out)]
    else:
        cfg.test_evaluator.update(output_dir=args.out, keep_results=True)


def main():
    args = parse_args()
    require_gpus_where_the_machine_has_them()
    cfg = load_config(args)
    cfg.load_from = args.checkpoint
    if args.show or args.show_dir:
        enable_visualization(cfg, args)
    if args.out:
        dump_predictions(cfg, args)
    report_changes(setup_distributed(cfg))
    warn_about_config(cfg, args.config)
    preflight(lambda: [*config_errors(cfg, args.config, not args.skip_config_check),
                       *head_class_problems(cfg, ('test_dataloader', )),
                       *missing_file(args.checkpoint, 'checkpoint'), *data_problems(cfg, ('test_dataloader', ))])
    with ending_the_run():
        build_runner(cfg).test()


if __name__ == '__main__':
    tool_main(main)
