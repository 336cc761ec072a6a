"""The recipe check: every paper config trains its own row's recipe, and each fault that makes a config depart from
its row (in a copy of a paper config) is reported, with the line that says what it does."""
import pytest
import torch

import mala_mm  # noqa: F401  (registers MALA)
from mala_tools import recipe
from mala_tools.recipe import check_recipe, recipe_notice
from mala_tools.recipe.rows import paper_rows, row_config
from tests.helpers import CONFIG_ROOT, LEAF_CONFIGS, ROOT, call_tool, load_config

MASK_RCNN = CONFIG_ROOT / 'detection/mask_rcnn_mala_s.py'
MASK_RCNN_3X = CONFIG_ROOT / 'detection/mask_rcnn_mala_s_3x.py'
UPERNET = CONFIG_ROOT / 'segmentation/upernet_mala_s.py'


def test_the_rows_are_the_paper_configs():
    assert sorted(str(row.config.relative_to(CONFIG_ROOT)) for row in paper_rows()) == LEAF_CONFIGS
    assert len(LEAF_CONFIGS) == 22


@pytest.mark.slow  # 22 configs with their chains of bases: about a minute
@pytest.mark.parametrize('row', paper_rows(), ids=lambda row: row.name)
def test_each_paper_config_trains_its_own_row(row):
    """Each config, read once (a second read would parse the same file again), is found to be its own row's, and
    its facts as a config are the row's."""
    check = check_recipe(row_config(row))
    assert (check.row.name, check.differences) == (row.name, [])


def _only(check, *starts):
    """The check's differences, after asserting that each begins with one of ``starts``, and each of those begins
    one."""
    assert check is not None
    lines = check.differences
    assert all(line.startswith(starts) for line in lines), lines
    assert all(any(line.startswith(start) for line in lines) for start in starts), lines
    return lines


def _edited(path, edit):
    cfg = load_config(path)
    edit(cfg)
    return cfg


def _without(pipeline: list, kind: str) -> list:
    return [step for step in pipeline if step['type'] != kind]


def _own_paramwise_cfg(cfg):
    """A paramwise_cfg of one's own that replaces the row's (as ``_delete_=True`` in a config over it would),
    dropping its rule that exempts the norms from weight decay."""
    cfg.optim_wrapper.paramwise_cfg = dict(custom_keys={'neck': dict(decay_mult=0.5)})


def _no_hooks(cfg):
    for name in ('iteration_seed', 'sync_norm_stats', 'skipped_steps'):
        cfg.default_hooks.pop(name)


# each fault, made in a copy of a paper config, and the lines it must give (and no other)
FAULTS = {
    'the batch a GPU': (MASK_RCNN, lambda cfg: cfg.train_dataloader.update(batch_size=4), ['total batch: 32 images']),
    'the auto_scale_lr base': (UPERNET, lambda cfg: cfg.auto_scale_lr.update(base_batch_size=32),
                               ['auto_scale_lr.base_batch_size: 32 where upernet_mala_s has 16']),
    'a paramwise_cfg without the norm exemption': (MASK_RCNN, _own_paramwise_cfg, ['lr and decay multipliers: '] * 2),
    'BN for SyncBN': (UPERNET, lambda cfg: cfg.model.backbone.update(norm_cfg=dict(type='BN', requires_grad=True)),
                      ['norm layers of the backbone: ']),
    'no pretrained weights': (MASK_RCNN, lambda cfg: cfg.model.backbone.update(init_cfg=None),
                              ['backbone weights: none where mask_rcnn_mala_s loads mala_s_in1k.pth']),
    'the loss scale': (UPERNET, lambda cfg: cfg.optim_wrapper.update(loss_scale='dynamic'),
                       ['fp16 loss scale: dynamic where upernet_mala_s has 512']),
    'a longer schedule with the same milestones': (
        MASK_RCNN_3X, lambda cfg: (cfg.train_cfg.update(max_epochs=48), cfg.param_scheduler[1].update(end=48)),
        ['length: 48 epochs where mask_rcnn_mala_s_3x trains 36', 'lr schedule: ']),
    'no warm-up': (UPERNET, lambda cfg: cfg.update(param_scheduler=cfg.param_scheduler[1:]), ['lr schedule: x1 at']),
    'no flip': (MASK_RCNN, lambda cfg: cfg.train_dataloader.dataset.update(
        pipeline=_without(cfg.train_dataloader.dataset.pipeline, 'RandomFlip')), ['train pipeline: no RandomFlip']),
    'another crop': (UPERNET, lambda cfg: cfg.train_dataloader.dataset.pipeline[3].update(crop_size=(640, 640)),
                     ['train pipeline: RandomCrop(crop_size=[640, 640]']),
    'no save_best': (UPERNET, lambda cfg: cfg.default_hooks.checkpoint.update(save_best=None),
                     ['save_best: none where upernet_mala_s has mIoU']),
    'no hooks of ours': (MASK_RCNN, _no_hooks, ['no IterationSeedHook', 'no SyncNormStatsHook', 'no SkippedStepsHook']),
}


