"""Unusual images: one-pixel images run through the built-in detector and segmentor; an empty image file in a
dataset stops the tools before the run with its name, a corrupt one stops the run naming it."""
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.registry import DefaultScope

from mala_mm.datasets import BuiltinDatasetParams, generate_builtin_dataset
from mala_tools.checks.data_paths import EmptyDataFileError, check_data_paths, empty_data_files
from mala_tools.model import build_model
from tests.helpers import ROOT, call_tool, load_config

DET_CONFIG = osp.join(ROOT, 'configs/detection/mask_rcnn_mala_t_builtin.py')
SEG_CONFIG = osp.join(ROOT, 'configs/segmentation/upernet_mala_t_builtin.py')
TINY_SIZES = [(1, 1), (1, 7), (7, 1)]


@pytest.fixture(scope='module')
def detector():
    return build_model(load_config(DET_CONFIG))


@pytest.fixture(scope='module')
def segmentor():
    return build_model(load_config(SEG_CONFIG))


def _image(height, width):
    return np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)


@pytest.mark.parametrize('height, width', TINY_SIZES)
def test_tiny_image_through_the_detector(detector, height, width):
    from mmdet.apis import inference_detector
    with DefaultScope.overwrite_default_scope('mmdet'):  # the test pipeline is built from the current scope
        result = inference_detector(detector, _image(height, width))
    instances = result.pred_instances
    assert result.ori_shape == (height, width)
    assert len(instances) <= detector.cfg.model.test_cfg.rcnn.max_per_img
    assert instances.masks.shape == (len(instances), height, width)
    boxes = instances.bboxes
    assert torch.isfinite(boxes).all()
    assert (boxes[:, 0::2] >= 0).all() and (boxes[:, 0::2] <= width).all()
    assert (boxes[:, 1::2] >= 0).all() and (boxes[:, 1::2] <= height).all()


@pytest.mark.parametrize('height, width', TINY_SIZES)
def test_tiny_image_through_the_segmentor(segmentor, height, width):
    from mmseg.apis import inference_model
    with DefaultScope.overwrite_default_scope('mmseg'):
        result = inference_model(segmentor, _image(height, width))
    num_classes = segmentor.decode_head.num_classes
    assert result.pred_sem_seg.data.shape == (1, height, width)
    assert result.seg_logits.data.shape == (num_classes, height, width)
    assert torch.isfinite(result.seg_logits.data).all()
    assert 0 <= result.pred_sem_seg.data.min() and result.pred_sem_seg.data.max() < num_classes


@pytest.fixture
def builtin_dataset(tmp_path):
    """A working directory with a small built-in dataset where the configs look for it."""
    generate_builtin_dataset(str(tmp_path / 'data/builtin'), BuiltinDatasetParams(num_train=2, num_val=2))
    return tmp_path


def test_empty_image_stops_the_tool_before_the_run(builtin_dataset):
    (builtin_dataset / 'data/builtin/images/validation/000001.jpg').write_bytes(b'')
    (builtin_dataset / 'model.pth').write_bytes(b'')  # never read: the data check comes first
    result = call_tool(['test.py', DET_CONFIG, 'model.pth'], cwd=builtin_dataset)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith('error: ')]
    assert errors == [
        "error: empty files in the dataset under 'data/builtin/': data/builtin/images/validation/000001.jpg (a "
        "download or copy that stopped part way leaves these). To fix it, generate it again with: "
        "python tools/make_builtin_dataset.py --out data/builtin --force"]
    assert 'Traceback' not in result.stderr


def test_empty_label_map_is_found(builtin_dataset, monkeypatch):
    monkeypatch.chdir(builtin_dataset)
    (builtin_dataset / 'data/builtin/annotations/training/000000.png').write_bytes(b'')
    cfg = load_config(SEG_CONFIG)
    with pytest.raises(EmptyDataFileError, match=r'data/builtin/annotations/training/000000\.png'):
        check_data_paths(cfg, ('train_dataloader', 'val_dataloader'))
    check_data_paths(cfg, ('val_dataloader', ))  # the validation split is whole


def test_folders_beyond_the_scan_limit_are_not_searched_for_empty_files(builtin_dataset, monkeypatch):
    # COCO's 123k images would cost a size lookup each at every start; annotation files are always checked
    monkeypatch.chdir(builtin_dataset)
    (builtin_dataset / 'data/builtin/annotations/training/000000.png').write_bytes(b'')
    cfg = load_config(SEG_CONFIG)
    loaders = ('train_dataloader', )
    assert empty_data_files(cfg, loaders, limit=4) == ['data/builtin/annotations/training/000000.png']
    assert empty_data_files(cfg, loaders, limit=3) == []
    (builtin_dataset / 'data/builtin/annotations/instances_val.json').write_bytes(b'')
    det_cfg = load_config(DET_CONFIG)
    assert empty_data_files(det_cfg, ('val_dataloader', ), limit=0) == ['data/builtin/annotations/instances_val.json']


def test_corrupt_image_is_named(builtin_dataset):
    # not empty, so it passes the size check; the image loader names it when it cannot decode it
    (builtin_dataset / 'data/builtin/images/validation/000000.jpg').write_bytes(b'not an image' * 100)
    torch.save({'state_dict': {}}, builtin_dataset / 'model.pth')
    result = call_tool(['test.py', DET_CONFIG, 'model.pth'], cwd=builtin_dataset)
    assert result.returncode != 0
    assert 'failed to load image: data/builtin/images/validation/000000.jpg' in result.stderr
