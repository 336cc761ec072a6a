"""docs/custom_dataset.md's two configs, as the page writes them, fine-tune MALA-S from ImageNet-format weights on
small datasets of their own classes (made here, in the page's layouts) through tools/train.py, and evaluate
through tools/test.py; the page's Python inference (mmdet's DetInferencer and init_detector /
inference_detector, mmseg's MMSegInferencer and init_model / inference_model) predicts on the trained checkpoints
what tools/test.py predicted."""
import json
import re
import shutil

import cv2
import mmengine
import numpy as np
import pytest
import torch
from mmengine.config import Config

from mala_mm import MALA
from tests.helpers import ROOT, run_tool

pytestmark = pytest.mark.slow

PAGE = f'{ROOT}/docs/custom_dataset.md'
DET_CONFIG = 'configs/detection/mask_rcnn_mala_s_bugs.py'
SEG_CONFIG = 'configs/segmentation/upernet_mala_s_leaves.py'
IMAGE_SIZE = (160, 120)  # width, height
SPLITS = dict(train=2, val=2)
# the training runs leave the evaluation to tools/test.py
NO_VALIDATION = ['val_cfg=None', 'val_dataloader=None', 'val_evaluator=None']


def page_configs() -> dict:
    """path -> source of each config block of the page, which names its path in its first line."""
    blocks = re.findall(r'```python\n(# (configs/\S+\.py)\n.*?)```', open(PAGE).read(), flags=re.S)
    return {path: source for source, path in blocks}


def rectangles(rng, count: int):
    """``count`` (x1, y1, x2, y2) boxes inside the image, at least 24 px on each side."""
    width, height = IMAGE_SIZE
    boxes = []
    for _ in range(count):
        x1, y1 = rng.integers(0, width - 40), rng.integers(0, height - 40)
        boxes.append((int(x1), int(y1), int(x1 + rng.integers(24, 40)), int(y1 + rng.integers(24, 40))))
    return boxes


def make_instance_dataset(root, classes, rng):
    """COCO-format JSON and JPEG images under ``root``, as the page lays them out."""
    for split, num_images in SPLITS.items():
        (root / f'images/{split}').mkdir(parents=True)
        images, annotations = [], []
        for index in range(num_images):
            image = np.full((IMAGE_SIZE[1], IMAGE_SIZE[0], 3), 90, np.uint8)
            for label, (x1, y1, x2, y2) in enumerate(rectangles(rng, 3)):
                category = (index + label) % len(classes)
                cv2.rectangle(image, (x1, y1), (x2, y2), tuple(int(c) for c in rng.integers(0, 255, 3)), -1)
                annotations.append(dict(
                    id=len(annotations) + 1, image_id=index + 1, category_id=category + 1, iscrowd=0,
                    bbox=[x1, y1, x2 - x1, y2 - y1], area=(x2 - x1) * (y2 - y1),
                    segmentation=[[x1, y1, x2, y1, x2, y2, x1, y2]]))
            name = f'{split}_{index}.jpg'
            cv2.imwrite(str(root / f'images/{split}' / name), image)
            images.append(dict(id=index + 1, file_name=name, width=IMAGE_SIZE[0], height=IMAGE_SIZE[1]))
        (root / 'annotations').mkdir(exist_ok=True)
        (root / f'annotations/{split}.json').write_text(json.dumps(dict(
            images=images, annotations=annotations,
            categories=[dict(id=i + 1, name=name) for i, name in enumerate(classes)])))


def make_semantic_dataset(root, classes, rng):
    """JPEG images and PNG label maps (values: class indices) under ``root``, as the page lays them out."""
    for split, num_images in SPLITS.items():
        (root / f'images/{split}').mkdir(parents=True)
        (root / f'annotations/{split}').mkdir(parents=True)
        for index in range(num_images):
            image = np.full((IMAGE_SIZE[1], IMAGE_SIZE[0], 3), 40, np.uint8)
            labels = np.zeros(image.shape[:2], np.uint8)
            for number, (x1, y1, x2, y2) in enumerate(rectangles(rng, 3)):
                label = 1 + number % (len(classes) - 1)
                cv2.rectangle(image, (x1, y1), (x2, y2), (60 * label, 200, 255 - 60 * label), -1)
                labels[y1:y2 + 1, x1:x2 + 1] = label
            cv2.imwrite(str(root / f'images/{split}/{index}.jpg'), image)
            cv2.imwrite(str(root / f'annotations/{split}/{index}.png'), labels)


@pytest.fixture(scope='module')
def workspace(tmp_path_factory):
    """A folder laid out as the page assumes: this repository's configs with the page's two beside them, the
    ImageNet weights of MALA-S where the configs expect them (the release's classification format, random
    values) and the two datasets."""
    root = tmp_path_factory.mktemp('custom')
    shutil.copytree(f'{ROOT}/configs', root / 'configs')
    configs = page_configs()
    assert sorted(configs) == sorted([DET_CONFIG, SEG_CONFIG])
    for path, source in configs.items():
        (root / path).write_text(source)
    (root / 'checkpoints').mkdir()
    backbone = {k: v for k, v in MALA(arch='small').state_dict().items() if not k.startswith('extra_norms.')}
    torch.save({'model': backbone, 'epoch': 299}, root / 'checkpoints/mala_s_in1k.pth')
    rng = np.random.default_rng(0)
    make_instance_dataset(root / 'data/bugs', Config.fromfile(str(root / DET_CONFIG)).classes, rng)
    make_semantic_dataset(root / 'data/leaves', Config.fromfile(str(root / SEG_CONFIG)).classes, rng)
    return root


def run(args, cwd):
    result = run_tool(args, cwd)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


