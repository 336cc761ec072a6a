"""MALA backbones for MMDetection and MMSegmentation.

Importing this package (e.g. through ``custom_imports=dict(imports=['mala_mm'])``) registers ``MALA`` in both
libraries' model registries and the training parts of :mod:`mala_mm.engine` in mmengine's, and makes
mmengine read checkpoints as data only (:func:`mala_mm.checkpoint.use_safe_loading`).
"""
from . import engine  # noqa: F401  (registers hooks and the CPU mixed-precision optim wrapper)
from .checkpoint import use_safe_loading
from .models import MALA
from .registry import register_in_downstream_registries

__version__ = '0.1.0'

register_in_downstream_registries(MALA)
use_safe_loading()

__all__ = ['MALA', '__version__']
