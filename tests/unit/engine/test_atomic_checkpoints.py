"""AtomicCheckpointHook and its file backend in a real mmengine Runner (a toy model, so that the seconds go to
what is checked): a save that fails half-way leaves the previous checkpoint whole and named by
``last_checkpoint``, and files mmengine deletes are deleted only after the save that replaces them. The SIGKILL
runs of the real training tool are in test_resume.py."""
import os

import pytest
import torch
from mmengine.fileio import LocalBackend
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch import nn

from mala_mm.engine import AtomicCheckpointHook  # noqa: F401 (registers it)
from mala_mm.engine.hooks import AtomicLocalBackend


class ToyModel(BaseModel):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, inputs, mode='tensor'):
        loss = self.linear(inputs).square().mean()
        return dict(loss=loss) if mode == 'loss' else [loss]


class SaveFailed(RuntimeError):
    pass


def train(work_dir, iters: int, fail_at_iter: int = 0, **hook_args):
    """Train the toy model ``iters`` iterations with a checkpoint every iteration; the write of the checkpoint
    of iteration ``fail_at_iter`` stops half-way with SaveFailed."""
    put = LocalBackend.put

    def put_or_fail_half_way(backend, data, filepath):
        if fail_at_iter and os.path.basename(str(filepath)).startswith(f'iter_{fail_at_iter}.pth'):
            put(backend, data[:len(data) // 2], filepath)
            raise SaveFailed(filepath)
        put(backend, data, filepath)

    runner = Runner(
        model=ToyModel(), work_dir=str(work_dir), default_scope='mmengine',
        train_dataloader=dict(dataset=[dict(inputs=torch.ones(2))] * 4,
                              sampler=dict(type='DefaultSampler', shuffle=False), batch_size=1,
                              collate_fn=dict(type='default_collate')),
        train_cfg=dict(by_epoch=False, max_iters=iters), optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        default_hooks=dict(checkpoint=dict(type='AtomicCheckpointHook', interval=1, by_epoch=False, **hook_args)))
    try:
        LocalBackend.put = put_or_fail_half_way
        runner.train()
    finally:
        LocalBackend.put = put


def test_a_failed_save_keeps_the_kept_checkpoint_whole_and_latest(tmp_path):
    with pytest.raises(SaveFailed):
        train(tmp_path, iters=3, fail_at_iter=2, max_keep_ckpts=1)
    # mmengine asked to delete iteration 1's checkpoint before writing iteration 2's; the deletion waited
    names = sorted(p.name for p in tmp_path.glob('iter_*'))
    assert names == ['iter_1.pth', 'iter_2.pth.part'], names
    assert (tmp_path / 'last_checkpoint').read_text().endswith('iter_1.pth')
    assert torch.load(tmp_path / 'iter_1.pth', weights_only=False)['meta']['iter'] == 1


def test_outdated_checkpoints_go_once_the_new_one_is_written(tmp_path):
    train(tmp_path, iters=3, max_keep_ckpts=2)
    assert sorted(p.name for p in tmp_path.glob('iter_*')) == ['iter_2.pth', 'iter_3.pth']
    assert (tmp_path / 'last_checkpoint').read_text().endswith('iter_3.pth')
    # a resumed run finds no partial file and goes on deleting the right ones
    (tmp_path / 'iter_4.pth.part').write_bytes(b'half')
    train(tmp_path, iters=4, max_keep_ckpts=2, out_dir=None)
    assert sorted(p.name for p in tmp_path.glob('iter_*')) == ['iter_3.pth', 'iter_4.pth']


def test_the_backend_removes_after_the_block_and_never_a_kept_path(tmp_path):
    backend = AtomicLocalBackend()
    for name in 'abc':
        backend.put(name.encode(), tmp_path / name)
    with backend.removals_after(keep=lambda: [str(tmp_path / 'b')]):
        backend.remove(tmp_path / 'a')
        backend.remove(tmp_path / 'b')
        assert sorted(os.listdir(tmp_path)) == ['a', 'b', 'c']
    assert sorted(os.listdir(tmp_path)) == ['b', 'c']
    with pytest.raises(SaveFailed), backend.removals_after():
        backend.remove(tmp_path / 'c')
        raise SaveFailed
    assert sorted(os.listdir(tmp_path)) == ['b', 'c']
    backend.remove(tmp_path / 'c')  # outside a block: at once
    assert sorted(os.listdir(tmp_path)) == ['b']
