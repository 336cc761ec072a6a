"""What the training and test commands share: config loading, checks with clear messages, and the distributed
set-up that also works without CUDA."""
import gc
import importlib
import os
import os.path as osp
import subprocess
import sys
from typing import Callable, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from mmengine.config import Config, DictAction
from mmengine.dist import init_dist

from .config_check import config_problems, top_level_typos
from .machine_fit import ConfigChange, describe_changes, sync_bn_to_bn
from .errors import (ERROR_STATUS, build_error_message, fail, is_main_process, local_rank, missing_local_file, print_error,
                     require_file)

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


def _pretrained_checkpoints(node, path: str = 'model') -> Iterator[Tuple[str, str]]:
    """(dotted path, file) of every ``init_cfg=dict(type='Pretrained', checkpoint=...)`` under ``node``."""
    if isinstance(node, dict):
        if node.get('type') == 'Pretrained' and isinstance(node.get('checkpoint'), str):
            yield f'{path}.checkpoint', node['checkpoint']
        for key, value in node.items():
            yield from _pretrained_checkpoints(value, f'{path}.{key}')
    elif isinstance(node, (list, tuple)):
        for index, value in enumerate(node):
            yield from _pretrained_checkpoints(value, f'{path}[{index}]')


def missing_weight_files(cfg, load_from_name: str = 'load_from') -> List[str]:
    """One line per local weights file that training ``cfg`` reads and that does not exist: the ``Pretrained``
    init_cfgs (read before a resumed run's checkpoint too) and ``load_from``, called ``load_from_name`` in the
    line. URLs are fetched by the loader and not checked here."""
    problems = [f'{problem}; the ImageNet weights and where they go: docs/get_started.md#weights'
                for where, file in _pretrained_checkpoints(cfg.get('model'))
                for problem in missing_local_file(file, where)]
    if cfg.get('load_from'):
        problems += missing_local_file(cfg.load_from, load_from_name)
    return problems


def data_problems(cfg, dataloaders) -> List[str]:
    """The datasets of ``dataloaders`` that are missing or hold empty files, with how to fix each."""
    from mala_mm.datasets import DatasetNotFoundError, EmptyDataFileError, check_data_paths
    try:
        check_data_paths(cfg, dataloaders)
    except (DatasetNotFoundError, EmptyDataFileError) as err:
        return [str(err)]
    return []


def preflight(find_problems: Callable[[], List[str]]) -> None:
    """Stop the job, before anything is built, if ``find_problems()`` reports any (one line each).

    In a distributed job (``setup_distributed`` first) the first process of each node checks, since data and
    weights may be local to a node, and the others wait for its verdict: one look at a shared filesystem per
    node, not one per process. Every process that found a problem prints it before the group's last barrier,
    so the lines reach the terminal whatever order the processes end in afterwards: the launcher stops the
    others as soon as one exits, and a line not yet printed then would be lost.
    """
    problems = find_problems() if local_rank() == 0 else []
    if not (dist.is_available() and dist.is_initialized()):
        if problems:
            fail('\n'.join(problems))
        return
    verdicts = [None] * dist.get_world_size()
    dist.all_gather_object(verdicts, problems)
    if not any(verdicts):
        return
    for problem in problems:
        print_error(problem)
    close_distributed(finished=True)
    raise SystemExit(ERROR_STATUS)


def _slurm_environment():
    """RANK, WORLD_SIZE, MASTER_ADDR, ... of a process started by srun, as torchrun would set them."""
    nodes = subprocess.getoutput(f'scontrol show hostname {os.environ["SLURM_NODELIST"]}').split()
    os.environ.setdefault('MASTER_ADDR', nodes[0])
    os.environ.setdefault('MASTER_PORT', '29500')
    os.environ['RANK'] = os.environ['SLURM_PROCID']
    os.environ['WORLD_SIZE'] = os.environ['SLURM_NTASKS']
    os.environ['LOCAL_RANK'] = os.environ['SLURM_LOCALID']


