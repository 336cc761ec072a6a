"""Images that cannot be decoded, skipped during a run (:class:`LoadImageOrSkip`, the pipeline step that a config
puts in place of ``LoadImageFromFile``); tools/check_dataset.py finds them all before one."""
import os.path as osp
from typing import Dict, Optional

import cv2
import numpy as np
from mmcv.transforms import TRANSFORMS, LoadImageFromFile
from mmengine.logging import MMLogger


def decode_problem(path: str) -> Optional[str]:
    """Why the image at ``path`` cannot be decoded (as mmcv's cv2 backend decodes it), or None."""
    if not osp.isfile(path):
        return 'missing'
    if osp.getsize(path) == 0:
        return 'empty file'
    try:
        data = np.fromfile(path, dtype=np.uint8)
        image = cv2.imdecode(data, cv2.IMREAD_UNCHANGED)
    except (OSError, cv2.error) as err:
        return f'unreadable ({err})'
    return None if image is not None else f'not a decodable image ({osp.getsize(path)} bytes)'


class TooManyUndecodableImages(RuntimeError):
    """More images could not be decoded during training than the config allows."""


@TRANSFORMS.register_module()
class LoadImageOrSkip(LoadImageFromFile):
    """mmcv's ``LoadImageFromFile`` that skips an image it cannot decode, with a warning naming it.

    Returning None makes mmengine's dataset draw another sample in training. After ``max_skipped`` images in
    one data-loading process the run stops with the list of all of them. In a config, in place of
    ``LoadImageFromFile`` in the training pipeline: ``dict(type='LoadImageOrSkip', max_skipped=10)``, with
    ``mala_mm.datasets`` among the ``custom_imports`` (which registers it) for mmdet's and mmseg's own tools.

    Args:
        max_skipped: how many images one loading process may skip.
        **kwargs: ``LoadImageFromFile``'s arguments.
    """

    def __init__(self, max_skipped: int = 10, **kwargs):
        super().__init__(**kwargs)
        self.max_skipped = max_skipped
        self.skipped: Dict[str, str] = {}

    def transform(self, results: dict) -> Optional[dict]:
        path = results['img_path']
        try:
            loaded = super().transform(results)
        except Exception as err:  # mmcv raises what the file backend or the decoder raised, or an AssertionError
            reason = decode_problem(path) or f'{type(err).__name__}: {err}'
        else:
            return loaded
        self.skipped[path] = reason
        if len(self.skipped) > self.max_skipped:
            listing = '\n'.join(f'  {p}: {r}' for p, r in self.skipped.items())
            raise TooManyUndecodableImages(
                f'{len(self.skipped)} images could not be decoded, more than LoadImageOrSkip.max_skipped='
                f'{self.max_skipped}:\n{listing}\nFind them all with `python tools/check_dataset.py CONFIG`.')
        MMLogger.get_current_instance().warning(
            f'skipping undecodable image {path} ({reason}); {len(self.skipped)} of at most {self.max_skipped} '
            f'skipped in this loading process')
        return None