@pytest.fixture(scope='module')
def detector(workspace):
    """The page's detector, fine-tuned for 1 epoch (1 iteration of 2 images) and tested as the page has it; its
    checkpoint and the predictions tools/test.py dumped."""
    # trained at a smaller scale than the page's, which the test below keeps: the suite's time
    run(['train.py', DET_CONFIG, '--cfg-options', 'train_cfg.max_epochs=1',
         'train_dataloader.dataset.pipeline.2.scale=(480,320)', *NO_VALIDATION], workspace)
    checkpoint = workspace / 'work_dirs/mask_rcnn_mala_s_bugs/epoch_1.pth'
    predictions = workspace / 'predictions.pkl'
    output = run(['test.py', DET_CONFIG, str(checkpoint), '--out', str(predictions)], workspace)
    assert re.search(r'coco/bbox_mAP: -?[0-9.]+', output) and re.search(r'coco/segm_mAP: -?[0-9.]+', output), \
        output[-3000:]
    return checkpoint, mmengine.load(str(predictions))


@pytest.fixture(scope='module')
def segmentor(workspace):
    run(['train.py', SEG_CONFIG, '--cfg-options', 'train_cfg.max_iters=2', *NO_VALIDATION,
         'train_dataloader.dataset.pipeline.3.crop_size=(256,256)', 'model.data_preprocessor.size=(256,256)'],
        workspace)  # crops smaller than the page's 512 x 512, which the test below keeps: the suite's time
    checkpoint = workspace / 'work_dirs/upernet_mala_s_leaves/iter_2.pth'
    label_maps = workspace / 'label_maps'
    output = run(['test.py', SEG_CONFIG, str(checkpoint), '--out', str(label_maps)], workspace)
    assert re.search(r'mIoU: [0-9.]+', output), output[-3000:]
    return checkpoint, label_maps


def test_the_pages_detector_trains_its_own_classes(workspace, detector):
    checkpoint, predictions = detector
    weights = torch.load(checkpoint, map_location='cpu', weights_only=False)['state_dict']
    classes = Config.fromfile(str(workspace / DET_CONFIG)).classes
    assert weights['roi_head.bbox_head.fc_cls.weight'].shape[0] == len(classes) + 1  # and background
    assert weights['roi_head.mask_head.conv_logits.weight'].shape[0] == len(classes)
    assert len(predictions) == SPLITS['val']
    labels = torch.cat([p['pred_instances']['labels'] for p in predictions])
    assert len(labels) and labels.max() < len(classes)


def test_the_pages_segmentor_trains_its_own_classes(workspace, segmentor):
    checkpoint, label_maps = segmentor
    weights = torch.load(checkpoint, map_location='cpu', weights_only=False)['state_dict']
    classes = Config.fromfile(str(workspace / SEG_CONFIG)).classes
    assert weights['decode_head.conv_seg.weight'].shape[0] == len(classes)
    assert weights['auxiliary_head.conv_seg.weight'].shape[0] == len(classes)
    maps = [cv2.imread(str(path), cv2.IMREAD_UNCHANGED) for path in sorted(label_maps.glob('*.png'))]
    assert len(maps) == SPLITS['val'] and all(m.shape == IMAGE_SIZE[::-1] and m.max() < len(classes) for m in maps)


def assert_same_instances(found, expected):
    """Boxes, scores and labels of two predictions of one image (tensors or lists) agree."""
    for key, tolerance in (('labels', 0), ('scores', 1e-4), ('bboxes', 1e-2)):
        torch.testing.assert_close(torch.as_tensor(found[key]).float(), torch.as_tensor(expected[key]).float(),
                                   rtol=0, atol=tolerance, msg=key)


def test_mmdets_inferencers_find_what_tools_test_found(workspace, detector, monkeypatch):
    from mmdet.apis import DetInferencer, inference_detector, init_detector
    monkeypatch.chdir(workspace)
    checkpoint, predictions = detector
    images = [p['img_path'] for p in predictions][:1]  # each inference of the page's MALA-S takes seconds
    inferencer = DetInferencer(model=DET_CONFIG, weights=str(checkpoint), device='cpu')
    results = inferencer(images, no_save_vis=True)['predictions']
    model = init_detector(DET_CONFIG, str(checkpoint), device='cpu')
    for image, expected, result in zip(images, predictions, results):
        assert set(result) >= {'labels', 'scores', 'bboxes', 'masks'}
        assert_same_instances(result, expected['pred_instances'])
        sample = inference_detector(model, image)
        assert sample.pred_instances.masks.shape[1:] == IMAGE_SIZE[::-1]
        assert_same_instances(sample.pred_instances, expected['pred_instances'])


def test_mmsegs_inferencers_find_what_tools_test_found(workspace, segmentor, monkeypatch):
    from mmseg.apis import MMSegInferencer, inference_model, init_model
    monkeypatch.chdir(workspace)
    checkpoint, label_maps = segmentor
    images = sorted(str(path) for path in (workspace / 'data/leaves/images/val').glob('*.jpg'))[:1]
    expected = [cv2.imread(str(label_maps / f'{index}.png'), cv2.IMREAD_UNCHANGED) for index in range(len(images))]
    inferencer = MMSegInferencer(model=SEG_CONFIG, weights=str(checkpoint), device='cpu')
    model = init_model(SEG_CONFIG, str(checkpoint), device='cpu')
    for image, label_map in zip(images, expected):
        prediction = inferencer(image)['predictions']
        assert prediction.shape == IMAGE_SIZE[::-1]
        np.testing.assert_array_equal(prediction, label_map)
        sample = inference_model(model, image)
        np.testing.assert_array_equal(sample.pred_sem_seg.data[0].numpy(), label_map)
