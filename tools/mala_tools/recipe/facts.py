"""What decides the result of a training run, read from its config: the facts that the recipe check compares with
a paper row's.

Each fact is a plain value under a name (:func:`recipe_facts`). Most are read from the config as written, with
what the libraries make of it filled in (the arch's drop path rate, the loss scale an AmpOptimWrapper defaults to,
the lr that ``auto_scale_lr`` scales). Two need the model: each parameter's lr and decay multipliers are those of
the optimizer built on it, so that a ``paramwise_cfg`` that lost a rule shows, and the norm layers are those it
builds. The model is built on the meta device: its structure without its weights, in a fraction of a second.
"""
import copy
import logging
import os.path as osp
from collections import Counter
from typing import Dict, List, Optional, Tuple

import torch
from mmengine.logging import MMLogger
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.normalization import GroupNorm, LayerNorm

from .schedule import run_length, schedule_points

NORM_LAYERS = (_BatchNorm, GroupNorm, LayerNorm)
# this project's hooks (mala_mm.engine), which every paper config runs with
MALA_HOOKS = ('IterationSeedHook', 'SyncNormStatsHook', 'SkippedStepsHook')
# keys of transforms and evaluators that say where files are, not what is computed
LOCATION_KEYS = ('backend_args', 'file_client_args', '_scope_', 'ann_file', 'data_root', 'outfile_prefix')


def plain(value):
    """``value`` with ConfigDicts as dicts, tuples as lists and the keys of :data:`LOCATION_KEYS` left out, so that
    two configs that compute the same compare equal."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items() if key not in LOCATION_KEYS}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def _dataset_with_pipeline(dataset: dict) -> dict:
    """The dataset inside dataset wrappers (RepeatDataset, ConcatDataset ...) whose pipeline the images go through."""
    while 'pipeline' not in dataset:
        if 'dataset' in dataset:
            dataset = dataset['dataset']
        elif dataset.get('datasets'):
            dataset = dataset['datasets'][0]
        else:
            break
    return dataset


def resolved_arch(backbone: dict):
    """The backbone's arch by name where it is one of MALA's, else its widths, depths and heads."""
    from mala_mm import MALA
    from mala_mm.models.backbones.mala_arguments import resolve_arch
    arch = backbone.get('arch', 'tiny')
    spec = resolve_arch(arch, MALA.arch_zoo)
    for name in ('tiny', 'small', 'base', 'large'):
        if MALA.arch_zoo[name] == spec:
            return name
    return {key: spec[key] for key in ('embed_dims', 'depths', 'num_heads')}


def train_data(cfg) -> tuple:
    """The train dataset's type, and the classes its metainfo names instead of the dataset's own (None where it
    names none): a COCO-format dataset of one's own is a CocoDataset with other classes."""
    dataset = _dataset_with_pipeline(dict(cfg.get('train_dataloader', {}).get('dataset', {})))
    classes = (dataset.get('metainfo') or {}).get('classes')
    return dataset.get('type'), tuple(classes) if classes else None


def row_key(cfg) -> Optional[tuple]:
    """What a config must share with a paper row to be compared with it: the backbone's arch, the model and its
    head, and the data it trains on (:func:`train_data`), the arch None where it is not one of MALA's variants;
    None where the backbone is not MALA."""
    model = cfg.get('model', {})
    backbone = model.get('backbone', {})
    if backbone.get('type') != 'MALA':
        return None
    arch = resolved_arch(backbone)
    return (arch if isinstance(arch, str) else None, model.get('type'),
            (model.get('decode_head') or {}).get('type'), train_data(cfg))


def _hook_types(cfg) -> List[str]:
    hooks = list((cfg.get('default_hooks') or {}).values()) + list(cfg.get('custom_hooks') or [])
    return [hook.get('type') for hook in hooks if isinstance(hook, dict)]


