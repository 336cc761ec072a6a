"""The released softmax stages' attention, three ways torch computes it: which is fastest for training.

At the token maps and heads of a variant's softmax stages for one input size, forward+backward of
``softmax(d^-1/2 q k^T) v``: as the backbone calls it (``scaled_dot_product_attention``, torch picks its fused
kernel), the same call held to SDPA's math backend, and the explicit matmul-softmax-matmul. Writes
results/<device>/softmax_kernels.{md,json}.

    python -m benchmarks.softmax_kernels [--device cuda] [--variant tiny] [--size 800 1280]
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from mala_mm import MALA
from mala_tools.reference import softmax_attention as explicit

from .common import markdown_table, peak_mib, time_ms, write_results


def sdpa_math(q, k, v):
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v)


WAYS = {'SDPA (as called)': F.scaled_dot_product_attention, 'SDPA math backend': sdpa_math, 'explicit': explicit}


def softmax_stages(variant: str, height: int, width: int):
    """(stage, heads, token map, head width) of each softmax stage of ``variant`` at an input of height x width."""
    arch = MALA.arch_zoo[variant]
    for index, kind in enumerate(MALA(arch=variant).attn_types):
        if kind == 'softmax':
            stride = 4 * 2**index
            heads = arch['num_heads'][index]
            yield index + 1, heads, (-(-height // stride), -(-width // stride)), arch['embed_dims'][index] // heads


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--variant', default='tiny')
    parser.add_argument('--size', type=int, nargs=2, default=[800, 1280], metavar=('H', 'W'))
    args = parser.parse_args()
    device = torch.device(args.device)
    rows = []
    for stage, heads, (height, width), head_dims in softmax_stages(args.variant, *args.size):
        row = dict(stage=stage, tokens=f'{height}x{width}', heads=heads, d=head_dims)
        qkv = [torch.randn(1, heads, height * width, head_dims, device=device, requires_grad=True) for _ in range(3)]
        grad = torch.randn(1, heads, height * width, head_dims, device=device)
        for name, attend in WAYS.items():
            def step():
                attend(*qkv).backward(grad)
            row[f'{name} ms'], row[f'{name} MiB'] = time_ms(step, device, warmup=1), peak_mib(step, device)
        row['fastest'] = min(WAYS, key=lambda name: row[f'{name} ms'])
        rows.append(row)
        print(row, flush=True)
    columns = ['stage', 'tokens', 'heads', 'd', *(f'{name} {unit}' for unit in ('ms', 'MiB') for name in WAYS),
               'fastest']
    table = markdown_table(rows, columns)
    folder = write_results('softmax_kernels', device, rows, table)
    print(table)
    print(f'written to {folder}')


if __name__ == '__main__':
    main()
