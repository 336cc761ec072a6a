"""A tool's config: its command-line arguments, and reading it with ``--cfg-options`` (the checks of what it names,
before anything is built: :mod:`mala_tools.checks`)."""
import os.path as osp
from typing import Optional

from mmengine.config import Config, DictAction

from .errors import fail, require_file


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
