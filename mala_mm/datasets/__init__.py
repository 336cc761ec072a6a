"""The built-in shapes dataset, dataset path checks and undecodable images."""
from .builtin import (SEG_CLASSES, SEG_PALETTE, BuiltinDatasetParams, dataset_summary,
                      generate_builtin_dataset, read_params)
from .integrity import (LoadImageOrSkip, TooManyUndecodableImages, decode_problem, split_image_paths,
                        undecodable_images)
from .paths import (DatasetNotFoundError, EmptyDataFileError, check_data_paths, empty_data_files,
                    missing_data_paths)
from .shapes import CLASSES, PALETTE

__all__ = [
    'CLASSES', 'PALETTE', 'SEG_CLASSES', 'SEG_PALETTE', 'BuiltinDatasetParams', 'generate_builtin_dataset',
    'read_params', 'dataset_summary', 'DatasetNotFoundError', 'EmptyDataFileError', 'check_data_paths',
    'missing_data_paths', 'empty_data_files', 'LoadImageOrSkip', 'TooManyUndecodableImages', 'decode_problem',
    'split_image_paths', 'undecodable_images'
]
