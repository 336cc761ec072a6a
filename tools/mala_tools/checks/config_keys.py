"""A config's keys, checked before anything is built: a default_scope these tools do not run
(:func:`scope_problems`); a key the named class does not take, which would otherwise stop the run with a traceback
from inside the registry (:func:`config_problems`); a misspelt top-level key, which would be silently ignored
(:func:`top_level_typos`, a warning: a config's own variable may be so named). :func:`config_errors` is what the
tools call."""
import difflib
import importlib
import inspect
import sys
from typing import Iterator, List, Optional

from mmengine.runner import Runner

from ..config_tree import config_dicts
from ..errors import is_main_process

SCOPES = ('mmdet', 'mmseg')  # the config's default_scope picks the library

# top-level keys that mmengine's Runner reads besides its constructor's arguments, or these tools read
OTHER_TOP_LEVEL_KEYS = ('custom_imports', 'runner_type', 'model_wrapper_cfg', 'find_unused_parameters', 'sync_bn',
                        'compile', 'activation_checkpointing', 'efficient_conv_bn_eval')
TOP_LEVEL_KEYS = tuple(sorted(set(inspect.signature(Runner).parameters) - {'cfg'} | set(OTHER_TOP_LEVEL_KEYS)))
# keys the registry takes out of every config before calling the class
REGISTRY_KEYS = ('type', '_scope_')
# keys that the module holding a config (under a key ending in the name here) takes out before building it:
# mmcv's build_norm_layer, mmdet's FCNMaskHead and FPN_CARAFE, DETRHead, ResNet
TAKEN_BY_HOLDER = {'norm_cfg': ('requires_grad', ), 'upsample_cfg': ('scale_factor', 'upsample_kernel'),
                   'loss_cls': ('bg_cls_weight', ), 'dcn': ('fallback_on_stride', )}
# a dict under `model` may name a module, a box coder / assigner / sampler, or a weight initialiser
MODEL_REGISTRIES = ('MODELS', 'TASK_UTILS', 'WEIGHT_INITIALIZERS')
# a loop config without a type is built by the Runner as one of these
DEFAULT_LOOPS = {'val_cfg': 'ValLoop', 'test_cfg': 'TestLoop'}


def _registry(scope: str, name: str):
    try:
        return getattr(importlib.import_module(f'{scope}.registry'), name)
    except ImportError:  # another library's scope: its own build will report it
        return None


def _resolve(kind, scope: str, registry_names):
    """The class a config's ``type`` names, or None where no registry of ``scope`` knows it (mmcv ops such as
    RoIAlign and nms are looked up by their users, not in a registry)."""
    if not isinstance(kind, str):
        return kind
    for name in registry_names:
        registry = _registry(scope, name)
        found = registry.get(kind) if registry is not None else None
        if found is not None:
            return found
    return None


def _unknown_keys(cfg: dict, cls, path: str, extra_keys=()) -> Iterator[str]:
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return
    # a class taking **kwargs passes them on to somewhere this check cannot see, so all its keys may be valid
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return
    valid = [*parameters, *REGISTRY_KEYS, *extra_keys]
    name = getattr(cls, '__name__', str(cls))
    for key in cfg:
        if key not in valid:
            yield f'{path}: {name} has no argument {key!r}; ' + _what_instead(key, list(parameters))


def _what_instead(key: str, valid) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.7)
    return f'did you mean {close[0]!r}?' if close else f'it takes {", ".join(valid)}'


def _check_typed(cfg, path: str, scope: str, registry_names, extra_keys=()) -> Iterator[str]:
    if isinstance(cfg, dict) and 'type' in cfg:
        cls = _resolve(cfg['type'], cfg.get('_scope_', scope), registry_names)
        if cls is not None:
            yield from _unknown_keys(cfg, cls, path, extra_keys)


def _check_model(model: dict, scope: str) -> Iterator[str]:
    """Every dict with a type, at any depth: a module builds its parts from the configs it is given."""
    scopes = {}  # dotted key of each dict -> the scope that holds for what is built inside it
    for where, part in config_dicts(model, 'model'):
        parent = where.rsplit('.', 1)[0]
        while parent not in scopes and '.' in parent:  # through the lists between a dict and its parent dict
            parent = parent.rsplit('.', 1)[0]
        scopes[where] = part.get('_scope_', scopes.get(parent, scope))
        holder = next(name for name in reversed(where.split('.')) if not name.isdigit())
        taken = [key for name, keys in TAKEN_BY_HOLDER.items() if holder.endswith(name) for key in keys]
        yield from _check_typed(part, where, scopes[where], MODEL_REGISTRIES, taken)


