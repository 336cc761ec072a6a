"""Generate the built-in shapes dataset (instance + semantic segmentation) used by the *_builtin configs.

    python tools/make_builtin_dataset.py --out data/builtin

Deterministic for given parameters; a second run with the same parameters does nothing.
"""
import argparse
import time

from mala_mm.datasets import BuiltinDatasetParams, dataset_summary, generate_builtin_dataset
from mala_tools.errors import fail, tool_main

DEFAULTS = BuiltinDatasetParams()


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default='data/builtin', help='output folder')
    parser.add_argument('--seed', type=int, default=DEFAULTS.seed)
    parser.add_argument('--image-size', type=int, default=DEFAULTS.image_size, help='square image side, px')
    parser.add_argument('--num-train', type=int, default=DEFAULTS.num_train)
    parser.add_argument('--num-val', type=int, default=DEFAULTS.num_val)
    parser.add_argument('--max-objects', type=int, default=DEFAULTS.max_objects, help='shapes per image, at most')
    parser.add_argument('--force', action='store_true', help='regenerate even if up to date')
    args = parser.parse_args()
    if args.image_size < 64 or min(args.num_train, args.num_val, args.max_objects) < 1:
        parser.error('--image-size must be >= 64 and --num-train, --num-val, --max-objects >= 1')
    return args


def main():
    args = parse_args()
    params = BuiltinDatasetParams(seed=args.seed, image_size=args.image_size, num_train=args.num_train,
                                  num_val=args.num_val, max_objects=args.max_objects)
    start = time.perf_counter()
    try:
        written = generate_builtin_dataset(args.out, params, force=args.force)
    except FileExistsError as err:
        fail(str(err))
    state = f'generated in {time.perf_counter() - start:.1f} s' if written else 'already up to date'
    print(f'built-in dataset at {args.out}: {state}; {dataset_summary(args.out)}')


if __name__ == '__main__':
    tool_main(main)
