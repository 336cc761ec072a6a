"""The backbone: images/s and peak memory of every variant at the dense-prediction input sizes.

Compares this implementation with the explicit reference of the spec (same weights; ``mala_tools.reference`` with
MALA in the release's linear order, softmax through its N x N matrix, RoPE tables rebuilt in every block, NCHW;
tests/tools/test_reference.py checks it against the release's outputs) and with mmdet's Swin-T, in eval and
in a train step (forward + backward), and measures how the cost grows with the number of pixels when every stage
uses MALA.
With --compile it also measures ``MALA(compile=True)`` against the eager model in the same run (its first call
in each mode compiles, in the untimed warm-up). Writes results/<device>/backbone_<dtype>[_compiled].{md,json} and,
with scaling sides, backbone_<dtype>[_compiled]_scaling.png.

    python -m benchmarks.backbone [--device cuda] [--variants tiny small base large] [--compile]
"""
import argparse
import os

import torch

from mala_mm import MALA
from mala_tools.reference import reference_backbone

from .common import exact_fp32, markdown_table, peak_mib, time_ms, write_results

SIZES = {'1280x800': (800, 1280), '512x2048': (512, 2048)}


def swin_tiny(**options):
    """mmdet's Swin-T (its defaults), with ``options`` in place of its arguments; None without mmdet."""
    try:
        from mmdet.models.backbones import SwinTransformer
    except ImportError:  # mmdet with compiled mmcv ops is not installed here
        return None
    return SwinTransformer(**options)


def step(model, x, train):
    if train:
        sum(out.float().mean() for out in model(x)).backward()
    else:
        with torch.no_grad():
            model(x)


def measure(model, size, device, train, dtype, memory=True):
    """img/s and peak MiB (None without ``memory``)."""
    x = torch.randn(1, 3, *size, device=device)
    model.train(train)

    def run():
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            step(model, x, train)
    ms = time_ms(run, device, warmup=1, repeats=3)
    return 1e3 / ms, peak_mib(run, device) if memory else None


def compare(args, device, dtype):
    rows = []
    for variant in args.variants:
        ours = MALA(arch=variant).to(device)
        ours.init_weights()
        baseline = reference_backbone(ours, mala_order='release')  # N x N MALA would not fit at these sizes
        check = torch.randn(1, 3, 64, 96, device=device)
        with torch.no_grad(), exact_fp32():  # the baseline must compute the same function
            for a, b in zip(ours.eval()(check), baseline.eval()(check)):
                torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
        if args.compile:
            compiled = MALA(arch=variant, compile=True).to(device)
            compiled.load_state_dict(ours.state_dict())
        for size_name, size in SIZES.items():
            for train in (False, True):
                row = dict(variant=variant, input=size_name, mode='train step' if train else 'eval')
                row['ours img/s'], row['ours MiB'] = measure(ours, size, device, train, dtype)
                if args.compile:
                    # a CPU's peak is counted by a torch dispatch mode, under which torch.compile does not run
                    row['compiled img/s'], row['compiled MiB'] = measure(compiled, size, device, train, dtype,
                                                                         memory=device.type == 'cuda')
                    row['compiled/eager'] = row['compiled img/s'] / row['ours img/s']
                row['baseline img/s'], row['baseline MiB'] = measure(baseline, size, device, train, dtype)
                row['speed-up'] = row['ours img/s'] / row['baseline img/s']
                row['memory saving'] = row['baseline MiB'] / row['ours MiB']
                if variant == 'tiny' and args.swin:
                    swin = swin_tiny()
                    if swin is not None:
                        swin = swin.to(device)
                        row['Swin-T img/s'], row['Swin-T MiB'] = measure(swin, size, device, train, dtype)
                        row['ours/Swin-T speed'] = row['ours img/s'] / row['Swin-T img/s']
                rows.append(row)
                print(row, flush=True)
    return rows


def scaling(args, device, dtype):
    rows = []
    for attn_types, label in (('mala', 'all-MALA'), (('mala', 'mala', 'softmax', 'softmax'), 'released')):
        model = MALA(arch='tiny', attn_types=attn_types).to(device).eval()
        for side in args.scaling_sides:
            ms = time_ms(lambda: step(model, torch.randn(1, 3, side, side, device=device), False), device,
                         warmup=1, repeats=2)
            rows.append(dict(model=f'MALA-T {label}', side=side, megapixels=side * side / 1e6, ms=ms,
                             ms_per_megapixel=ms / (side * side / 1e6)))
            print(rows[-1], flush=True)
    return rows


def plot_scaling(rows, path, device):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for label in dict.fromkeys(r['model'] for r in rows):
        pts = [(r['megapixels'], r['ms']) for r in rows if r['model'] == label]
        ax.plot(*zip(*pts), '-o', label=label)
    ax.set(xlabel='megapixels (square input)', ylabel='eval forward, ms',
           title=f'MALA-T cost vs pixels ({device.type})')
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--variants', nargs='+', default=['tiny', 'small', 'base', 'large'])
    parser.add_argument('--dtype', choices=['fp32', 'bf16'], default='fp32', help='bf16 runs under autocast')
    parser.add_argument('--scaling-sides', type=int, nargs='*', default=[256, 512, 1024, 1536, 2048],
                        help='square input sides of the cost-vs-pixels curve; none skips it')
    parser.add_argument('--no-swin', dest='swin', action='store_false')
    parser.add_argument('--compile', action='store_true', help='also measure MALA(compile=True)')
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == 'bf16' else torch.float32

    rows = compare(args, device, dtype)
    columns = ['variant', 'input', 'mode', 'ours img/s', 'baseline img/s', 'speed-up', 'ours MiB', 'baseline MiB',
               'memory saving', 'Swin-T img/s', 'Swin-T MiB', 'ours/Swin-T speed', 'compiled img/s', 'compiled MiB',
               'compiled/eager']
    scale_rows = scaling(args, device, dtype) if args.scaling_sides else []
    table = markdown_table(rows, columns)
    if scale_rows:
        table += '\n\n' + markdown_table(scale_rows, ['model', 'side', 'megapixels', 'ms', 'ms_per_megapixel'])
    name = f'backbone_{args.dtype}' + ('_compiled' if args.compile else '')
    folder = write_results(name, device, rows + scale_rows, table)
    if scale_rows:
        plot_scaling(scale_rows, os.path.join(folder, f'{name}_scaling.png'), device)
    print(table)
    print(f'written to {folder}')


if __name__ == '__main__':
    main()
