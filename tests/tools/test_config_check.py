"""A misspelt config key stops the tools with one line naming it and the key meant; every shipped config, and
every base config it inherits, passes the check."""
import ast
import importlib.util
import os.path as osp
from pathlib import Path

import pytest

from mala_tools.checks import config_keys
from tests.helpers import ROOT, call_tool, load_config

CONFIG_ROOT = Path(ROOT) / 'configs'
DET_CONFIG = str(CONFIG_ROOT / 'detection/mask_rcnn_mala_t_builtin.py')


def _shipped_configs():
    return sorted(str(path) for task in ('detection', 'segmentation') for path in (CONFIG_ROOT / task).glob('*.py'))


def _bases(path: str) -> list:
    """The base configs that the config at ``path`` names in ``_base_`` (a string or a list of them), as written."""
    for statement in ast.parse(Path(path).read_text()).body:
        if isinstance(statement, ast.Assign) and any(isinstance(target, ast.Name) and target.id == '_base_'
                                                     for target in statement.targets):
            bases = ast.literal_eval(statement.value)
            return [bases] if isinstance(bases, str) else list(bases)
    return []


def _base_path(base: str, path: str) -> tuple:
    """(file, scope) of ``base``, named in the config at ``path``: ``mmdet::x`` is ``x`` among the configs that the
    mmdet package ships (in its ``.mim/configs``, where mmengine reads them), with the scope mmdet; anything else
    is relative to the config's folder, with no scope of its own."""
    scope, separator, relative = base.rpartition('::')
    if separator:
        package, = importlib.util.find_spec(scope).submodule_search_locations
        base_path = osp.join(package, '.mim', 'configs', relative)
    else:
        base_path, scope = osp.normpath(osp.join(osp.dirname(path), base)), None
    assert osp.isfile(base_path), f'{path}: base config {base!r} is not at {base_path}'
    return base_path, scope


def _inherited(path: str, scope: str, found: dict) -> None:
    """Add to ``found`` the base configs ``path`` inherits, at any depth, with the library whose registries
    resolve their types: the one named in ``mmdet::``/``mmseg::``, else that of the config inheriting them."""
    for base in _bases(path):
        base_path, base_scope = _base_path(base, path)
        if base_path not in found:
            found[base_path] = base_scope or scope
            _inherited(base_path, found[base_path], found)


def _all_configs():
    """(path, scope) of every shipped config and every base config they inherit."""
    configs = {}
    for path in _shipped_configs():
        configs[path] = None  # the config's own default_scope
        _inherited(path, 'mmdet' if '/detection/' in path else 'mmseg', configs)
    for path, scope in configs.items():
        shown = f'{scope}::' + path.split('/.mim/configs/')[1] if '/.mim/configs/' in path else osp.relpath(path, ROOT)
        yield pytest.param(path, scope, id=shown)


@pytest.mark.parametrize('path, scope', list(_all_configs()))
def test_shipped_configs_pass(path, scope):
    assert config_keys.config_problems(load_config(path), scope) == []


@pytest.mark.parametrize('option, message', [
    ('model.backbone.frozen_stage=1', "model.backbone: MALA has no argument 'frozen_stage'; "
     "did you mean 'frozen_stages'?"),
    ('train_cfg.max_iter=10', "train_cfg: IterBasedTrainLoop has no argument 'max_iter'; did you mean 'max_iters'?"),
], ids=['backbone', 'loop'])
def test_misspelt_key_stops_the_tool(option, message, tmp_path):
    result = call_tool(['train.py', DET_CONFIG, '--cfg-options', option], cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith('error: ')]
    assert errors == [f'error: {DET_CONFIG}: {message}']
    assert 'Traceback' not in result.stderr


def _problems(**options):
    cfg = load_config(DET_CONFIG)
    cfg.merge_from_dict(options)
    return config_keys.config_problems(cfg)


def test_keys_that_builders_take_out_are_accepted():
    assert _problems(**{
        'model.backbone.norm_cfg.requires_grad': False,  # mmcv's build_norm_layer
        'default_hooks.logger.priority': 'LOW',  # the Runner's hook registration
        'optim_wrapper.constructor': 'DefaultOptimWrapperConstructor',
        'param_scheduler': [dict(type='LinearParamScheduler', param_name='lr', convert_to_iter_based=True)],
    }) == []


def test_typeless_train_loop_is_checked_as_the_runner_builds_it():
    cfg = load_config(DET_CONFIG)
    cfg.train_cfg = dict(by_epoch=False, max_iters=10, val_intervl=5)
    assert config_keys.config_problems(cfg) == [
        "train_cfg: IterBasedTrainLoop has no argument 'val_intervl'; did you mean 'val_interval'?"]


def test_without_a_close_key_the_valid_ones_are_listed():
    [problem] = _problems(**{'optim_wrapper.optimizer.learning_rate': 0.1})
    assert problem.startswith("optim_wrapper.optimizer: AdamW has no argument 'learning_rate'; it takes params, lr, ")


def _typos(**options):
    cfg = load_config(DET_CONFIG)
    cfg.merge_from_dict(options)
    return config_keys.top_level_typos(cfg)


def test_intermediate_variables_are_not_top_level_typos():
    # near a Runner key, but more than a typo away from it
    assert _typos(test_pipeline=[], conv_cfg=None, val_evaluator_extra={}, custom_keys={}) == []
    assert _typos(modle={}) == ["top-level key 'modle' is not one the runner reads; did you mean 'model'?"]
    assert _problems(modle={}) == []  # a warning, not a reason to stop


def test_a_top_level_typo_is_a_warning_and_the_check_can_be_skipped(tmp_path):
    """A top-level near miss is printed as a warning and does not stop the run (the pre-flight then stops it on
    the missing dataset); --skip-config-check lets a key the check refuses reach the build, which stops on it."""
    result = call_tool(['train.py', DET_CONFIG, '--cfg-options', 'optim_wraper.clip_grad.max_norm=1'], cwd=tmp_path)
    assert (f"warning: {DET_CONFIG}: top-level key 'optim_wraper' is not one the runner reads; did you mean "
            "'optim_wrapper'?") in result.stderr
    assert "error: dataset not found under 'data/builtin/'" in result.stderr
    result = call_tool(['train.py', DET_CONFIG, '--skip-config-check', '--cfg-options',
                        'model.backbone.frozen_stage=1'], cwd=tmp_path)
    assert 'has no argument' not in result.stderr and "error: dataset not found under 'data/builtin/'" in result.stderr
