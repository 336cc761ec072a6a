"""Starting and ending the process group of a distributed job, also without CUDA (gloo)."""
import gc
import os
import subprocess
from typing import List

import torch
import torch.distributed as dist
from mmengine.dist import init_dist

from .errors import fail
from .machine_fit import ConfigChange, sync_bn_to_bn

# the ports slurm jobs take, below Linux's ephemeral ports (32768 and up), which outgoing connections take
SLURM_PORTS = range(20000, 30000)


def slurm_port(job_id: str) -> int:
    """The port the processes of slurm job ``job_id`` meet at: one per job, so that two jobs sharing a node do not
    take the same port (jobs whose ids differ by a multiple of 10,000 would)."""
    return SLURM_PORTS[int(job_id) % len(SLURM_PORTS)]


def _slurm_port_unless_set():
    """MASTER_PORT, for a process started by srun, from its job's id where the environment sets none."""
    if 'MASTER_PORT' not in os.environ:
        os.environ['MASTER_PORT'] = str(slurm_port(os.environ['SLURM_JOB_ID']))


def _slurm_environment():
    """RANK, WORLD_SIZE, MASTER_ADDR, ... of a process started by srun, as torchrun would set them."""
    nodes = subprocess.getoutput(f'scontrol show hostname {os.environ["SLURM_NODELIST"]}').split()
    os.environ.setdefault('MASTER_ADDR', nodes[0])
    _slurm_port_unless_set()
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
        if cfg.launcher == 'slurm':
            _slurm_port_unless_set()  # mmengine's init_dist would take 29500, which two jobs on a node share
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
