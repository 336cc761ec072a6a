"""What a training run says and sets at its start: the line about a total batch other than the one its recipe's
learning rate is set for (the recipe check's, for a config of a paper row), and the port a slurm job's processes
meet at."""
import os

import pytest

from mala_tools import distributed
from mala_tools.checks.batch import batch_notice
from tests.helpers import CONFIG_ROOT, call_tool, load_config

PAPER_CONFIG = str(CONFIG_ROOT / 'segmentation/upernet_mala_b.py')  # 2 images a process, lr set for 16


@pytest.mark.parametrize('processes, line', [
    (8, None),
    (16, "note: this run trains a total batch of 32 images (16 processes x 2), and the config's learning rate is "
         'set for 16 (auto_scale_lr.base_batch_size): --auto-scale-lr scales it by 32/16'),
    (1, "note: this run trains a total batch of 2 images (1 process x 2), and the config's learning rate is set "
        'for 16 (auto_scale_lr.base_batch_size): --auto-scale-lr scales it by 2/16')])
def test_a_total_batch_other_than_the_recipes_is_named(processes, line):
    assert batch_notice(load_config(PAPER_CONFIG), processes) == line


def test_no_batch_line_where_the_lr_is_scaled_or_no_base_batch_is_named():
    scaled = load_config(PAPER_CONFIG)
    scaled.auto_scale_lr.enable = True
    assert batch_notice(scaled, 16) is None
    assert batch_notice(load_config(CONFIG_ROOT / 'detection/mask_rcnn_mala_t_builtin.py'), 16) is None


@pytest.mark.parametrize('own_classes, line', [
    (False, 'recipe: - total batch: 32 images (1 GPU x 32) where upernet_mala_b trains 16 (8 x 2): the lr 6e-05 is '
            'set for 16 images; --auto-scale-lr scales it to 0.00012'),
    (True, 'note: this run trains a total batch of 32 images (1 process x 32)')])
def test_train_prints_the_batch_line_at_its_start(tmp_path, own_classes, line):
    """A paper config run as one process of 32 images: the recipe check's line for its row, or, over data of
    one's own (other classes), which reproduces no row, the batch line; before the pre-flight refuses the missing
    dataset."""
    options = ['train_dataloader.batch_size=32'] + ['train_dataloader.dataset.metainfo.classes=[a,b]'] * own_classes
    result = call_tool(['train.py', PAPER_CONFIG, '--cfg-options', *options], tmp_path)
    assert result.returncode == 2
    assert line in result.stderr, result.stderr
    assert ('recipe:' in result.stderr) != own_classes


def slurm_config():
    cfg = load_config(PAPER_CONFIG)
    cfg.launcher = 'slurm'
    return cfg


def slurm_job(monkeypatch, job_id, **env):
    monkeypatch.delenv('MASTER_PORT', raising=False)
    for name, value in dict(SLURM_JOB_ID=job_id, SLURM_NODELIST='node[1-2]', SLURM_PROCID='0', SLURM_NTASKS='2',
                            SLURM_LOCALID='0', **env).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(distributed.subprocess, 'getoutput', lambda command: 'node1\nnode2')


@pytest.mark.parametrize('cuda', [False, True], ids=['gloo', 'cuda'])
def test_slurm_jobs_meet_at_a_port_of_their_own(monkeypatch, cuda):
    """Two jobs sharing a node took port 29500 both; each now takes one from its job id, on either start path."""
    ports = []
    monkeypatch.setattr(distributed.torch.cuda, 'is_available', lambda: cuda)
    monkeypatch.setattr(distributed, 'init_dist', lambda launcher, **options: ports.append(os.environ['MASTER_PORT']))
    monkeypatch.setattr(distributed, 'init_gloo', lambda: ports.append(os.environ['MASTER_PORT']))
    for job_id in ('481516', '481517'):
        slurm_job(monkeypatch, job_id)
        distributed.setup_distributed(slurm_config())
    assert ports == ['21516', '21517']


def test_a_master_port_set_for_the_job_is_kept(monkeypatch):
    monkeypatch.setattr(distributed.torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(distributed, 'init_gloo', lambda: None)
    slurm_job(monkeypatch, '481516')
    monkeypatch.setenv('MASTER_PORT', '31337')
    distributed.setup_distributed(slurm_config())
    assert os.environ['MASTER_PORT'] == '31337'