def setup_distributed(cfg) -> List[ConfigChange]:
    """Start the process group of a distributed job here, before the Runner, so that the pre-flight checks can
    share one verdict. With CUDA as the Runner would have (mmengine's ``init_dist``; the Runner then skips it);
    without CUDA with gloo (mmengine's start-up selects a CUDA device), DDP without device ids and SyncBN as BN.
    Returns the changes made to ``cfg`` for that."""
    if cfg.launcher == 'none':
        return []
    if torch.cuda.is_available():
        init_dist(cfg.launcher, **cfg.get('env_cfg', {}).get('dist_cfg', {}))
        return []
    if cfg.launcher == 'slurm':
        _slurm_environment()
    elif 'RANK' not in os.environ:
        fail('--launcher pytorch needs the environment torchrun sets (RANK, WORLD_SIZE, ...): start the '
             'processes with torchrun')
    init_gloo()
    wrapper = dict(type='MMDistributedDataParallel', device_ids=None)
    changes = [ConfigChange('model_wrapper_cfg', cfg.get('model_wrapper_cfg'), wrapper,
                            'DDP of processes on CPU has no device ids')]
    cfg.model_wrapper_cfg = wrapper
    return changes + sync_bn_to_bn(cfg.model)


def report_changes(changes: List[ConfigChange]) -> None:
    """Print, once per job, the keys a tool changed in the config for this machine."""
    if changes and is_main_process():
        print(describe_changes(changes), file=sys.stderr)


def init_gloo():
    """The gloo process group of a process torchrun started. After torchrun restarts the group, the store still
    holds the addresses the previous processes published, and gloo would connect to those ('Connection
    refused'); each start therefore keeps its keys under its own prefix."""
    attempt = os.environ.get('TORCHELASTIC_RESTART_COUNT')
    if attempt is None:
        dist.init_process_group(backend='gloo')
        return
    rank, world_size = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
    agent_store = os.environ.get('TORCHELASTIC_USE_AGENT_STORE') == 'True'  # torchrun's agent hosts the store
    store = dist.TCPStore(os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']), world_size,
                          is_master=not agent_store and rank == 0)
    dist.init_process_group(backend='gloo', store=dist.PrefixStore(f'mala_mm/attempt_{attempt}', store),
                            rank=rank, world_size=world_size)


def close_distributed(finished: bool):
    """Destroy the process group, and after a finished run also its gloo worker threads, while the interpreter
    is fully alive.

    A gloo worker thread destroys each collective's work object after the collective has completed, and freeing
    the tensors that Python created (mmengine's broadcast of the metrics, say) takes the GIL. The runner's
    reference cycles keep its DDP wrapper, and with it the process group and its worker threads, alive past
    ``destroy_process_group`` until the interpreter's own clean-up at exit. If a worker asks for the GIL then,
    CPython ends the thread inside the work's noexcept destructor and the process aborts ('terminate called
    without an active exception') after all its work is done: a core dump shows the main thread in
    Py_FinalizeEx and a ProcessGroupGloo::runLoop thread in ~AsyncBroadcastWork -> take_gil -> pthread_exit ->
    std::terminate. After a finished run, a barrier first makes sure that no process has a collective in
    flight; collecting the cycles then destroys the group here, and its destructor joins the worker threads with
    the GIL released, so that they finish normally. After a failure the other processes may never reach the
    barrier, and the group is only closed.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    if finished:
        dist.barrier()
    dist.destroy_process_group()
    if finished:
        gc.collect()


def build_runner(cfg):
    # also for configs without custom_imports: the hooks, the CPU mixed-precision optim wrapper, and checkpoints
    # (load_from, resume) read as data
    import mala_mm.engine  # noqa: F401
    from mala_mm.checkpoint import use_safe_loading
    use_safe_loading()
    runners = importlib.import_module(f'{cfg.default_scope}.registry').RUNNERS
    if 'runner_type' in cfg:
        return runners.build(cfg)
    from mmengine.runner import Runner
    return Runner.from_cfg(cfg)


def run_runner(cfg, action: str):
    """``build_runner(cfg).<action>()``; a checkpoint that cannot be read or does not fit, backbone arguments
    that cannot build a MALA, too many undecodable images or skipped steps stop the tool with the reason, not a
    traceback from inside the runner."""
    from mala_mm.checkpoint import CheckpointError
    from mala_mm.datasets import TooManyUndecodableImages
    from mala_mm.engine import TooManySkippedSteps
    from mala_mm.models import MALAConfigError
    finished = False
    try:
        getattr(build_runner(cfg), action)()  # the runner is not kept: close_distributed collects it
        finished = True
    except (CheckpointError, MALAConfigError, TooManySkippedSteps, TooManyUndecodableImages) as err:
        fail(build_error_message(err))
    finally:
        close_distributed(finished)