def batch_facts(cfg, gpus: int) -> dict:
    """The batch a GPU, the total batch on ``gpus`` GPUs, the base batch of auto_scale_lr and the lr after it."""
    per_gpu = cfg.train_dataloader.get('batch_size')
    auto_scale_lr = cfg.get('auto_scale_lr') or {}
    base = auto_scale_lr.get('base_batch_size')
    lr = cfg.optim_wrapper.get('optimizer', {}).get('lr')
    scaled = auto_scale_lr.get('enable', False) and base and per_gpu and lr is not None
    return {'batch': (gpus, per_gpu), 'base batch': base,
            'lr': lr * gpus * per_gpu / base if scaled else lr}


def optimizer_facts(cfg) -> dict:
    """The optimizer but its lr (a fact of its own), mixed precision and its loss scale, and clipping."""
    wrapper = cfg.optim_wrapper
    optimizer = {key: value for key, value in plain(wrapper.get('optimizer', {})).items() if key != 'lr'}
    amp = wrapper.get('type', 'OptimWrapper') == 'AmpOptimWrapper'
    return {'optimizer': optimizer,
            'precision': f"{wrapper.get('dtype') or 'float16'} mixed precision" if amp else 'fp32',
            'loss scale': wrapper.get('loss_scale', 'dynamic') if amp else None,
            'clipping': plain(wrapper.get('clip_grad'))}


def schedule_facts(cfg) -> dict:
    """The run's length and its lr schedule as the points where the lr changes (:mod:`.schedule`)."""
    schedulers = plain(cfg.get('param_scheduler') or [])
    schedulers = schedulers if isinstance(schedulers, list) else [schedulers]
    lr = cfg.optim_wrapper.get('optimizer', {}).get('lr') or 1.0  # an eta_min is read relative to it
    return {'length': run_length(cfg), 'schedule': schedule_points(schedulers, cfg, lr)}


def backbone_facts(cfg) -> dict:
    """The backbone's arch, drop path rate (the arch's where the config sets none), norm_eval, frozen stages,
    outputs, and the file name of its pretrained weights (where it is kept differs from machine to machine)."""
    from mala_mm import MALA
    from mala_mm.models.backbones.mala_arguments import resolve_arch
    backbone = cfg.model.backbone
    init_cfg = backbone.get('init_cfg') or {}
    checkpoint = init_cfg.get('checkpoint') if init_cfg.get('type') == 'Pretrained' else None
    checkpoint = checkpoint or backbone.get('pretrained') or cfg.model.get('pretrained')
    drop_path = backbone.get('drop_path_rate')
    return {'arch': resolved_arch(backbone),
            'drop path': resolve_arch(backbone.get('arch', 'tiny'), MALA.arch_zoo)['drop_path_rate']
            if drop_path is None else drop_path,
            'norm_eval': backbone.get('norm_eval', False), 'frozen_stages': backbone.get('frozen_stages', -1),
            'out_indices': plain(backbone.get('out_indices', [0, 1, 2, 3])),
            'pretrained': osp.basename(checkpoint) if checkpoint else None}


def _build_on_meta(cfg):
    """The config's model, built on the meta device in its library's registry scope."""
    scope = cfg.get('default_scope', 'mmdet')
    registry = __import__(f'{scope}.registry', fromlist=['MODELS']).MODELS
    with DefaultScope.overwrite_default_scope(scope), torch.device('meta'):
        return registry.build(copy.deepcopy(cfg.model))


def multipliers(model, optim_wrapper: dict) -> Dict[str, Tuple[float, float]]:
    """Each trained parameter's (lr multiplier, decay multiplier), as the optimizer built on ``model`` by the
    config's optim wrapper constructor (its paramwise_cfg) gives them: its group's lr and weight decay over the
    optimizer's. The wrapper is built as a plain OptimWrapper, which holds the same optimizer."""
    wrapper = copy.deepcopy(dict(optim_wrapper))
    wrapper.update(type='OptimWrapper')
    for key in ('loss_scale', 'dtype', 'use_fsdp'):
        wrapper.pop(key, None)
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)  # not the constructor's line for each parameter with a rule
    try:
        optimizer = build_optim_wrapper(model, wrapper).optimizer
    finally:
        logger.setLevel(level)
    base_lr, base_decay = optimizer.defaults['lr'], optimizer.defaults.get('weight_decay', 0)
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    found = {}
    for group in optimizer.param_groups:
        ratio = (group['lr'] / base_lr if base_lr else group['lr'],
                 group.get('weight_decay', 0) / base_decay if base_decay else group.get('weight_decay', 0))
        found.update((names[id(parameter)], tuple(round(r, 6) for r in ratio)) for parameter in group['params'])
    return found


