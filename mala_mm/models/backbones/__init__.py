from .mala import MALA

__all__ = ['MALA']
