"""Print the parameters and FLOPs of a detection or segmentation config's model.

FLOPs are counted the paper's way: multiply-accumulates of convolutions, linear layers and matrix products
(the attention matmuls and fused scaled-dot-product attention included) divided by 2^30. What runs is the
model's ``mode='tensor'`` forward on one random image: backbone, neck and heads without post-processing. For
two-stage detectors that includes the RPN's proposals and the RoI heads on them; RoIAlign, NMS and
element-wise operations are not counted.

Example:
    python tools/get_flops.py configs/detection/mask_rcnn_mala_s.py --shape 800 1280
"""
import argparse
import importlib
from typing import Callable, Dict, List, Tuple

import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from mala_mm.cli import fail, read_config

# the paper's input sizes (H, W)
DEFAULT_SHAPES = {'mmdet': (800, 1280), 'mmseg': (512, 2048)}
GIGA = 2**30


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


# FlopCounterMode knows the GPU kernels of scaled_dot_product_attention, not the one it runs on the CPU
_EXTRA_FLOP_FORMULAS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops}


def count_macs(forward: Callable[[], object]) -> Dict[str, int]:
    """Run ``forward()`` and return its multiply-accumulates per aten op (e.g. 'aten.convolution')."""
    with FlopCounterMode(display=False, custom_mapping=_EXTRA_FLOP_FORMULAS) as counter:
        with torch.no_grad():
            forward()
    # FlopCounterMode counts 2 FLOPs per multiply-accumulate
    return {str(op): flops // 2 for op, flops in counter.get_flop_counts()['Global'].items()}


def attention_macs(macs_per_op: Dict[str, int]) -> int:
    """The batched matmuls and SDPA of ``count_macs``'s result: MALA's attention products."""
    return sum(macs for op, macs in macs_per_op.items() if op in ('aten.bmm', 'aten.baddbmm')
               or 'scaled_dot_product' in op)


def build_model(cfg: Config) -> Tuple[str, nn.Module]:
    """Build ``cfg.model`` in eval mode through the registry of the config's default_scope."""
    scope = cfg.get('default_scope')
    if scope not in DEFAULT_SHAPES:
        fail(f'default_scope must be one of {sorted(DEFAULT_SHAPES)} (an mmdet or mmseg config), got {scope!r}')
    init_default_scope(scope)
    models = importlib.import_module(f'{scope}.registry').MODELS
    return scope, models.build(cfg.model).eval()


def dummy_batch(scope: str, height: int, width: int) -> Tuple[torch.Tensor, list]:
    """One random image (already normalised and padded) and its data sample with the metainfo heads read."""
    size = (height, width)
    metainfo = dict(img_shape=size, ori_shape=size, pad_shape=size, batch_input_shape=size,
                    scale_factor=(1., 1.))
    if scope == 'mmdet':
        from mmdet.structures import DetDataSample as DataSample
    else:
        from mmseg.structures import SegDataSample as DataSample
    return torch.randn(1, 3, height, width), [DataSample(metainfo=metainfo)]


def record_roi_counts(model: nn.Module) -> List[Tuple[str, int]]:
    """Hook every RoI feature extractor of ``model``; returns the (name, number of RoIs) list it fills."""
    from mmdet.models.roi_heads.roi_extractors import BaseRoIExtractor
    seen = []
    for name, module in model.named_modules():
        if isinstance(module, BaseRoIExtractor):
            module.register_forward_hook(
                lambda mod, args, out, name=name: seen.append((name, int(args[1].shape[0]))))
    return seen


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
    scope, model = build_model(cfg)
    height, width = args.shape or DEFAULT_SHAPES[scope]
    inputs, data_samples = dummy_batch(scope, height, width)
    roi_counts = record_roi_counts(model) if scope == 'mmdet' else []

    macs = count_macs(lambda: model(inputs, data_samples, mode='tensor'))
    params = sum(p.numel() for p in model.parameters())
    total = sum(macs.values())

    print(f'config: {args.config} ({type(model).__name__}, {scope})')
    print(f'input shape: 1x3x{height}x{width}')
    print(f'params: {params} ({params / 1e6:.2f} M)')
    print(f'FLOPs: {total / GIGA:.2f} G (multiply-accumulates / 2^30 of convolutions, linear layers and '
          f'matmuls, attention included)')
    print(f'  of which attention matmuls (bmm, SDPA): {attention_macs(macs) / GIGA:.2f} G')
    print("  counted: the mode='tensor' forward (backbone, neck, heads; no post-processing, RoIAlign, NMS "
          'or element-wise ops)')
    for name, num_rois in roi_counts:
        print(f'  RoI head input counted: {name} on {num_rois} RoIs')


if __name__ == '__main__':
    main()
