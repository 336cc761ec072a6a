"""MALA backbones for MMDetection and MMSegmentation.

``import mala_mm`` (e.g. through ``custom_imports=dict(imports=['mala_mm'])``) registers ``MALA`` in mmengine's
root model registry, where mmdet's and mmseg's find it, and changes nothing else in the process. The backbone's
``init_cfg`` reads its weights through :mod:`mala_mm.checkpoint` in any case; ``import mala_mm.safe_loading``
makes mmengine read every other checkpoint the same way. The rest is imported by what uses it: the training hooks
and the CPU mixed-precision optim wrapper (:mod:`mala_mm.engine`) by the configs here, through their
``custom_imports``, and by the tools; the datasets' parts (:mod:`mala_mm.datasets`) and ONNX export
(:mod:`mala_mm.export`) by the tools, whose own shared code (``tools/mala_tools``) is not part of this package.
"""
from .models import MALA
from .version import __version__

__all__ = ['MALA', '__version__']