@pytest.mark.parametrize('fault', FAULTS)
def test_a_fault_is_reported_with_its_effect(fault):
    path, edit, starts = FAULTS[fault]
    lines = _only(check_recipe(_edited(path, edit)), *starts)
    assert len(lines) == len(starts), lines


def test_a_paramwise_cfg_without_the_norm_exemption_names_the_parameters_it_decays():
    lines = check_recipe(_edited(MASK_RCNN, _own_paramwise_cfg)).differences
    assert len(lines) == 2, lines
    assert 'norm' in lines[0] and lines[0].endswith('train at lr x1, weight decay x1 where mask_rcnn_mala_s has lr '
                                                    'x1, weight decay x0'), lines
    assert lines[1].startswith('lr and decay multipliers: 16 parameters (neck.lateral_convs.0.conv.weight, '
                               'neck.lateral_convs.0.conv.bias, ...) train at lr x1, weight decay x0.5'), lines


def test_the_schedule_says_where_the_lr_falls():
    cfg = _edited(MASK_RCNN_3X, lambda cfg: cfg.train_cfg.update(max_epochs=48))
    schedule = [line for line in check_recipe(cfg).differences if line.startswith('lr schedule')]
    assert schedule == ['lr schedule: x0.001 at the start, x1 at iteration 500, x0.1 at epoch 27 (56%), x0.01 at '
                        'epoch 33 (69%), x0.01 at the end (epoch 48) where mask_rcnn_mala_s_3x has x0.001 at the '
                        'start, x1 at iteration 500, x0.1 at epoch 27 (75%), x0.01 at epoch 33 (92%), x0.01 at the '
                        'end (epoch 36)']


def test_a_scaled_lr_for_another_batch_is_the_rows_per_image():
    """16 GPUs with auto_scale_lr on: twice the batch at twice the lr, which the check says once, in the batch
    line; the lr is not a difference."""
    cfg = _edited(UPERNET, lambda cfg: cfg.auto_scale_lr.update(enable=True))
    assert check_recipe(cfg, gpus=16).differences == [
        'total batch: 32 images (16 GPUs x 2) where upernet_mala_s trains 16 (8 x 2): the lr is 0.00012 for it; the '
        "paper's numbers were measured at 16"]
    assert check_recipe(cfg).differences == []


def test_a_config_of_the_3x_row_is_checked_against_it_not_the_1x_row():
    assert check_recipe(load_config(MASK_RCNN_3X)).row.name == 'mask_rcnn_mala_s_3x'
    check = check_recipe(load_config(MASK_RCNN_3X), row_name='mask_rcnn_mala_s')
    assert {line.split(':')[0] for line in check.differences} >= {'length', 'lr schedule', 'train pipeline'}


