"""Importing this module makes mmengine read every checkpoint as data (:func:`mala_mm.checkpoint.use_safe_loading`).

A switch for the whole process, so it is never made by ``import mala_mm``; a config asks for it by naming this
module in its ``custom_imports`` (every config here does), and this package's tools make it themselves. With it,
mmdet's and mmseg's own ``test.py CHECKPOINT``, ``load_from``, ``--resume`` and inferencers load mmengine's
checkpoints under torch >= 2.6, whose ``weights_only`` default refuses their ``meta`` (HistoryBuffer, numpy).
"""
from .checkpoint import use_safe_loading

use_safe_loading()
