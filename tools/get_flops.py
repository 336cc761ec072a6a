"""Print the parameters and FLOPs of a detection or segmentation config's model.

FLOPs are counted the paper's way (:mod:`mala_tools.analysis.flops`): multiply-accumulates of convolutions, linear
layers and matrix products (the attention matmuls and fused scaled-dot-product attention included) divided by
2^30. What runs is the model's ``mode='tensor'`` forward on one random image: backbone, neck and heads without
post-processing. For two-stage detectors that includes the RPN's proposals and the RoI heads on them; RoIAlign,
NMS and element-wise operations are not counted.

Example:
    python tools/get_flops.py configs/detection/mask_rcnn_mala_s.py --shape 800 1280
"""
import argparse

from mala_tools.analysis.flops import count_model_macs
from mala_tools.config import read_config
from mala_tools.errors import tool_main
from mala_tools.model import build_model

# the paper's input sizes (H, W)
DEFAULT_SHAPES = {'mmdet': (800, 1280), 'mmseg': (512, 2048)}
GIGA = 2**30


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('config', help='an mmdet or mmseg config file')
    parser.add_argument('--shape', type=int, nargs=2, metavar=('H', 'W'),
                        help='input height and width (default: 800 1280 for detection, 512 2048 for '
                             'segmentation)')
    return parser.parse_args()


def main():
    args = parse_args()
    cfg = read_config(args.config)
    model = build_model(cfg)
    scope = cfg.default_scope
    height, width = args.shape or DEFAULT_SHAPES[scope]
    count = count_model_macs(model, scope, height, width)
    params = sum(p.numel() for p in model.parameters())

    print(f'config: {args.config} ({type(model).__name__}, {scope})')
    print(f'input shape: 1x3x{height}x{width}')
    print(f'params: {params} ({params / 1e6:.2f} M)')
    print(f'FLOPs: {count.total / GIGA:.2f} G (multiply-accumulates / 2^30 of convolutions, linear layers and '
          f'matmuls, attention included)')
    print(f'  of which attention matmuls (bmm, SDPA): {count.attention / GIGA:.2f} G')
    print("  counted: the mode='tensor' forward (backbone, neck, heads; no post-processing, RoIAlign, NMS "
          'or element-wise ops)')
    for name, num_rois in count.roi_counts:
        print(f'  RoI head input counted: {name} on {num_rois} RoIs')


if __name__ == '__main__':
    tool_main(main)
