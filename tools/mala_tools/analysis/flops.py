"""FLOPs counted the paper's way: multiply-accumulates of convolutions, linear layers and matrix products (the
attention matmuls and fused scaled-dot-product attention included). Of a detector or segmentor, what runs is its
``mode='tensor'`` forward on one random image: backbone, neck and heads without post-processing; for two-stage
detectors that includes the RPN's proposals and the RoI heads on them. RoIAlign, NMS and element-wise operations
are not counted."""
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from mala_mm.sample_inputs import data_samples


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


# FlopCounterMode knows the GPU kernels of scaled_dot_product_attention, not the one it runs on the CPU (torch 2.2
# and newer; torch 2.1 computes it on the CPU in the matmuls it counts)
try:
    _EXTRA_FLOP_FORMULAS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops}
except (AttributeError, RuntimeError):  # no such operator
    _EXTRA_FLOP_FORMULAS = {}


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


@dataclass
class ModelCount:
    """The multiply-accumulates of one forward of a detector or segmentor."""
    macs_per_op: Dict[str, int]
    # (name, number of RoIs) of every RoI feature extractor a two-stage detector ran
    roi_counts: List[Tuple[str, int]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.macs_per_op.values())

    @property
    def attention(self) -> int:
        return attention_macs(self.macs_per_op)


def count_model_macs(model: nn.Module, scope: str, height: int, width: int) -> ModelCount:
    """Count the ``mode='tensor'`` forward of ``model`` (of library ``scope``, 'mmdet' or 'mmseg') on one random
    (height, width) image, already normalised and padded."""
    hooks, roi_counts = [], []
    if scope == 'mmdet':
        from mmdet.models.roi_heads.roi_extractors import BaseRoIExtractor
        for name, module in model.named_modules():
            if isinstance(module, BaseRoIExtractor):
                hooks.append(module.register_forward_hook(
                    lambda mod, args, out, name=name: roi_counts.append((name, int(args[1].shape[0])))))
    image = torch.randn(1, 3, height, width)
    samples = data_samples(scope, height, width)
    try:
        macs = count_macs(lambda: model(image, samples, mode='tensor'))
    finally:
        for hook in hooks:
            hook.remove()
    return ModelCount(macs, roi_counts)
