"""The built-in shapes dataset, and the loading step that skips undecodable images."""
from .builtin import (SEG_CLASSES, SEG_PALETTE, BuiltinDatasetParams, dataset_summary, generate_builtin_dataset,
                      read_params)
from .loading import LoadImageOrSkip, TooManyUndecodableImages, decode_problem
from .shapes import CLASSES, PALETTE

__all__ = [
    'CLASSES', 'PALETTE', 'SEG_CLASSES', 'SEG_PALETTE', 'BuiltinDatasetParams', 'generate_builtin_dataset',
    'read_params', 'dataset_summary', 'LoadImageOrSkip', 'TooManyUndecodableImages', 'decode_problem'
]
