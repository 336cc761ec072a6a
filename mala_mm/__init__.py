"""MALA backbones for MMDetection and MMSegmentation.

Importing this package (e.g. through ``custom_imports=dict(imports=['mala_mm'])``) registers ``MALA`` in both
libraries' model registries.
"""
from .models import MALA
from .registry import register_in_downstream_registries

__version__ = '0.1.0'

register_in_downstream_registries(MALA)

__all__ = ['MALA', '__version__']
