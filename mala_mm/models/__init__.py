from .backbones import MALA
from .layers import MALAttention, SoftmaxAttention, mala_attention, softmax_attention

__all__ = ['MALA', 'MALAttention', 'SoftmaxAttention', 'mala_attention', 'softmax_attention']
