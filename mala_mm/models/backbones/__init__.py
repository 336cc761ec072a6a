from .mala import MALA
from .mala_arguments import MALAConfigError

__all__ = ['MALA', 'MALAConfigError']
