"""A training run killed with SIGKILL, between iterations or half-way through writing a checkpoint, resumes to
the very weights of an uninterrupted run (CPU, fixed seed, deterministic mode, the built-in dataset).

The model is the built-in UperNet with a narrow MALA at 64 px (tests/data): what is checked, the checkpoints a
kill leaves and the weights a resume reaches, does not depend on the model's size."""
import os.path as osp
import signal

import pytest
import torch

from mala_mm.checkpoint import CheckpointError, safe_load
from tests.helpers import DATA_DIR, HELPERS_DIR, config_with_hooks, run_tool

SEG_CONFIG = osp.join(DATA_DIR, 'upernet_mala_narrow_64px_builtin.py')
ITERS, INTERVAL = 12, 4  # checkpoints at iterations 4, 8 and 12
KILLED = -signal.SIGKILL

pytestmark = pytest.mark.slow


def config_with(cwd, name, hooks, checkpoint_hook='AtomicCheckpointHook'):
    """The built-in segmentation config, keeping one checkpoint, with the fault-injection ``hooks`` added."""
    return config_with_hooks(
        cwd / f'{name}.py', SEG_CONFIG, hooks,
        f"default_hooks = dict(checkpoint=dict(type={checkpoint_hook!r}, interval={INTERVAL}, max_keep_ckpts=1))")


def train(cwd, config, work_dir, *options):
    """tools/train.py for ITERS iterations without validation, in deterministic mode."""
    return run_tool(
        ['train.py', config, '--work-dir', str(work_dir), *options, '--cfg-options',
         f'train_cfg.max_iters={ITERS}', 'param_scheduler.0.end=4', 'param_scheduler.1.begin=4',
         f'param_scheduler.1.end={ITERS}', 'val_cfg=None', 'val_dataloader=None', 'val_evaluator=None',
         'randomness.deterministic=True'],
        cwd, PYTHONPATH=HELPERS_DIR)


def last_checkpoint(work_dir):
    return (work_dir / 'last_checkpoint').read_text()


def assert_same_training_state(path_a, path_b):
    a, b = safe_load(str(path_a)), safe_load(str(path_b))
    assert a['meta']['iter'] == b['meta']['iter'] == ITERS
    assert a['state_dict'].keys() == b['state_dict'].keys()
    differing = [key for key in a['state_dict'] if not torch.equal(a['state_dict'][key], b['state_dict'][key])]
    assert not differing, f'{len(differing)} tensors differ, e.g. {differing[:3]}'
    moments = [(a_state, b_state) for a_state, b_state in
               zip(a['optimizer']['state'].values(), b['optimizer']['state'].values())]
    assert len(moments) == len(a['optimizer']['state']) == len(b['optimizer']['state'])
    assert all(torch.equal(sa[name], sb[name]) for sa, sb in moments for name in ('exp_avg', 'exp_avg_sq'))
    assert a['param_schedulers'] == b['param_schedulers']


def test_killed_runs_resume_to_the_weights_of_an_uninterrupted_run(builtin_workspace):
    cwd = builtin_workspace
    plain = config_with(cwd, 'plain', [])
    kill_at_6 = config_with(cwd, 'kill_at_6', ["dict(type='KillAfterIterationHook', iteration=6)"])
    kill_saving_8 = config_with(cwd, 'kill_saving_8', ["dict(type='KillWhileSavingHook', iteration=8)"])

    uninterrupted = cwd / 'uninterrupted'
    result = train(cwd, plain, uninterrupted)
    assert result.returncode == 0, result.stderr[-3000:]

    # killed between iterations 6 and 7: the checkpoint of iteration 4 is the latest
    interrupted = cwd / 'interrupted'
    result = train(cwd, kill_at_6, interrupted)
    assert result.returncode == KILLED, result.stderr[-3000:]
    assert last_checkpoint(interrupted).endswith('iter_4.pth')

    # resumed, then killed half-way through writing the checkpoint of iteration 8, which would have replaced
    # that of iteration 4 (one is kept): iteration 4's stays whole and latest, nothing is named iter_8.pth
    result = train(cwd, kill_saving_8, interrupted, '--resume')
    assert result.returncode == KILLED, result.stderr[-3000:]
    assert 'resumed epoch: 0, iter: 4' in result.stdout + result.stderr
    assert (interrupted / 'iter_8.pth.part').is_file() and not (interrupted / 'iter_8.pth').exists()
    assert last_checkpoint(interrupted).endswith('iter_4.pth')
    assert safe_load(str(interrupted / 'iter_4.pth'))['meta']['iter'] == 4

    result = train(cwd, plain, interrupted, '--resume')
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'resumed epoch: 0, iter: 4' in result.stdout + result.stderr
    assert sorted(p.name for p in interrupted.glob('iter_*')) == [f'iter_{ITERS}.pth']  # outdated and partial gone
    assert_same_training_state(uninterrupted / f'iter_{ITERS}.pth', interrupted / f'iter_{ITERS}.pth')


def test_mmengines_own_checkpoint_hook_loses_the_run_when_killed_while_saving(builtin_workspace):
    """Why the configs use AtomicCheckpointHook: mmengine's hook deletes the kept checkpoint before it writes
    the next one in place, so a kill while it writes leaves nothing to resume from."""
    config = config_with(builtin_workspace, 'stock_kill_saving_8', ["dict(type='KillWhileSavingHook', iteration=8)"],
                         checkpoint_hook='CheckpointHook')
    work_dir = builtin_workspace / 'stock_hook'
    result = train(builtin_workspace, config, work_dir)
    assert result.returncode == KILLED, result.stderr[-3000:]
    assert not (work_dir / 'iter_4.pth').exists()
    with pytest.raises(CheckpointError, match='truncated'):
        safe_load(str(work_dir / 'iter_8.pth'))


def test_a_kill_while_saving_the_best_checkpoint_leaves_no_truncated_best(builtin_workspace):
    config = config_with(builtin_workspace, 'kill_saving_best', ["dict(type='KillWhileSavingBestHook')"])
    work_dir = builtin_workspace / 'kill_saving_best'
    result = run_tool(
        ['train.py', config, '--work-dir', str(work_dir), '--cfg-options', 'train_cfg.max_iters=4',
         'train_cfg.val_interval=4', 'param_scheduler.0.end=2', 'param_scheduler.1.begin=2', 'param_scheduler.1.end=4',
         'default_hooks.checkpoint.save_best=mIoU', 'default_hooks.checkpoint.rule=greater'],
        builtin_workspace, PYTHONPATH=HELPERS_DIR)
    assert result.returncode == KILLED, result.stderr[-3000:]
    # the half-written best is only a .part; the regular checkpoint of that iteration is whole
    assert (work_dir / 'best_mIoU_iter_4.pth.part').is_file() and not (work_dir / 'best_mIoU_iter_4.pth').exists()
    assert safe_load(str(work_dir / 'iter_4.pth'))['meta']['iter'] == 4