def test_the_backbone_keys_that_load_are_counted_where_the_weights_are_on_disk(tmp_path):
    """A file of MALA-S's weights without one stage's tensors: those are counted; the whole file: no line."""
    cfg = load_config(MASK_RCNN)
    backbone = mala_mm.MALA(arch='small')
    state = backbone.state_dict()
    whole, partial = tmp_path / 'whole.pth', tmp_path / 'partial.pth'
    torch.save(state, whole)
    torch.save({key: value for key, value in state.items() if not key.startswith('layers.3.')}, partial)
    cfg.model.backbone.init_cfg.checkpoint = str(whole)
    renamed = 'backbone weights: whole.pth where mask_rcnn_mala_s loads mala_s_in1k.pth'
    assert check_recipe(cfg).differences == [renamed]
    cfg.model.backbone.init_cfg.checkpoint = str(partial)
    missing = sum(key.startswith('layers.3.') for key in state)
    assert check_recipe(cfg).differences == [
        renamed.replace('whole', 'partial'),
        f"backbone weights: {missing} of the backbone's {len(state)} tensors are not in the file (or have other "
        'shapes) and keep their initialisation']


def test_the_command_exits_0_for_a_paper_config_and_2_with_the_lines_for_a_fault(tmp_path):
    done = call_tool(['check_recipe.py', str(UPERNET)], cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "trains upernet_mala_s's recipe on 8 GPUs" in done.stdout
    assert 'not on disk here' in done.stdout
    done = call_tool(['check_recipe.py', str(UPERNET), '--gpus', '4'], cwd=ROOT)
    assert done.returncode == 2
    assert '- total batch: 8 images (4 GPUs x 2) where upernet_mala_s trains 16 (8 x 2)' in done.stdout
    assert 'departs from upernet_mala_s on 4 GPUs in 1 way' in done.stderr


def test_the_command_names_the_rows_for_a_config_of_none():
    builtin = str(CONFIG_ROOT / 'detection/mask_rcnn_mala_t_builtin.py')
    done = call_tool(['check_recipe.py', builtin], cwd=ROOT)
    assert done.returncode == 2
    assert 'reproduces no paper row' in done.stderr and 'mask_rcnn_mala_t_3x' not in done.stderr
    assert 'mask_rcnn_mala_t,' in done.stderr
    assert recipe_notice(load_config(builtin), builtin, 2) is None


def test_a_check_that_fails_is_one_line_and_does_not_stop_the_run(monkeypatch):
    """A model of one's own that cannot be built on the meta device: train.py says the check did not run, and
    goes on to build it for real."""
    def cannot_build(*args, **kwargs):
        raise NotImplementedError('Cannot copy out of meta tensor; no data!\nmore')
    monkeypatch.setattr(recipe, 'check_recipe', cannot_build)
    assert recipe_notice(load_config(MASK_RCNN), 'mine.py', 8) == (
        'recipe: not checked against a paper row: NotImplementedError: Cannot copy out of meta tensor; no data!')


def test_train_prints_the_check_at_its_start():
    """tools/train.py in one process: the batch is 2 images where the row trains 16 (and on a CPU, which trains in
    fp32, the precision differs too); the run then stops at its pre-flight (no COCO here), after the check."""
    done = call_tool(['train.py', str(MASK_RCNN)], cwd=ROOT)
    assert done.returncode == 2
    on_cpu = not torch.cuda.is_available()
    ways = '2 ways' if on_cpu else '1 way'
    assert f'recipe: {MASK_RCNN} departs from mask_rcnn_mala_s on 1 GPU in {ways}' in done.stderr
    assert 'recipe: - total batch: 2 images (1 GPU x 2) where mask_rcnn_mala_s trains 16 (8 x 2)' in done.stderr
    assert ('recipe: - precision: fp32 where mask_rcnn_mala_s has float16 mixed precision' in done.stderr) == on_cpu
