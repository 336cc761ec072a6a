"""A tool's config: its command-line arguments, reading it with ``--cfg-options``, and the checks of what it
names before anything is built."""
import os.path as osp
import sys
from typing import List, Optional

from mmengine.config import Config, DictAction

from .config_check import config_problems, top_level_typos
from .errors import fail, is_main_process, require_file

SCOPES = ('mmdet', 'mmseg')  # the config's default_scope picks the library


def add_common_args(parser):
    parser.add_argument('config', help='config file')
    parser.add_argument('--work-dir', help='where logs and checkpoints go (default: work_dirs/<config name>)')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction,
        help='override config entries, e.g. train_cfg.max_iters=100 "model.backbone.arch=small"')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm'], default='none')
    parser.add_argument(
        '--skip-config-check', action='store_true',
        help="do not check the config's keys against the arguments of the classes they build (for a config whose "
        'classes take keys the check cannot see); the build itself still stops on a wrong one')
    # torchrun sets LOCAL_RANK in the environment; older launchers pass it as an argument
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)


def read_config(path: str, options: Optional[dict] = None) -> Config:
    """The config file at ``path`` with ``--cfg-options`` ``options`` merged in; a missing file is a clear error."""
    require_file(path, 'config file')
    cfg = Config.fromfile(path)
    if options:
        try:
            cfg.merge_from_dict(options)
        except (TypeError, KeyError) as err:  # e.g. a key set under a value that is not a dict
            fail(f'--cfg-options: {err}')
    return cfg


def load_config(args) -> Config:
    """The config with the command line's overrides, its work_dir and launcher set. It is checked with the
    job's other pre-flight checks (``config_errors``, ``preflight``)."""
    cfg = read_config(args.config, args.cfg_options)
    cfg.launcher = args.launcher
    if args.work_dir:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('work_dirs', osp.splitext(osp.basename(args.config))[0])
    return cfg


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
