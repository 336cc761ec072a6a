"""Inference speed of a config's model: images per second on random images, after a warm-up.

    python tools/benchmark.py CONFIG [--checkpoint FILE] [--shape H W] [--batch-size 1]
                              [--warmup 5] [--iters 20] [--device cpu]

Without --checkpoint the weights are untrained, as the modules construct them; a detector's post-processing
then sees untrained scores, which may keep more or fewer boxes than trained weights would.
"""
import argparse
import os.path as osp
import time

import torch

from mala_mm.sample_inputs import data_samples
from mala_tools.config import read_config
from mala_tools.errors import tool_main
from mala_tools.model import build_model


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='config file')
    parser.add_argument('--checkpoint', help='weights to load (the backbone and neck take the same time whatever '
                        'their weights)')
    parser.add_argument('--shape', type=int, nargs=2, default=[512, 512], metavar=('H', 'W'))
    parser.add_argument('--batch-size', type=int, default=1)
    parser.add_argument('--warmup', type=int, default=5, help='untimed iterations first')
    parser.add_argument('--iters', type=int, default=20, help='timed iterations')
    parser.add_argument('--device', default='cuda:0' if torch.cuda.is_available() else 'cpu')
    return parser.parse_args()


def random_batch(scope: str, batch_size: int, height: int, width: int) -> dict:
    """What a test dataloader yields: uint8 images and their data samples."""
    return dict(inputs=[torch.randint(0, 256, (3, height, width), dtype=torch.uint8) for _ in range(batch_size)],
                data_samples=data_samples(scope, height, width, batch_size))


def main():
    args = parse_args()
    cfg = read_config(args.config)
    model = build_model(cfg, args.checkpoint, args.device)
    batch = random_batch(cfg.default_scope, args.batch_size, *args.shape)
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
    tool_main(main)
