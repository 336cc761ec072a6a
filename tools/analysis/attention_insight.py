"""Draw what a MALA block attends to, and how the three kinds of attention react to the query's magnitude.

For one image, stage, block and head, the score maps of MALA, plain linear attention and softmax attention are
computed from the block's own q and k (:mod:`mala_tools.analysis.attention_scores` says how). Two PNGs are written:

- ``*_scores.png``: the image with the query marked, and the three score maps of that query over the image;
- ``*_magnitude.png``: the paper's magnitude experiment. φ(q) is multiplied by a factor (q itself for softmax,
  which has no φ) and the max score and the entropy of the score rows, averaged over all queries, are plotted
  against it: softmax and MALA sharpen as the query grows, plain linear attention cannot. RoPE is left out
  here, so that every MALA and linear row sums to one and only the query's magnitude changes.

Scores are shown times N (1 = uniform). MALA's scores can be negative; the entropy uses the positive part of a
row, renormalised, divided by log N (1 = uniform; 0 for a row with no positive score).

Example:
    python tools/analysis/attention_insight.py data/builtin/images/training/000042.jpg --stage 0 --block 0 \\
        --query 64 40 --out-dir work_dirs/attention_insight [--arch small --checkpoint checkpoints/mala_s_in1k.pth]
"""
import argparse
import os
from typing import Dict, Optional, Sequence

import cv2
import matplotlib
import matplotlib.ticker

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from mala_mm.models import MALA  # noqa: E402
from mala_tools.analysis.attention_scores import (KINDS, BlockAttention, capture_block, magnitude_curves,  # noqa: E402
                                                  score_matrix)
from mala_tools.errors import fail, tool_main  # noqa: E402
from mala_tools.model import build_backbone  # noqa: E402

# the configs' data_preprocessor (ImageNet statistics, RGB)
MEAN, STD = np.array([123.675, 116.28, 103.53]), np.array([58.395, 57.12, 57.375])
# softmax scores through the identity-matrix trick cost N^3; beyond this many tokens it takes minutes on a CPU
MAX_TOKENS = 4096


