from .attention import GatedAttention, MALAttention, QKVOProjection, SoftmaxAttention
from .blocks import (ATTENTION_KINDS, ConvDownsample, ConvFFN, ConvStem, LayerNorm2d, MALABlock, MALAStage,
                     ResidualDWConv)
from .conv import Conv2d
from .rope import RoPE2d, rope_head_dims

__all__ = [
    'ATTENTION_KINDS', 'Conv2d', 'ConvDownsample', 'ConvFFN', 'ConvStem', 'GatedAttention', 'LayerNorm2d', 'MALABlock',
    'MALAStage', 'MALAttention', 'QKVOProjection', 'ResidualDWConv', 'RoPE2d', 'SoftmaxAttention', 'rope_head_dims'
]
