"""The config changes that fit a run to this machine (mala_tools.machine_fit): SyncBN becomes BN for CPU processes,
the optim wrapper follows the device, and a run prints each change and dumps the config it ran."""
import os.path as osp

import pytest
from mmengine.config import Config

from mala_tools.machine_fit import REMOVED, describe_changes, fit_optim_wrapper_to_device, sync_bn_to_bn
from tests.helpers import ROOT, load_config, run_tool

SEG_CONFIG = osp.join(ROOT, 'configs/segmentation/upernet_mala_t_builtin.py')


@pytest.mark.parametrize('config', ['detection/mask_rcnn_mala_s.py', 'detection/cascade_mask_rcnn_mala_s_3x.py',
                                    'segmentation/upernet_mala_s.py'])
def test_every_syncbn_of_a_paper_config_becomes_bn_for_cpu_processes(config):
    cfg = load_config(f'{ROOT}/configs/{config}')
    assert 'SyncBN' in str(cfg.model)
    changes = sync_bn_to_bn(cfg.model)
    assert changes and 'SyncBN' not in str(cfg.model) and "'BN'" in str(cfg.model)
    assert all(change.key.startswith('model.') and change.key.endswith('.type') and
               (change.before, change.after) == ('SyncBN', 'BN') for change in changes)


def test_optim_wrapper_follows_the_device():
    paper = load_config(f'{ROOT}/configs/detection/mask_rcnn_mala_s.py').optim_wrapper
    assert (paper.type, paper.loss_scale) == ('AmpOptimWrapper', 512.)
    on_cpu = paper.copy()
    changes = fit_optim_wrapper_to_device(on_cpu, amp=False, cuda=False)
    assert [(c.key, c.before, c.after) for c in changes] == [
        ('optim_wrapper.type', 'AmpOptimWrapper', 'OptimWrapper'), ('optim_wrapper.loss_scale', 512., REMOVED)]
    assert "optim_wrapper.type: 'AmpOptimWrapper' -> 'OptimWrapper', optim_wrapper.loss_scale: 512.0 -> " \
           '(removed) (fp16 mixed precision needs CUDA, so this run trains in fp32' in describe_changes(changes)
    assert on_cpu.type == 'OptimWrapper' and 'loss_scale' not in on_cpu and on_cpu.optimizer == paper.optimizer
    bf16 = paper.copy()
    assert [c.after for c in fit_optim_wrapper_to_device(bf16, amp=True, cuda=False)] == ['CPUAmpOptimWrapper',
                                                                                          REMOVED]
    assert bf16.type == 'CPUAmpOptimWrapper' and 'loss_scale' not in bf16
    fp32 = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-3))
    for amp, cuda in ((False, False), (False, True)):
        unchanged = dict(fp32)
        assert fit_optim_wrapper_to_device(unchanged, amp, cuda) == [] and unchanged == fp32
    on_gpu = dict(fp32)
    fit_optim_wrapper_to_device(on_gpu, amp=True, cuda=True)
    assert (on_gpu['type'], on_gpu['loss_scale']) == ('AmpOptimWrapper', 'dynamic')
    for amp in (False, True):  # on CUDA the paper's fp16 stays as configured, static loss scale included
        paper_on_gpu = paper.copy()
        assert fit_optim_wrapper_to_device(paper_on_gpu, amp=amp, cuda=True) == []
        assert paper_on_gpu == paper


@pytest.mark.slow
def test_what_a_cpu_run_changes_is_printed_and_in_the_dumped_config(builtin_workspace, tmp_path):
    """Two CPU processes of a config with fp16 and SyncBN: the tool prints each key it changes, once, and the
    config the Runner dumps into the work dir has the same changes, so that it reproduces the run."""
    config = tmp_path / 'fp16_syncbn.py'
    config.write_text(f'_base_ = {SEG_CONFIG!r}\n'
                      "optim_wrapper = dict(type='AmpOptimWrapper', loss_scale=512.)\n"
                      "model = dict(decode_head=dict(norm_cfg=dict(type='SyncBN', requires_grad=True)))\n")
    work_dir = tmp_path / 'work'
    result = run_tool(['dist_train.sh', str(config), '2', '--work-dir', str(work_dir), '--cfg-options',
                       'train_cfg.max_iters=1', 'val_cfg=None', 'val_dataloader=None', 'val_evaluator=None'],
                      builtin_workspace)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("this machine runs the config with these keys changed") == 1
    assert ("optim_wrapper.type: 'AmpOptimWrapper' -> 'OptimWrapper', optim_wrapper.loss_scale: 512.0 -> (removed)"
            in result.stderr)
    assert "model.decode_head.norm_cfg.type: 'SyncBN' -> 'BN'" in result.stderr
    assert "model_wrapper_cfg: None -> {'type': 'MMDistributedDataParallel', 'device_ids': None}" in result.stderr
    ran = Config.fromfile(str(work_dir / 'fp16_syncbn.py'))  # the Runner dumps the config it ran by its name
    assert ran.optim_wrapper.type == 'OptimWrapper' and 'loss_scale' not in ran.optim_wrapper
    assert ran.model.decode_head.norm_cfg.type == 'BN' and 'SyncBN' not in str(ran.model)
    assert ran.model_wrapper_cfg == dict(type='MMDistributedDataParallel', device_ids=None)