def load_image(path: str, max_size: int) -> np.ndarray:
    """RGB uint8 image, shrunk so that its longer side is at most ``max_size``."""
    image = cv2.imread(path, cv2.IMREAD_COLOR)
    if image is None:
        fail(f'cannot read an image from {path!r}')
    scale = max_size / max(image.shape[:2])
    if scale < 1:
        image = cv2.resize(image, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def to_batch(image: np.ndarray) -> Tensor:
    return torch.from_numpy(((image - MEAN) / STD).astype(np.float32)).permute(2, 0, 1)[None]


def query_token(row: int, col: int, image_shape, attention: BlockAttention) -> int:
    """Index of the token whose cell holds pixel (row, col)."""
    height, width = image_shape[:2]
    if not (0 <= row < height and 0 <= col < width):
        fail(f'query ({row}, {col}) lies outside the {height}x{width} image')
    return (row * attention.height // height) * attention.width + col * attention.width // width


def draw_scores(image: np.ndarray, maps: Dict[str, np.ndarray], query_rc, title: str, path: str) -> None:
    """The image with the query marked, then one panel per score map (N x score, 1 = uniform) over it."""
    height, width = image.shape[:2]
    fig, axes = plt.subplots(1, len(maps) + 1, figsize=(3.2 * (len(maps) + 1), 3.6), layout='constrained')
    axes[0].imshow(image)
    axes[0].set_title('image and query')
    grey = image.mean(-1)
    for ax, (kind, scores) in zip(axes[1:], maps.items()):
        ax.imshow(grey, cmap='gray', extent=(0, width, height, 0))
        shown = ax.imshow(scores, cmap='viridis', alpha=0.75, interpolation='nearest',
                          extent=(0, width, height, 0))
        fig.colorbar(shown, ax=ax, orientation='horizontal', fraction=0.05, pad=0.02,
                     label='score × N (1 = uniform)')
        ax.set_title(f'{kind}: max {scores.max():.2f}, min {scores.min():.2f}')
    for ax in axes:
        ax.plot(query_rc[1], query_rc[0], marker='x', color='red', markersize=10, markeredgewidth=2.5)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def draw_magnitude(factors: Sequence[float], curves: Dict[str, dict], title: str, path: str) -> None:
    fig, (ax_max, ax_entropy) = plt.subplots(1, 2, figsize=(9, 3.6), layout='constrained')
    for kind, curve in curves.items():
        ax_max.plot(factors, curve['max'], marker='o', label=kind)
        ax_entropy.plot(factors, curve['entropy'], marker='o', label=kind)
    ax_max.set(ylabel='max score × N (1 = uniform)', title='peak of the score rows (mean over queries)')
    ax_entropy.set(ylabel='entropy / log N (1 = uniform)', title='spread of the score rows (mean over queries)')
    for ax in (ax_max, ax_entropy):
        ax.set_xscale('log', base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f'{x:g}'))
        ax.set_xlabel('scale of φ(q) (of q for softmax); RoPE left out')
        ax.axvline(1, color='grey', linestyle='--', linewidth=1)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def random_or_loaded_backbone(arch: str, checkpoint: Optional[str], seed: int) -> MALA:
    """MALA-``arch`` with ``checkpoint``'s weights, else initialised as the release does from ``seed``."""
    torch.manual_seed(seed)
    backbone = build_backbone(dict(type='MALA', arch=arch), checkpoint)
    if not checkpoint:
        backbone.init_weights()
    return backbone


def check_position(backbone: MALA, stage: int, block: int, head: int) -> None:
    if not 0 <= stage < len(backbone.layers):
        fail(f'--stage must be in [0, {len(backbone.layers)}), got {stage}')
    blocks = backbone.layers[stage].blocks
    if not 0 <= block < len(blocks):
        fail(f'stage {stage} has {len(blocks)} blocks; --block {block} is not one')
    if not 0 <= head < blocks[block].attn.num_heads:
        fail(f'stage {stage} has {blocks[block].attn.num_heads} heads; --head {head} is not one')


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('image', help='an image file')
    parser.add_argument('--arch', default='tiny', choices=['tiny', 'small', 'base', 'large'])
    parser.add_argument('--checkpoint', help='backbone weights (any format MALA loads); random weights if omitted')
    parser.add_argument('--stage', type=int, default=0, help='stage index, 0-3 (0 and 1 are MALA stages)')
    parser.add_argument('--block', type=int, default=0, help='block index within the stage')
    parser.add_argument('--head', type=int, default=0, help='attention head')
    parser.add_argument('--query', type=int, nargs=2, metavar=('ROW', 'COL'),
                        help='query pixel in the (resized) image; default: the centre')
    parser.add_argument('--max-size', type=int, default=160,
                        help='shrink the image to this longer side first (keeps the N x N maps small)')
    parser.add_argument('--factors', type=float, nargs='+', default=[2.0 ** e for e in np.arange(-3, 3.5, 0.5)],
                        help='query scale factors of the magnitude experiment')
    parser.add_argument('--seed', type=int, default=0, help='seed of the random weights')
    parser.add_argument('--out-dir', default='work_dirs/attention_insight')
    return parser.parse_args()


def main():
    args = parse_args()
    image = load_image(args.image, args.max_size)
    backbone = random_or_loaded_backbone(args.arch, args.checkpoint, args.seed)
    check_position(backbone, args.stage, args.block, args.head)
    attention = capture_block(backbone, to_batch(image), args.stage, args.block)
    num_tokens = attention.height * attention.width
    if num_tokens > MAX_TOKENS:
        fail(f'stage {args.stage} has {num_tokens} tokens on this image; use a smaller --max-size or a later stage '
             f'(at most {MAX_TOKENS} tokens)')
    row, col = args.query or (image.shape[0] // 2, image.shape[1] // 2)
    token = query_token(row, col, image.shape, attention)

    q, k = attention.q[:, args.head:args.head + 1], attention.k[:, args.head:args.head + 1]
    maps = {kind: num_tokens * score_matrix(kind, q, k, attention.rope)[0, 0, token].reshape(
        attention.height, attention.width).numpy() for kind in KINDS}
    curves = magnitude_curves(attention, args.head, args.factors)

    os.makedirs(args.out_dir, exist_ok=True)
    stem = (f'{os.path.splitext(os.path.basename(args.image))[0]}_{args.arch}'
            f'_stage{args.stage}_block{args.block}_head{args.head}')
    weights = os.path.basename(args.checkpoint) if args.checkpoint else f'random weights (seed {args.seed})'
    kind = backbone.attn_types[args.stage]
    where = (f'MALA-{args.arch[0].upper()}, {weights}; stage {args.stage} ({kind} block), block {args.block}, '
             f'head {args.head}; {attention.height}x{attention.width} tokens')
    scores_png, magnitude_png = (os.path.join(args.out_dir, f'{stem}_{name}.png') for name in ('scores', 'magnitude'))
    draw_scores(image, maps, (row, col), f'scores of the query at pixel ({row}, {col}) — {where}', scores_png)
    draw_magnitude(args.factors, curves, f'query magnitude — {where}', magnitude_png)
    for kind in KINDS:
        print(f'{kind:>8}: query max {maps[kind].max():.3f} x uniform; over all queries at factor '
              f'{args.factors[0]:g} -> {args.factors[-1]:g}: max {curves[kind]["max"][0]:.3f} -> '
              f'{curves[kind]["max"][-1]:.3f}, entropy {curves[kind]["entropy"][0]:.3f} -> '
              f'{curves[kind]["entropy"][-1]:.3f}')
    print(f'wrote {scores_png}\nwrote {magnitude_png}')


if __name__ == '__main__':
    tool_main(main)
