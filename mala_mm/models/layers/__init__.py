from .attention import (GatedAttention, MALAttention, QKVOProjection, SoftmaxAttention, mala_attention,
                        softmax_attention)
from .blocks import (ATTENTION_KINDS, ConvDownsample, ConvFFN, ConvStem, LayerNorm2d, MALABlock, MALAStage,
                     ResidualDWConv)
from .rope import RoPE2d, RotaryTables, apply_rope, rope_head_dims

__all__ = [
    'ATTENTION_KINDS', 'GatedAttention', 'MALAttention', 'QKVOProjection', 'SoftmaxAttention',
    'mala_attention', 'softmax_attention', 'ConvDownsample', 'ConvFFN', 'ConvStem', 'LayerNorm2d', 'MALABlock',
    'MALAStage', 'ResidualDWConv', 'RoPE2d', 'RotaryTables', 'apply_rope', 'rope_head_dims'
]
