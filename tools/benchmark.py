"""Inference speed of a config's model: images per second on random images, after a warm-up.

    python tools/benchmark.py CONFIG [--checkpoint FILE] [--shape H W] [--batch-size 1]
                              [--warmup 5] [--iters 20] [--device cpu]
"""
import argparse
import importlib
import os.path as osp
import time

import torch
from mmengine.registry import init_default_scope
from mmengine.runner import load_checkpoint

from mala_mm.cli import SCOPES, fail, read_config

DATA_SAMPLES = {'mmdet': 'DetDataSample', 'mmseg': 'SegDataSample'}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='config file')
    parser.add_argument('--checkpoint', help='weights to load (speed does not depend on them)')
    parser.add_argument('--shape', type=int, nargs=2, default=[512, 512], metavar=('H', 'W'))
    parser.add_argument('--batch-size', type=int, default=1)
    parser.add_argument('--warmup', type=int, default=5, help='untimed iterations first')
    parser.add_argument('--iters', type=int, default=20, help='timed iterations')
    parser.add_argument('--device', default='cuda:0' if torch.cuda.is_available() else 'cpu')
    return parser.parse_args()


def random_batch(scope, batch_size, height, width):
    """What a test dataloader yields: uint8 images and their data samples' meta."""
    sample_cls = getattr(importlib.import_module(f'{scope}.structures'), DATA_SAMPLES[scope])
    meta = dict(img_shape=(height, width), ori_shape=(height, width), pad_shape=(height, width),
                scale_factor=(1.0, 1.0))
    return dict(inputs=[torch.randint(0, 256, (3, height, width), dtype=torch.uint8) for _ in range(batch_size)],
                data_samples=[sample_cls(metainfo=meta) for _ in range(batch_size)])


def main():
    args = parse_args()
    cfg = read_config(args.config)
    scope = cfg.get('default_scope')
    if scope not in SCOPES:
        fail(f'{args.config}: default_scope must be one of {SCOPES}, got {scope!r}')
    init_default_scope(scope)
    model = importlib.import_module(f'{scope}.registry').MODELS.build(cfg.model)
    if args.checkpoint:
        load_checkpoint(model, args.checkpoint, map_location='cpu')
    else:
        model.init_weights()
    model = model.to(args.device).eval()
    batch = random_batch(scope, args.batch_size, *args.shape)
    sync = torch.cuda.synchronize if args.device.startswith('cuda') else (lambda: None)
    with torch.no_grad():
        for _ in range(args.warmup):
            model.test_step(batch)
        sync()
        start = time.perf_counter()
        for _ in range(args.iters):
            model.test_step(batch)
        sync()
    elapsed = time.perf_counter() - start
    images = args.iters * args.batch_size
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f'{osp.basename(args.config)} ({params:.1f}M params) on {args.device}, input '
          f'{args.batch_size}x3x{args.shape[0]}x{args.shape[1]}, threads {torch.get_num_threads()}: '
          f'{images / elapsed:.2f} images/s ({1000 * elapsed / images:.1f} ms per image, {args.iters} iterations '
          f'after {args.warmup} warm-up)')


if __name__ == '__main__':
    main()
