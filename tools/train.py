"""Train a detector (mmdet config) or a segmentor (mmseg config).

    python tools/train.py CONFIG [--work-dir DIR] [--resume [CHECKPOINT]] [--amp] [--cfg-options K=V ...]
    tools/dist_train.sh CONFIG GPUS [same options]      # several processes; works on CPU too (gloo)
"""
import argparse
import sys

import torch

from mala_mm.cli import (add_common_args, check_checkpoint, check_data, fail, is_main_process, load_config,
                          run_runner, setup_distributed)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    parser.add_argument(
        '--resume', nargs='?', const='auto',
        help='resume from CHECKPOINT, or, without one, from the latest checkpoint in the work dir')
    parser.add_argument('--amp', action='store_true',
                        help='mixed precision: fp16 with a dynamic loss scale on CUDA, bfloat16 on CPU')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help="scale the lr by the total batch size over the config's auto_scale_lr.base_batch_size")
    return parser.parse_args()


def main():
    args = parse_args()
    cfg = load_config(args)
    cpu_only = not torch.cuda.is_available()
    if args.amp and not cpu_only:
        cfg.optim_wrapper.update(type='AmpOptimWrapper', loss_scale='dynamic')
    elif cpu_only and (args.amp or cfg.optim_wrapper.get('type') == 'AmpOptimWrapper'):
        if args.amp:
            cfg.optim_wrapper.type = 'CPUAmpOptimWrapper'
        else:  # a paper config's fp16 AMP, which needs CUDA; mmcv's CPU ops (nms) do not take bfloat16 either
            cfg.optim_wrapper.type = 'OptimWrapper'
            if is_main_process():
                print('AmpOptimWrapper -> OptimWrapper: fp16 mixed precision needs CUDA, so this run trains in '
                      'fp32 (--amp trains in bfloat16 on CPU)', file=sys.stderr)
        for cuda_only in ('loss_scale', 'dtype'):
            cfg.optim_wrapper.pop(cuda_only, None)
    if args.auto_scale_lr:
        if 'base_batch_size' not in cfg.get('auto_scale_lr', {}):
            fail(f'--auto-scale-lr: {args.config} has no auto_scale_lr.base_batch_size to scale from')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        check_checkpoint(args.resume, '--resume checkpoint')
        cfg.resume, cfg.load_from = True, args.resume
    check_data(cfg, ('train_dataloader', 'val_dataloader'))
    from mala_mm.datasets import skip_undecodable_images
    skip_undecodable_images(cfg)  # the config key skip_undecodable_images = N
    setup_distributed(cfg)
    run_runner(cfg, 'train')


if __name__ == '__main__':
    main()
