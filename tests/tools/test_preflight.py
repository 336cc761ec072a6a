"""The pre-flight checks of a config for one's own data: heads whose num_classes does not fit the datasets' classes
are refused with the keys to set, evaluators' annotation files are checked like the datasets' files, and the
missing-dataset hint names every key that holds the dataset's location."""
import json
import shutil

import pytest

from mala_tools.checks.data_paths import DatasetNotFoundError, check_data_paths
from mala_tools.checks.head_classes import head_class_problems
from tests.helpers import BUILTIN_CONFIGS, CONFIG_ROOT, LEAF_CONFIGS, call_tool, load_config

ALL_LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')
FIVE = ['ant', 'bee', 'cicada', 'dragonfly', 'earwig']


def config(name, **options):
    cfg = load_config(str(CONFIG_ROOT / name))
    cfg.merge_from_dict(options)
    return cfg


@pytest.mark.parametrize('name', LEAF_CONFIGS + BUILTIN_CONFIGS)
def test_every_config_here_has_heads_that_fit_its_data(name):
    assert head_class_problems(config(name), ALL_LOADERS) == []


@pytest.mark.parametrize('name, heads', [
    ('detection/mask_rcnn_mala_s.py', ['model.roi_head.bbox_head', 'model.roi_head.mask_head']),
    ('detection/cascade_mask_rcnn_mala_s_3x.py', [
        'model.roi_head.bbox_head.0', 'model.roi_head.bbox_head.1', 'model.roi_head.bbox_head.2',
        'model.roi_head.mask_head']),
    ('detection/retinanet_mala_s.py', ['model.bbox_head']),
    ('segmentation/upernet_mala_s.py', ['model.decode_head', 'model.auxiliary_head']),
    ('segmentation/fpn_mala_s.py', ['model.decode_head']),
])
def test_five_classes_against_a_paper_configs_heads_names_every_head(name, heads):
    cfg = config(name, **{f'{loader}.dataset.metainfo': dict(classes=FIVE) for loader in ALL_LOADERS})
    default = 150 if name.startswith('segmentation') else 80
    problems = head_class_problems(cfg, ALL_LOADERS)
    assert len(problems) == 1, problems
    assert ('train_dataloader.dataset (its metainfo.classes) and val_dataloader.dataset (its metainfo.classes) and '
            'test_dataloader.dataset (its metainfo.classes) have 5 classes') in problems[0]
    assert f"but {', '.join(f'{head}.num_classes={default}' for head in heads)}. Set num_classes=5 in each" \
        in problems[0]
    # and with each head set, the config passes
    fixed = cfg.model
    for head in heads:
        node = fixed
        for part in head.split('.')[1:]:
            node = node[int(part)] if part.isdigit() else node[part]
        node['num_classes'] = 5
    assert head_class_problems(cfg, ALL_LOADERS) == []


def test_a_dataset_without_metainfo_counts_its_dataset_classes_classes():
    cfg = config('detection/mask_rcnn_mala_s.py', **{'model.roi_head.bbox_head.num_classes': 5,
                                                     'model.roi_head.mask_head.num_classes': 5})
    problems = head_class_problems(cfg, ('train_dataloader', ))
    assert problems == [
        "the model's heads do not fit the data: train_dataloader.dataset (CocoDataset's classes; a dataset of your "
        "own sets metainfo.classes) has 80 classes, but model.roi_head.bbox_head.num_classes=5, "
        "model.roi_head.mask_head.num_classes=5. Set num_classes=80 in each of them (a config for a dataset of "
        "your own: docs/custom_dataset.md)"]


def test_an_rpn_is_not_a_class_head():
    cfg = config('detection/mask_rcnn_mala_t_builtin.py')
    assert cfg.model.rpn_head.get('num_classes', 1) == 1
    cfg.model.rpn_head.num_classes = 1
    assert head_class_problems(cfg, ALL_LOADERS) == []