def norm_layers(model) -> Dict[str, List[str]]:
    """The kinds of norm layer each part of the model (backbone, neck, heads) builds, with how many of each."""
    kinds = {}
    for part, module in model.named_children():
        counts = Counter(type(m).__name__ for m in module.modules() if isinstance(m, NORM_LAYERS))
        if counts:
            kinds[part] = sorted(f'{count} {kind}' for kind, count in counts.items())
    return kinds


def data_facts(cfg) -> dict:
    """The train and test pipelines, the model's data preprocessor and test mode, evaluation and checkpoints."""
    train = _dataset_with_pipeline(dict(cfg.train_dataloader.dataset))
    test_loader = cfg.get('test_dataloader') or cfg.get('val_dataloader') or {}
    test = _dataset_with_pipeline(dict(test_loader.get('dataset', {})))
    checkpoint = (cfg.get('default_hooks') or {}).get('checkpoint') or {}
    return {'train pipeline': plain(train.get('pipeline')), 'test pipeline': plain(test.get('pipeline')),
            'data preprocessor': plain(cfg.model.get('data_preprocessor')),
            'test mode': plain(cfg.model.get('test_cfg')),
            'evaluation': plain(cfg.get('val_evaluator')),
            'validation interval': (cfg.get('train_cfg') or {}).get('val_interval'),
            'checkpoint interval': checkpoint.get('interval'), 'best checkpoint': checkpoint.get('save_best'),
            'checkpoints kept': checkpoint.get('max_keep_ckpts')}


def hook_facts(cfg) -> dict:
    imports = (cfg.get('custom_imports') or {}).get('imports') or []
    return {'hooks': [hook for hook in MALA_HOOKS if hook in _hook_types(cfg)],
            'imports mala_mm.engine': 'mala_mm.engine' in imports}


def recipe_facts(cfg, gpus: int) -> dict:
    """Every fact of the run that ``cfg`` trains on ``gpus`` GPUs, by name."""
    model = _build_on_meta(cfg)
    facts = {**batch_facts(cfg, gpus), **optimizer_facts(cfg), **schedule_facts(cfg)}
    facts.update({f'backbone {key}': value for key, value in backbone_facts(cfg).items()})
    facts.update({'lr and decay multipliers': multipliers(model, cfg.optim_wrapper), 'norm layers': norm_layers(model)})
    facts.update({**data_facts(cfg), **hook_facts(cfg)})
    return facts


def unloaded_backbone_tensors(cfg) -> Optional[Tuple[int, int]]:
    """(tensors the backbone's pretrained file does not give, tensors of the backbone) where that file is on disk,
    not counting the output norms, which ImageNet checkpoints never have; None where it is not on disk."""
    from mala_mm.checkpoint import compare_state_dict, extract_backbone_state_dict, safe_load
    backbone = cfg.model.backbone
    init_cfg = backbone.get('init_cfg') or {}
    path = init_cfg.get('checkpoint')
    if not path or not osp.isfile(path):
        return None
    model = _build_on_meta(cfg)
    state = extract_backbone_state_dict(safe_load(path), init_cfg.get('prefix'))
    comparison = compare_state_dict(state, model.backbone)
    wrong = {line.split(':')[0] for line in comparison.wrong_shapes}
    unloaded = [key for key in comparison.missing + sorted(wrong) if not key.startswith('extra_norms.')]
    return len(unloaded), len(model.backbone.state_dict())
