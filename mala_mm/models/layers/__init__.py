from .attention import (GatedAttention, MALAttention, SoftmaxAttention, linear_attention, mala_attention,
                        softmax_attention)
from .blocks import ATTENTION_KINDS, ConvDownsample, ConvFFN, ConvStem, LayerNorm2d, MALABlock, MALAStage
from .rope import RoPE2d, apply_rope

__all__ = [
    'ATTENTION_KINDS', 'GatedAttention', 'MALAttention', 'SoftmaxAttention', 'linear_attention', 'mala_attention',
    'softmax_attention', 'ConvDownsample', 'ConvFFN', 'ConvStem', 'LayerNorm2d', 'MALABlock', 'MALAStage', 'RoPE2d',
    'apply_rope'
]
