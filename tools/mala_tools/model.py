"""From a config to a model to run, one way for every tool: the config checked, the model built through the registry
of its default_scope, a checkpoint's weights loaded, and whatever stops that turned into one ``error:`` line."""
import copy
import importlib
import re
from contextlib import contextmanager
from typing import Optional

from mmengine.config import Config
from mmengine.model import revert_sync_batchnorm
from mmengine.registry import init_default_scope
from mmengine.runner.checkpoint import load_state_dict
from torch import nn

from mala_mm.checkpoint import CheckpointError, load_backbone_weights, safe_load
from mala_mm.models import MALA, MALAConfigError

from .checks.config_keys import config_errors
from .errors import build_error_message, fail, missing_local_file

# what the registry raises on a config it cannot build: a type no registry knows (KeyError), an argument the class
# does not take (TypeError); MALA's own checks of its arguments
CONFIG_BUILD_ERRORS = (KeyError, TypeError, MALAConfigError)


@contextmanager
def _stop_on(*errors):
    """Stop the tool with the one-line message of any of ``errors`` raised inside."""
    try:
        yield
    except errors as err:
        fail(build_error_message(err))


def _require_local_checkpoint(checkpoint: Optional[str]) -> None:
    """Before anything is built: a local checkpoint that does not exist (a URL is fetched by the loader)."""
    if checkpoint:
        for problem in missing_local_file(checkpoint, 'checkpoint'):
            fail(problem)


def build_model(cfg: Config, checkpoint: Optional[str] = None, device: str = 'cpu') -> nn.Module:
    """The model of ``cfg`` (an mmdet or mmseg config) in eval mode on ``device``, to run, export or measure.

    Its weights are ``checkpoint``'s (a path or URL) where given, else as its modules construct them: as mmdet's
    ``init_detector`` and mmseg's ``init_model`` do, the backbone's ``init_cfg`` is left out, so that no
    pretrained file is needed, and no initialisation runs. SyncBN layers become BN (one process runs the model).
    ``model.cfg`` is the config, whose test pipeline the libraries' inference functions read;
    ``model.dataset_meta`` holds the classes and palette, each from the checkpoint's meta where it has them, else
    from the config's test dataset. ``cfg`` itself is left as it is.

    A config these tools do not run, misspelt keys, arguments the registry cannot build and a checkpoint that is
    missing, unreadable or refused stop the tool (``error: ...``, exit status 2).
    """
    problems = config_errors(cfg, cfg.filename or 'the config')
    if problems:
        fail('\n'.join(problems))
    _require_local_checkpoint(checkpoint)
    cfg = copy.deepcopy(cfg)
    if 'init_cfg' in cfg.model.get('backbone', {}):
        cfg.model.backbone.init_cfg = None
    init_default_scope(cfg.default_scope)
    registry = importlib.import_module(f'{cfg.default_scope}.registry')
    with _stop_on(*CONFIG_BUILD_ERRORS):
        model = revert_sync_batchnorm(registry.MODELS.build(cfg.model))
    checkpoint_meta = {}
    if checkpoint:
        with _stop_on(CheckpointError):
            loaded = safe_load(checkpoint)
        state = loaded.get('state_dict', loaded)
        # as mmengine's load_checkpoint: the keys of a model saved inside its DDP wrapper lose the wrapper's prefix
        load_state_dict(model, {re.sub(r'^module\.', '', key): value for key, value in state.items()})
        checkpoint_meta = loaded.get('meta', {})
    model.dataset_meta = _dataset_meta(cfg, registry, checkpoint_meta)
    model.cfg = cfg
    return model.to(device).eval()


def _dataset_meta(cfg: Config, registry, checkpoint_meta: dict) -> dict:
    """Classes, palette, ...: each as the checkpoint's meta gives it (what its weights were trained on), else as
    the config's test dataset does (where the config has one)."""
    # mmdet and mmseg 3.x / 1.x checkpoints; mmdet reads the keys in lower case
    meta = {key.lower(): value for key, value in checkpoint_meta.get('dataset_meta', {}).items()}
    dataset = (cfg.get('test_dataloader') or {}).get('dataset')
    if dataset is None:
        return meta
    dataset = copy.deepcopy(dataset)
    dataset['lazy_init'] = True  # the metainfo only: no annotation file is read
    with _stop_on(*CONFIG_BUILD_ERRORS):
        return {**registry.DATASETS.build(dataset).metainfo, **meta}


def build_backbone(backbone_cfg: Optional[dict], checkpoint: Optional[str] = None,
                   source: str = 'the backbone') -> MALA:
    """The MALA of a config's ``model.backbone`` (its type and arguments; ``init_cfg`` is left out) in eval mode,
    with ``checkpoint``'s backbone weights (any format MALA loads) where given, else as constructed.

    A backbone that is not MALA (``source`` names it in the message), arguments MALA does not take and a checkpoint
    that is missing, unreadable or does not fit stop the tool (``error: ...``, exit status 2).
    """
    arguments = dict(backbone_cfg or {})
    kind = arguments.pop('type', None)
    if kind != 'MALA':
        fail(f'{source} is {kind!r}, not MALA')
    arguments.pop('init_cfg', None)
    _require_local_checkpoint(checkpoint)
    with _stop_on(*CONFIG_BUILD_ERRORS):
        backbone = MALA(**arguments)
    if checkpoint:
        with _stop_on(CheckpointError):
            load_backbone_weights(backbone, checkpoint)
    return backbone.eval()
