from .mala import MALA, MALAConfigError

__all__ = ['MALA', 'MALAConfigError']
