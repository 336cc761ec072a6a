"""The built-in shapes dataset: a small, seeded, generated set for instance and semantic segmentation.

One set of images carries two annotation views, in the layouts the upstream dataset classes read:

    <root>/images/{training,validation}/*.jpg
    <root>/annotations/instances_{train,val}.json     COCO: polygons, bbox, area, iscrowd (mmdet CocoDataset)
    <root>/annotations/{training,validation}/*.png    label maps in the ADE20K layout (mmseg BaseSegDataset)
    <root>/builtin_dataset.json                        the parameters it was generated with

Unlike ADE20K, label 0 of the maps is a class of its own, 'background', and not ignored: the maps are read
with ``reduce_zero_label=False`` and class i + 1 is ``CLASSES[i]``, so that mIoU also scores the background
and the predicted maps are complete pictures.
"""
import json
import os
import os.path as osp
import shutil
from dataclasses import asdict, dataclass
from typing import Dict, Optional

import cv2
import numpy as np
from pycocotools import mask as mask_utils

from .shapes import CLASSES, PALETTE, draw_scene

SEG_CLASSES = ('background', ) + CLASSES
SEG_PALETTE = [(0, 0, 0)] + PALETTE
MARKER = 'builtin_dataset.json'
FORMAT_VERSION = 5  # bump when the drawing changes, so that old folders are regenerated
SPLITS = {'train': 'training', 'val': 'validation'}


@dataclass(frozen=True)
class BuiltinDatasetParams:
    seed: int = 0
    image_size: int = 128
    num_train: int = 400
    num_val: int = 64
    max_objects: int = 3

    def as_record(self) -> dict:
        return dict(format_version=FORMAT_VERSION, **asdict(self))


def _coco_split(root: str, split: str, num_images: int, params: BuiltinDatasetParams) -> dict:
    ade_split = SPLITS[split]
    images, annotations = [], []
    for index in range(num_images):
        # one generator per image: a scene does not depend on how many scenes come before it
        rng = np.random.default_rng([params.seed, list(SPLITS).index(split), index])
        image, objects = draw_scene(rng, params.image_size, params.max_objects)
        name = f'{index:06d}'
        cv2.imwrite(osp.join(root, 'images', ade_split, name + '.jpg'), image, [cv2.IMWRITE_JPEG_QUALITY, 95])
        label_map = np.zeros(image.shape[:2], dtype=np.uint8)
        image_id = index + 1
        images.append(dict(id=image_id, file_name=name + '.jpg', height=image.shape[0], width=image.shape[1]))
        for obj in objects:
            label_map[obj['mask']] = obj['label'] + 1
            annotations.append(dict(
                id=len(annotations) + 1, image_id=image_id, category_id=obj['label'] + 1,
                segmentation=[obj['polygon'].ravel().tolist()],
                area=float(mask_utils.area(obj['rle'])),
                bbox=mask_utils.toBbox(obj['rle']).tolist(), iscrowd=0))
        cv2.imwrite(osp.join(root, 'annotations', ade_split, name + '.png'), label_map)
    categories = [dict(id=i + 1, name=name, supercategory='shape') for i, name in enumerate(CLASSES)]
    return dict(images=images, annotations=annotations, categories=categories)


def read_params(root: str) -> Optional[dict]:
    """The parameters ``root`` was generated with, or None if it holds no complete built-in dataset."""
    try:
        with open(osp.join(root, MARKER)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def generate_builtin_dataset(root: str, params: BuiltinDatasetParams = BuiltinDatasetParams(),
                             force: bool = False) -> bool:
    """Write the dataset to ``root`` unless it is already there with the same parameters.

    Returns whether anything was written. A folder generated with other parameters is replaced; a non-empty
    folder that this function did not write is refused (FileExistsError), since replacing it would delete it.
    """
    record = params.as_record()
    if not force and read_params(root) == record:
        return False
    if osp.isdir(root) and os.listdir(root):
        if read_params(root) is None and not osp.isdir(osp.join(root, 'images')):
            raise FileExistsError(f'{root!r} is not empty and holds no built-in dataset; choose another '
                                  f'folder or empty it first')
        for name in ('images', 'annotations'):  # only what this function writes
            shutil.rmtree(osp.join(root, name), ignore_errors=True)
        if osp.exists(osp.join(root, MARKER)):
            os.remove(osp.join(root, MARKER))
    for ade_split in SPLITS.values():
        os.makedirs(osp.join(root, 'images', ade_split), exist_ok=True)
        os.makedirs(osp.join(root, 'annotations', ade_split), exist_ok=True)
    for split, num_images in (('train', params.num_train), ('val', params.num_val)):
        coco = _coco_split(root, split, num_images, params)
        with open(osp.join(root, 'annotations', f'instances_{split}.json'), 'w') as f:
            json.dump(coco, f)
    # written last: its presence means the folder is complete
    with open(osp.join(root, MARKER), 'w') as f:
        json.dump(record, f, indent=1)
    return True


def dataset_summary(root: str) -> Dict[str, int]:
    """Image and instance counts per split, read back from the COCO files."""
    summary = {}
    for split in SPLITS:
        with open(osp.join(root, 'annotations', f'instances_{split}.json')) as f:
            coco = json.load(f)
        summary[f'{split}_images'] = len(coco['images'])
        summary[f'{split}_instances'] = len(coco['annotations'])
    return summary
