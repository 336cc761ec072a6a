from .backbones import MALA, MALAConfigError
from .layers import MALAttention, SoftmaxAttention, mala_attention, softmax_attention

__all__ = ['MALA', 'MALAConfigError', 'MALAttention', 'SoftmaxAttention', 'mala_attention', 'softmax_attention']
