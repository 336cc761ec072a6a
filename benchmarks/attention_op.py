"""The attention operator alone: MALA vs softmax attention (SDPA) vs plain linear attention.

Time and peak memory, forward and forward+backward, fp32 and bf16, over the token counts of detection and
segmentation stages. Prints a Markdown table with ratio columns and writes results/<device>/attention_op.{md,json,png}.

    python -m benchmarks.attention_op [--device cuda] [--sides 32 64 128 256 512] [--head-dims 32 64]
"""
import argparse
import os

import torch

from mala_mm.models.layers import RoPE2d
from mala_mm.ops import OPERATORS, TRITON_AVAILABLE
from mala_mm.ops.mala_attention import mala_attention
from mala_mm.ops.softmax_attention import softmax_attention
from mala_tools.analysis.baselines import linear_attention

from .common import markdown_table, peak_mib, time_ms, write_results

KINDS = {'mala': mala_attention, 'softmax': softmax_attention, 'linear': linear_attention}
if TRITON_AVAILABLE:  # measured where asked for by name (gpu_check.py's attention phase)
    KINDS_BY_NAME = {**KINDS, 'mala triton': OPERATORS['mala_attention'].triton}
else:
    KINDS_BY_NAME = KINDS
DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16}


def measure(kind, height, width, head_dims, dtype, heads, device, backward):
    """Median ms and peak MiB of one ``kind`` attention over a height x width token map, forward (and backward)."""
    rope = RoPE2d(head_dims).to(device).tables(height, width, dtype=dtype)
    qkv = [torch.randn(1, heads, height * width, head_dims, device=device, dtype=dtype, requires_grad=backward)
           for _ in range(3)]

    def run():
        out = KINDS_BY_NAME[kind](*qkv, rope)
        if backward:
            out.float().square().mean().backward()
    return time_ms(run, device, warmup=1, budget_s=10), peak_mib(run, device)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--sides', type=int, nargs='+', default=[32, 64, 128, 256, 512])
    parser.add_argument('--head-dims', type=int, nargs='+', default=[32, 64])
    parser.add_argument('--dtypes', nargs='+', default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument('--heads', type=int, default=4)
    parser.add_argument('--max-softmax-tokens', type=int, default=None,
                        help='skip softmax above this many tokens (default: 128^2 on CPU, no limit on GPU)')
    args = parser.parse_args()
    device = torch.device(args.device)
    max_softmax = args.max_softmax_tokens or (float('inf') if device.type == 'cuda' else 128 ** 2)

    rows = []
    for dtype_name in args.dtypes:
        for head_dims in args.head_dims:
            for side in args.sides:
                row = dict(dtype=dtype_name, d=head_dims, tokens=f'{side}^2')
                for kind in KINDS:
                    if kind == 'softmax' and side * side > max_softmax:
                        continue
                    for backward, tag in ((False, 'fwd'), (True, 'fwd+bwd')):
                        ms, mib = measure(kind, side, side, head_dims, DTYPES[dtype_name], args.heads, device,
                                          backward)
                        row[f'{kind} {tag} ms'], row[f'{kind} {tag} MiB'] = ms, mib
                for tag in ('fwd', 'fwd+bwd'):
                    for other in ('softmax', 'linear'):
                        if f'{other} {tag} ms' in row:
                            row[f'{other}/mala {tag} time'] = row[f'{other} {tag} ms'] / row[f'mala {tag} ms']
                    if f'softmax {tag} MiB' in row:
                        row[f'softmax/mala {tag} mem'] = row[f'softmax {tag} MiB'] / max(row[f'mala {tag} MiB'], 1e-9)
                rows.append(row)
                print(row, flush=True)

    columns = ['dtype', 'd', 'tokens']
    for tag in ('fwd', 'fwd+bwd'):
        columns += [f'mala {tag} ms', f'softmax {tag} ms', f'linear {tag} ms', f'softmax/mala {tag} time',
                    f'linear/mala {tag} time', f'mala {tag} MiB', f'softmax {tag} MiB', f'softmax/mala {tag} mem']
    table = markdown_table(rows, columns)
    folder = write_results('attention_op', device, rows, table)
    plot(rows, args, os.path.join(folder, 'attention_op.png'), device)
    print(table)
    print(f'written to {folder}')


def plot(rows, args, path, device):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, len(args.dtypes), figsize=(6 * len(args.dtypes), 8), squeeze=False)
    for col, dtype_name in enumerate(args.dtypes):
        for metric, ax in zip(('fwd+bwd ms', 'fwd+bwd MiB'), axes[:, col]):
            for kind, style in zip(KINDS, ('-o', '-s', '-^')):
                for head_dims, alpha in zip(args.head_dims, (1.0, 0.5)):
                    pts = [(int(r['tokens'].split('^')[0]) ** 2, r[f'{kind} {metric}']) for r in rows
                           if r['dtype'] == dtype_name and r['d'] == head_dims and f'{kind} {metric}' in r]
                    if pts:
                        ax.plot(*zip(*pts), style, alpha=alpha, label=f'{kind}, d={head_dims}')
            ax.set(xscale='log', yscale='log', xlabel='tokens N', ylabel=metric,
                   title=f'{dtype_name}, {args.heads} heads, {device.type}')
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == '__main__':
    main()
