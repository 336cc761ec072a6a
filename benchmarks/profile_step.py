"""Where a backbone step's time goes: the forward and backward of MALA by part of the model.

Profiles a train step (forward, ``sum(mean(out_i))``, backward) or an eval forward of one variant with
torch.profiler and charges every operator's own time to the part of the model it belongs to
(:mod:`mala_tools.analysis.step_profile` says how). Writes results/<device>/profile_<variant>_<mode>.{md,json}.

    python -m benchmarks.profile_step [--variant tiny] [--sizes 800x1280 512x2048] [--mode train|eval]
"""
import argparse

import torch

from mala_mm import MALA
from mala_tools.analysis.step_profile import charge, labelled_parts, profile, table_rows

from .common import markdown_table, write_results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--variant', default='tiny')
    parser.add_argument('--sizes', nargs='+', default=['800x1280', '512x2048'], help='HxW inputs')
    parser.add_argument('--mode', choices=['train', 'eval'], default='train')
    parser.add_argument('--steps', type=int, default=2, help='profiled steps per size, after one warm-up step')
    args = parser.parse_args()
    torch.manual_seed(0)
    model = MALA(arch=args.variant)
    model.init_weights()
    model.train(args.mode == 'train')
    rows = []
    with labelled_parts(model):
        for size in args.sizes:
            height, width = map(int, size.split('x'))
            x = torch.randn(1, 3, height, width)
            parts = charge(profile(model, x, args.mode == 'train', args.steps))
            for row in table_rows(parts, args.steps):
                rows.append({'input': f'{width}x{height}', **row})
                print(rows[-1], flush=True)
    table = markdown_table(rows, ['input', 'part', 'forward ms', 'backward ms', 'total ms', 'share %',
                                  'of which layout copies ms'])
    folder = write_results(f'profile_{args.variant}_{args.mode}', torch.device('cpu'), rows, table)
    print(table)
    print(f'written to {folder}')


if __name__ == '__main__':
    main()