def _check_loop(cfg, key: str, scope: str) -> Iterator[str]:
    if not isinstance(cfg, dict):
        return
    if 'type' in cfg:
        yield from _check_typed(cfg, key, scope, ('LOOPS', ))
    elif key == 'train_cfg':
        loop = 'EpochBasedTrainLoop' if cfg.get('by_epoch', True) else 'IterBasedTrainLoop'
        yield from _unknown_keys(cfg, _resolve(loop, scope, ('LOOPS', )), key, extra_keys=('by_epoch', ))
    else:
        yield from _unknown_keys(cfg, _resolve(DEFAULT_LOOPS[key], scope, ('LOOPS', )), key)


def _check_runner_parts(cfg, scope: str) -> Iterator[str]:
    for key in ('train_cfg', 'val_cfg', 'test_cfg'):
        yield from _check_loop(cfg.get(key), key, scope)
    optim_wrapper = cfg.get('optim_wrapper')
    if isinstance(optim_wrapper, dict):
        # the optimizer wrapper constructor takes these two out
        yield from _check_typed(optim_wrapper, 'optim_wrapper', scope, ('OPTIM_WRAPPERS', ),
                                extra_keys=('constructor', 'paramwise_cfg'))
        yield from _check_typed(optim_wrapper.get('optimizer'), 'optim_wrapper.optimizer', scope, ('OPTIMIZERS', ))
    schedulers = cfg.get('param_scheduler')
    for index, scheduler in enumerate(schedulers if isinstance(schedulers, (list, tuple)) else [schedulers]):
        yield from _check_typed(scheduler, f'param_scheduler.{index}', scope, ('PARAM_SCHEDULERS', ),
                                extra_keys=('convert_to_iter_based', ))
    hooks = [(f'default_hooks.{name}', hook) for name, hook in (cfg.get('default_hooks') or {}).items()]
    hooks += [(f'custom_hooks.{index}', hook) for index, hook in enumerate(cfg.get('custom_hooks') or [])]
    for path, hook in hooks:
        # the Runner takes a hook's priority out before building it
        yield from _check_typed(hook, path, scope, ('HOOKS', ), extra_keys=('priority', ))


def _misspelt_top_level_key(key: str) -> Optional[str]:
    """The top-level key that ``key`` is a typo of: one character off (two in a long key). Intermediate
    variables such as train_pipeline or norm_cfg are further from every key the Runner reads."""
    if key in TOP_LEVEL_KEYS:
        return None
    close = difflib.get_close_matches(key, TOP_LEVEL_KEYS, n=1, cutoff=0.8)
    if not close:
        return None
    matcher = difflib.SequenceMatcher(None, key, close[0])
    differing = max(len(key), len(close[0])) - sum(block.size for block in matcher.get_matching_blocks())
    return close[0] if differing <= (1 if len(close[0]) < 10 else 2) else None


def config_problems(cfg, scope: Optional[str] = None) -> List[str]:
    """One line per key of ``cfg`` that the class it is given to does not take, naming its dotted path and, where
    one is close, the right key: the registry would stop on it with a traceback.

    ``scope`` (default: the config's default_scope) is the library whose registries resolve the types.
    """
    scope = scope or cfg.get('default_scope')
    problems = []
    if isinstance(cfg.get('model'), dict):
        problems += _check_model(cfg['model'], scope)
    problems += _check_runner_parts(cfg, scope)
    return problems


def top_level_typos(cfg) -> List[str]:
    """One line per top-level key of ``cfg`` that is a typo's distance from a key the Runner reads, and that the
    Runner would therefore ignore. Likely, not certainly, a mistake: a variable of the config may be so named."""
    return [f'top-level key {key!r} is not one the runner reads; did you mean {intended!r}?'
            for key, intended in ((key, _misspelt_top_level_key(key)) for key in cfg.keys()) if intended]


def scope_problems(cfg, config_path: str) -> List[str]:
    """``[why]`` where ``cfg`` (read from ``config_path``) names no default_scope these tools run, else ``[]``."""
    scope = cfg.get('default_scope')
    if scope in SCOPES:
        return []
    return [f'{config_path}: default_scope is {scope!r}; these tools run configs whose default_scope is one of '
            f'{SCOPES} (inherit mmdet::/mmseg::_base_/default_runtime.py)']


def config_errors(cfg, config_path: str, check_keys: bool = True) -> List[str]:
    """What stops ``cfg`` (read from ``config_path``) from building: a default_scope these tools do not run, or
    (with ``check_keys``) keys the classes they are given to do not take."""
    problems = scope_problems(cfg, config_path)
    if problems or not check_keys:
        return problems
    return [f'{config_path}: {problem}' for problem in config_problems(cfg)]


def warn_about_config(cfg, config_path: str) -> None:
    """Print, once per job, each top-level key of ``cfg`` that looks like a typo of one the Runner reads."""
    if is_main_process():
        for typo in top_level_typos(cfg):
            print(f'warning: {config_path}: {typo}', file=sys.stderr)
