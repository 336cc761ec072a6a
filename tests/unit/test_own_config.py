"""A user's own config: the README's patterns over mmdet's and mmseg's own bases train with the recipe of the
paper config for the same row, and a config over ours that sets its own custom_hooks keeps this project's hooks."""
import re
import warnings
from pathlib import Path

import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.runner import Runner

import mala_mm  # noqa: F401  (registers MALA)
from mala_tools.recipe import check_recipe
from tests.helpers import CONFIG_ROOT, ROOT, load_config

SECTION = '## Using MALA in your own config'
# the paper config for the row each README pattern stands for
ROWS = {'mmdet': 'detection/mask_rcnn_mala_s.py', 'mmseg': 'segmentation/upernet_mala_s.py'}
MALA_HOOKS = {'IterationSeedHook', 'SyncNormStatsHook', 'SkippedStepsHook'}


def readme_patterns() -> dict:
    """The config blocks of README.md's section on one's own config, by the library their ``_base_`` names."""
    text = Path(ROOT, 'README.md').read_text(encoding='utf-8')
    section = text[text.index(SECTION) + len(SECTION):]
    section = section[:section.index('\n## ')]
    blocks = re.findall(r'```python\n(.*?)```', section, re.S)
    return {re.match(r"_base_ = '(\w+)::", block).group(1): block for block in blocks}


@pytest.fixture(scope='module')
def own_configs(tmp_path_factory):
    folder = tmp_path_factory.mktemp('own')
    configs = {}
    for library, block in readme_patterns().items():
        (folder / f'{library}.py').write_text(block)
        configs[library] = Config.fromfile(folder / f'{library}.py')
    return configs


def test_the_readme_has_a_pattern_for_each_library(own_configs):
    assert set(own_configs) == set(ROWS)


@pytest.mark.parametrize('library', sorted(ROWS))
def test_a_readme_pattern_trains_its_rows_whole_recipe(own_configs, library):
    """The recipe check finds the row and no difference: batch and lr, optimizer and each parameter's multipliers,
    schedule, precision, backbone, pipelines, evaluation and checkpoints, this project's hooks."""
    check = check_recipe(own_configs[library])
    assert (check.row.config, check.differences) == (CONFIG_ROOT / ROWS[library], [])


@pytest.mark.parametrize('library', sorted(ROWS))
def test_a_readme_pattern_builds_mala_with_the_rows_backbone_and_no_deprecation(own_configs, library):
    cfg = own_configs[library]
    ours = load_config(CONFIG_ROOT / ROWS[library]).model.backbone
    assert {key: cfg.model.backbone[key] for key in ('type', 'arch', 'norm_cfg', 'init_cfg')} == {
        key: ours[key] for key in ('type', 'arch', 'norm_cfg', 'init_cfg')}
    assert cfg.model.get('pretrained') is None  # else mmseg hands the base's ResNet weights to MALA
    init_default_scope(library)
    registry = __import__(f'{library}.registry', fromlist=['MODELS']).MODELS
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        model = registry.build(cfg.model)
    assert (type(model.backbone).__name__, model.backbone.init_cfg) == ('MALA', ours.init_cfg)
    assert (tuple(model.backbone.out_indices), model.backbone.norm_eval) == (ours.out_indices, ours.norm_eval)
    assert not [w for w in caught if 'pretrained' in str(w.message)], [str(w.message) for w in caught]


@pytest.mark.parametrize('config', ['detection/mask_rcnn_mala_t_builtin.py', 'segmentation/upernet_mala_t_builtin.py'])
def test_a_users_custom_hooks_keep_this_projects_hooks(config, tmp_path):
    """The usual way to add a hook, custom_hooks (a list, which replaces the base's), over one of our configs:
    the Runner still registers the hooks for exact resume, every rank's norm statistics and fp16's skipped
    steps."""
    own = tmp_path / 'with_ema.py'
    own.write_text(f"_base_ = [{str(CONFIG_ROOT / config)!r}]\ncustom_hooks = [dict(type='EMAHook')]\n")
    cfg = Config.fromfile(own)
    cfg.work_dir = str(tmp_path / 'work')
    hooks = {type(hook).__name__ for hook in Runner.from_cfg(cfg).hooks}
    assert {'EMAHook', *MALA_HOOKS} <= hooks
