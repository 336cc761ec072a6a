from .attention import (GatedAttention, MALAttention, QKVOProjection, SoftmaxAttention, linear_attention,
                        mala_attention, softmax_attention)
from .blocks import (ATTENTION_KINDS, ConvDownsample, ConvFFN, ConvStem, LayerNorm2d, MALABlock, MALAStage,
                     ResidualDWConv)
from .rope import RoPE2d, RotaryTables, apply_rope

__all__ = [
    'ATTENTION_KINDS', 'GatedAttention', 'MALAttention', 'QKVOProjection', 'SoftmaxAttention', 'linear_attention',
    'mala_attention', 'softmax_attention', 'ConvDownsample', 'ConvFFN', 'ConvStem', 'LayerNorm2d', 'MALABlock',
    'MALAStage', 'ResidualDWConv', 'RoPE2d', 'RotaryTables', 'apply_rope'
]
