"""The built-in shapes dataset: deterministic, valid COCO / ADE20K-layout files that the upstream dataset
classes read with the classes the configs declare."""
import filecmp
import importlib
import json
import os
import os.path as osp

import cv2
import numpy as np
import pytest
from mmengine.registry import init_default_scope
from pycocotools.coco import COCO

from mala_mm.datasets import CLASSES, SEG_CLASSES, BuiltinDatasetParams, generate_builtin_dataset, read_params
from tests.helpers import ROOT, load_config

DET_CONFIG = osp.join(ROOT, 'configs/detection/mask_rcnn_mala_t_builtin.py')
SEG_CONFIG = osp.join(ROOT, 'configs/segmentation/upernet_mala_t_builtin.py')
SMALL = BuiltinDatasetParams(seed=3, image_size=96, num_train=6, num_val=3)


@pytest.fixture(scope='module')
def dataset_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('builtin'))
    assert generate_builtin_dataset(root, SMALL)
    return root


def _all_files(root):
    return sorted(osp.relpath(osp.join(d, f), root) for d, _, files in os.walk(root) for f in files)


def test_generation_is_deterministic_and_idempotent(dataset_root, tmp_path):
    again = str(tmp_path / 'again')
    assert generate_builtin_dataset(again, SMALL)
    files = _all_files(dataset_root)
    assert files == _all_files(again)
    _, mismatch, errors = filecmp.cmpfiles(dataset_root, again, files, shallow=False)
    assert not mismatch and not errors
    mtimes = {f: os.stat(osp.join(again, f)).st_mtime_ns for f in files}
    assert not generate_builtin_dataset(again, SMALL)  # up to date: nothing rewritten
    assert mtimes == {f: os.stat(osp.join(again, f)).st_mtime_ns for f in files}
    # other parameters replace the folder's content
    other = BuiltinDatasetParams(seed=4, image_size=96, num_train=2, num_val=1)
    assert generate_builtin_dataset(again, other)
    assert read_params(again)['seed'] == 4
    assert len(os.listdir(osp.join(again, 'images', 'training'))) == 2


def test_refuses_to_overwrite_a_foreign_folder(tmp_path):
    (tmp_path / 'mine.txt').write_text('not a dataset')
    with pytest.raises(FileExistsError, match='holds no built-in dataset'):
        generate_builtin_dataset(str(tmp_path), SMALL)
    assert (tmp_path / 'mine.txt').exists()


@pytest.mark.parametrize('split,count', [('train', SMALL.num_train), ('val', SMALL.num_val)])
def test_coco_annotations_are_valid_and_masks_match_boxes(dataset_root, split, count):
    coco = COCO(osp.join(dataset_root, 'annotations', f'instances_{split}.json'))
    assert [c['name'] for c in coco.loadCats(coco.getCatIds())] == list(CLASSES)
    assert len(coco.getImgIds()) == count
    assert len(coco.getAnnIds()) >= count  # at least one shape per image
    ade_split = {'train': 'training', 'val': 'validation'}[split]
    for ann in coco.loadAnns(coco.getAnnIds()):
        image = coco.loadImgs(ann['image_id'])[0]
        assert osp.isfile(osp.join(dataset_root, 'images', ade_split, image['file_name']))
        assert ann['iscrowd'] == 0 and isinstance(ann['segmentation'], list)
        mask = coco.annToMask(ann).astype(bool)
        ys, xs = np.nonzero(mask)
        x, y, w, h = ann['bbox']
        assert (x, y, x + w, y + h) == (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
        assert ann['area'] == mask.sum() > 100
        # the label map holds the same shape under the same class
        label_map = _read_label_map(dataset_root, ade_split, image['file_name'])
        assert (label_map[mask] == ann['category_id']).all()


def _read_label_map(root, ade_split, image_name):
    return cv2.imread(osp.join(root, 'annotations', ade_split, image_name.replace('.jpg', '.png')),
                      cv2.IMREAD_UNCHANGED)


def test_label_maps_cover_exactly_the_instances(dataset_root):
    with open(osp.join(dataset_root, 'annotations', 'instances_train.json')) as f:
        coco = json.load(f)
    for image in coco['images']:
        label_map = _read_label_map(dataset_root, 'training', image['file_name'])
        assert label_map.shape == (image['height'], image['width'])
        area = sum(a['area'] for a in coco['annotations'] if a['image_id'] == image['id'])
        assert (label_map > 0).sum() == area
        assert set(np.unique(label_map)) <= set(range(len(SEG_CLASSES)))


def _build_dataset(config, dataset_root, scope):
    """The config's training set, built by the library's own registry, read from ``dataset_root``."""
    cfg = load_config(config)
    cfg.train_dataloader.dataset.data_root = dataset_root
    init_default_scope(scope)
    return importlib.import_module(f'{scope}.registry').DATASETS.build(cfg.train_dataloader.dataset)


def test_loads_in_mmdet_coco_dataset(dataset_root):
    dataset = _build_dataset(DET_CONFIG, dataset_root, 'mmdet')
    assert dataset.metainfo['classes'] == CLASSES
    assert len(dataset) == SMALL.num_train
    sample = dataset[0]
    instances = sample['data_samples'].gt_instances
    assert len(instances) >= 1
    assert instances.masks.masks.shape[1:] == sample['inputs'].shape[1:]  # resized with the image
    assert int(instances.labels.max()) < len(CLASSES)


def test_loads_in_mmseg_dataset_with_the_right_classes(dataset_root):
    dataset = _build_dataset(SEG_CONFIG, dataset_root, 'mmseg')
    assert dataset.metainfo['classes'] == SEG_CLASSES
    assert len(dataset) == SMALL.num_train
    info = dataset.get_data_info(0)
    assert info['reduce_zero_label'] is False and info['label_map'] is None
    seg = dataset[0]['data_samples'].gt_sem_seg.data
    assert set(seg.unique().tolist()) <= set(range(len(SEG_CLASSES))) | {255}
    assert (seg > 0).any() and (seg == 0).any()


def test_configs_declare_the_generator_classes():
    det = load_config(DET_CONFIG)
    seg = load_config(SEG_CONFIG)
    assert tuple(det.train_dataloader.dataset.metainfo['classes']) == CLASSES
    assert tuple(seg.train_dataloader.dataset.metainfo['classes']) == SEG_CLASSES
    assert det.model.roi_head.bbox_head.num_classes == len(CLASSES)
    assert seg.model.decode_head.num_classes == len(SEG_CLASSES)
