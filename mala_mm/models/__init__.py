from .backbones import MALA, MALAConfigError
from ..ops.attention import mala_attention, softmax_attention
from .layers import MALAttention, SoftmaxAttention

__all__ = ['MALA', 'MALAConfigError', 'MALAttention', 'SoftmaxAttention', 'mala_attention', 'softmax_attention']