def test_wrapped_datasets_are_looked_through():
    cfg = config('detection/mask_rcnn_mala_t_builtin.py')
    cfg.train_dataloader.dataset = dict(type='RepeatDataset', times=2, dataset=dict(
        cfg.train_dataloader.dataset, metainfo=dict(classes=FIVE)))
    problems = head_class_problems(cfg, ALL_LOADERS)
    assert len(problems) == 1 and problems[0].startswith(
        "the model's heads do not fit the data: train_dataloader.dataset.dataset (its metainfo.classes) has 5")


def test_a_missing_evaluator_annotation_file_is_named(builtin_workspace, monkeypatch):
    monkeypatch.chdir(builtin_workspace)
    cfg = config('detection/mask_rcnn_mala_t_builtin.py')
    check_data_paths(cfg, ALL_LOADERS)  # the built-in dataset is whole
    cfg.val_evaluator.ann_file = 'data/builtin/annotations/instances_test.json'
    with pytest.raises(DatasetNotFoundError, match='missing data/builtin/annotations/instances_test.json'):
        check_data_paths(cfg, ('val_dataloader', ))
    check_data_paths(cfg, ('train_dataloader', ))  # the training loader has no evaluator


def test_the_data_root_hint_names_every_key_that_holds_the_location(tmp_path):
    cfg = config('detection/mask_rcnn_mala_s.py')
    with pytest.raises(DatasetNotFoundError) as raised:
        check_data_paths(cfg, ('train_dataloader', 'val_dataloader'))
    assert ('point the config at it: --cfg-options train_dataloader.dataset.data_root=PATH '
            'val_dataloader.dataset.data_root=PATH test_dataloader.dataset.data_root=PATH '
            'val_evaluator.ann_file=PATH/annotations/instances_val2017.json '
            'test_evaluator.ann_file=PATH/annotations/instances_val2017.json') in str(raised.value)


@pytest.mark.slow  # a training run with its evaluation
def test_the_hinted_options_point_the_tools_at_the_dataset(builtin_workspace, tmp_path):
    """The options of the hint, with PATH the dataset's folder, are all a run needs: a config that expects the
    built-in dataset under data/shapes/ trains and evaluates through them on a copy of it elsewhere."""
    elsewhere = tmp_path / 'elsewhere'
    shutil.copytree(builtin_workspace / 'data/builtin', elsewhere)
    config_path = tmp_path / 'shapes.py'
    config_path.write_text(
        f"_base_ = {str(CONFIG_ROOT / 'detection/mask_rcnn_mala_t_builtin.py')!r}\n"
        "dataset = dict(dataset=dict(data_root='data/shapes/'))\n"
        "train_dataloader, val_dataloader, test_dataloader = dataset, dataset, dataset\n"
        "val_evaluator = dict(ann_file='data/shapes/annotations/instances_val.json')\n"
        "test_evaluator = val_evaluator\n")
    result = call_tool(['train.py', str(config_path)], cwd=tmp_path)
    assert result.returncode == 2
    hint = result.stderr.split('--cfg-options ')[1].split(' (or, in a config')[0]
    assert hint.split() == [
        'train_dataloader.dataset.data_root=PATH', 'val_dataloader.dataset.data_root=PATH',
        'test_dataloader.dataset.data_root=PATH', 'val_evaluator.ann_file=PATH/annotations/instances_val.json',
        'test_evaluator.ann_file=PATH/annotations/instances_val.json']
    options = [option.replace('PATH', str(elsewhere)) for option in hint.split()]
    result = call_tool(['train.py', str(config_path), '--work-dir', str(tmp_path / 'run'), '--cfg-options',
                       *options, 'train_cfg.max_iters=2', 'train_cfg.val_interval=2'], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    scalars = [json.loads(line) for line in next((tmp_path / 'run').rglob('scalars.json')).open()]
    assert any('coco/bbox_mAP' in entry for entry in scalars)
