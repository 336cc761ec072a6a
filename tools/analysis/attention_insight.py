"""Draw what a MALA block attends to, and how the three kinds of attention react to the query's magnitude.

For one image, stage, block and head, q and k are taken from the block's own projection (``attn.qkvo`` on the
block's normalised input). From the same q, k the score maps of MALA, plain linear attention and softmax
attention are computed with the package's attention functions: fed the identity matrix as values, each
returns its N x N score matrix (every kind is linear in v). Two PNGs are written:

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
import math
import os
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import cv2
import matplotlib
import matplotlib.ticker

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor  # noqa: E402

from mala_mm import MALA  # noqa: E402
from mala_mm.checkpoint import CheckpointError, load_backbone_weights  # noqa: E402
from mala_mm.cli import fail  # noqa: E402
from mala_mm.models.layers import RotaryTables, linear_attention, mala_attention, softmax_attention  # noqa: E402

KINDS = {'MALA': mala_attention, 'linear': linear_attention, 'softmax': softmax_attention}
# the configs' data_preprocessor (ImageNet statistics, RGB)
MEAN, STD = np.array([123.675, 116.28, 103.53]), np.array([58.395, 57.12, 57.375])
# softmax scores through the identity-matrix trick cost N^3; beyond this many tokens it takes minutes on a CPU
MAX_TOKENS = 4096


@dataclass
class BlockAttention:
    """What one attention module saw and produced on an image."""
    q: Tensor  # (B, h, N, d) raw projections, before φ and RoPE
    k: Tensor
    v: Tensor
    rope: RotaryTables  # the stage's (N, d) RoPE tables
    height: int  # the token map
    width: int
    qkvo: Tuple[Tensor, Tensor, Tensor, Tensor]  # the projection's (B, C, H, W) q, k, v, o
    output: Tensor  # (B, C, H, W) the module's output


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


def capture_block(backbone: MALA, images: Tensor, stage: int, block: int) -> BlockAttention:
    """Run ``backbone`` on ``images`` and record the q, k, v of ``layers[stage].blocks[block].attn``."""
    attn = backbone.layers[stage].blocks[block].attn
    seen = {}
    hooks = [attn.qkvo.register_forward_hook(lambda module, args, out: seen.update(qkvo=out)),
             attn.register_forward_hook(lambda module, args, out: seen.update(output=out))]
    try:
        with torch.no_grad():
            backbone(images)
    finally:
        for hook in hooks:
            hook.remove()
    q, k, v, o = seen['qkvo']
    height, width = q.shape[-2:]
    rope = backbone.layers[stage].RoPE.tables(height, width, dtype=q.dtype)
    return BlockAttention(attn.split_heads(q), attn.split_heads(k), attn.split_heads(v), rope, height, width,
                          (q, k, v, o), seen['output'])


def score_matrix(kind: str, q: Tensor, k: Tensor, rope: Optional[RotaryTables]) -> Tensor:
    """(..., N, N) scores of ``kind`` from (..., N, d) q, k: the attention of the identity matrix as values."""
    num_tokens = q.shape[-2]
    identity = torch.eye(num_tokens, dtype=q.dtype, device=q.device).expand(*q.shape[:-2], -1, -1)
    return KINDS[kind](q, k, identity, rope)


def scale_query(kind: str, q: Tensor, factor: float) -> Tensor:
    """The raw query whose feature is ``factor`` times q's: φ(q) for MALA and linear, q itself for softmax."""
    if kind == 'softmax':
        return q * factor
    scaled = factor * (F.elu(q) + 1)
    return torch.where(scaled > 1, scaled - 1, torch.log(scaled))  # φ^-1, φ(x) = x + 1 (x > 0), e^x (x <= 0)


def row_statistics(scores: Tensor) -> Dict[str, float]:
    """Mean over rows of N x max score and of the normalised entropy of the positive part of the row."""
    num_tokens = scores.shape[-1]
    positive = scores.clamp(min=0)
    p = positive / positive.sum(-1, keepdim=True).clamp(min=1e-30)
    entropy = -(p * torch.log(p.clamp(min=1e-30))).sum(-1) / math.log(num_tokens)
    return dict(max=float(num_tokens * scores.amax(-1).mean()), entropy=float(entropy.mean()))


def magnitude_curves(attention: BlockAttention, head: int, factors: Sequence[float]) -> Dict[str, dict]:
    """{kind: {'max': [...], 'entropy': [...]}} over ``factors`` for one head of ``attention``, without RoPE."""
    q, k = attention.q[:, head:head + 1], attention.k[:, head:head + 1]
    curves = {}
    for kind in KINDS:
        stats = [row_statistics(score_matrix(kind, scale_query(kind, q, f), k, None)) for f in factors]
        curves[kind] = {name: [s[name] for s in stats] for name in ('max', 'entropy')}
    return curves


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


def build_backbone(arch: str, checkpoint: Optional[str], seed: int) -> MALA:
    torch.manual_seed(seed)
    backbone = MALA(arch=arch)
    if checkpoint:
        try:
            load_backbone_weights(backbone, checkpoint)
        except (FileNotFoundError, CheckpointError) as err:
            fail(str(err))
    else:
        backbone.init_weights()
    return backbone.eval()


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
    backbone = build_backbone(args.arch, args.checkpoint, args.seed)
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
    main()
