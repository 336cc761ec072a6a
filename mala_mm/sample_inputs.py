"""What a model's heads read about an image when no dataset pipeline made it: for running a model on random
images (FLOP counts, speed, export checks) and in tests."""
import importlib
from typing import List, Tuple

# the data sample class of each library: (module, class)
DATA_SAMPLE_CLASSES = {'mmdet': ('mmdet.structures', 'DetDataSample'),
                       'mmseg': ('mmseg.structures', 'SegDataSample')}


def image_metainfo(height: int, width: int) -> dict:
    """The metainfo of a (height, width) image that the pipeline neither resized nor padded."""
    size: Tuple[int, int] = (height, width)
    return dict(img_shape=size, ori_shape=size, pad_shape=size, batch_input_shape=size, scale_factor=(1.0, 1.0))


def data_samples(scope: str, height: int, width: int, count: int = 1) -> List:
    """``count`` data samples of library ``scope`` ('mmdet' or 'mmseg'), each with ``image_metainfo``."""
    module, name = DATA_SAMPLE_CLASSES[scope]
    sample_class = getattr(importlib.import_module(module), name)
    return [sample_class(metainfo=image_metainfo(height, width)) for _ in range(count)]
