from .backbones import MALA, MALAConfigError
from .layers import MALAttention, SoftmaxAttention

__all__ = ['MALA', 'MALAConfigError', 'MALAttention', 'SoftmaxAttention']
