"""The built-in shapes dataset and dataset path checks."""
from .builtin import (SEG_CLASSES, SEG_PALETTE, BuiltinDatasetParams, dataset_summary,
                      generate_builtin_dataset, read_params)
from .paths import (DatasetNotFoundError, EmptyDataFileError, check_data_paths, empty_data_files,
                    missing_data_paths)
from .shapes import CLASSES, PALETTE

__all__ = [
    'CLASSES', 'PALETTE', 'SEG_CLASSES', 'SEG_PALETTE', 'BuiltinDatasetParams', 'generate_builtin_dataset',
    'read_params', 'dataset_summary', 'DatasetNotFoundError', 'EmptyDataFileError', 'check_data_paths',
    'missing_data_paths', 'empty_data_files'
]
