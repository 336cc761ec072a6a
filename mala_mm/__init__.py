"""MALA backbones for MMDetection and MMSegmentation.

``import mala_mm`` (e.g. through ``custom_imports=dict(imports=['mala_mm'])``) is the model: it registers
``MALA`` in both libraries' model registries and makes mmengine read checkpoints as data only
(:func:`mala_mm.checkpoint.use_safe_loading`). The rest is imported by what uses it: the training hooks and the
CPU mixed-precision optim wrapper (:mod:`mala_mm.engine`) by the configs here, through their ``custom_imports``,
and by the tools; the datasets' parts (:mod:`mala_mm.datasets`), the command-line parts (:mod:`mala_mm.cli`) and
ONNX export (:mod:`mala_mm.export`) by the tools.
"""
from .checkpoint import use_safe_loading
from .models import MALA
from .registry import register_in_downstream_registries

__version__ = '0.1.0'

register_in_downstream_registries(MALA)
# Process-wide, and here rather than in mala_mm.engine, because loading the weights of a model with a MALA backbone
# is part of using it: upstream's test.py CHECKPOINT, load_from, --resume and DetInferencer all read checkpoints
# through mmengine, whose torch.load refuses mmengine's own checkpoints under torch >= 2.6's weights_only default
# (their meta holds HistoryBuffer and numpy objects). A config that imports only mala_mm has to load them too. It
# costs no import: the backbone's init_cfg loads through mala_mm.checkpoint, and mmengine.runner, whose loader this
# replaces, comes with the mmcv.cnn the model is built of.
use_safe_loading()

__all__ = ['MALA', '__version__']
