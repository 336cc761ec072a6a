"""Steps that a loss scaler skips for non-finite gradients are counted in the log, totalled at the run's end, carried
through a resume, and stop a run that skips too many (mala_mm.engine.SkippedStepsHook), with mmengine's Runner
training on CPU.

mmengine's AmpOptimWrapper builds only where CUDA is; the wrapper here does on CPU what it does with a float
``loss_scale``: torch's GradScaler with a fixed scale, which skips the step of an iteration whose scaled gradients
are not finite."""
import logging

import pytest
import torch
from mmengine.model import BaseModel
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS
from mmengine.runner import Runner
from torch import nn

from mala_mm.engine import SkippedStepsHook, TooManySkippedSteps

LOSS_SCALE = 512.
# torch.amp.GradScaler, which runs on CPU, is not in every torch this package supports (torch 2.1 has only CUDA's);
# the hook itself needs no scaler
pytestmark = pytest.mark.skipif(not hasattr(torch.amp, 'GradScaler'),
                                reason='this torch has no torch.amp.GradScaler, which runs on CPU')


@OPTIM_WRAPPERS.register_module(force=True)
class CPUStaticScaleOptimWrapper(OptimWrapper):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.loss_scaler = torch.amp.GradScaler('cpu', init_scale=LOSS_SCALE)

    def backward(self, loss, **kwargs):
        self.loss_scaler.scale(loss).backward(**kwargs)
        self._inner_count += 1

    def step(self, **kwargs):
        self.loss_scaler.step(self.optimizer, **kwargs)
        self.loss_scaler.update(LOSS_SCALE)


class Regression(BaseModel):
    """y = w x; the samples whose index is in ``non_finite`` make the loss infinite, and with it the gradient."""

    def __init__(self, non_finite):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(1))
        self.non_finite = set(non_finite)

    def forward(self, x, index, mode='loss'):
        loss = ((self.weight * x - 2 * x) ** 2).mean()
        if set(index.tolist()) & self.non_finite:
            loss = loss * float('inf')
        return dict(loss=loss)


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, index):
        return dict(x=torch.tensor([1.0]), index=index)


def runner(tmp_path, non_finite, iters, hook=dict(), accumulative_counts=1, resume=False):
    return Runner(
        model=Regression(non_finite), work_dir=str(tmp_path),
        train_dataloader=dict(dataset=Samples(), sampler=dict(type='DefaultSampler', shuffle=False), batch_size=1,
                              collate_fn=dict(type='default_collate'),
                              num_workers=0),
        optim_wrapper=dict(type='CPUStaticScaleOptimWrapper', accumulative_counts=accumulative_counts,
                           optimizer=dict(type='SGD', lr=0.01)),
        train_cfg=dict(by_epoch=False, max_iters=iters), resume=resume,
        default_hooks=dict(logger=dict(type='LoggerHook', interval=10),
                           checkpoint=dict(type='CheckpointHook', interval=10, by_epoch=False)),
        custom_hooks=[dict(type='SkippedStepsHook', **hook)],
        experiment_name=f'{tmp_path.name}_{len(list(tmp_path.iterdir()))}',
        default_scope='mmengine', log_level='INFO')


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def train(run):
    lines = Lines()
    run.logger.addHandler(lines)
    try:
        run.train()
    finally:
        run.logger.removeHandler(lines)
    return lines.lines


def test_skipped_steps_are_logged_per_interval_and_totalled(tmp_path):
    run = runner(tmp_path, non_finite=[3, 4, 15], iters=30)
    lines = train(run)
    assert '2 of the last 10 optimizer steps were skipped: their gradients were not finite at loss scale 512 ' \
           '(2 of 10 in this run)' in lines
    assert '1 of the last 10 optimizer steps were skipped: their gradients were not finite at loss scale 512 ' \
           '(3 of 20 in this run)' in lines
    assert not any('(3 of 30 in this run)' in line for line in lines), 'an interval without skips is silent'
    assert '3 of 30 optimizer steps were skipped for non-finite gradients' in lines
    # the skipped steps did not move the weight: 27 SGD steps of w -= 0.02 (w - 2) from 1
    expected = 2 - 0.98 ** 27
    assert run.model.weight.item() == pytest.approx(expected, rel=1e-5)


def test_accumulated_steps_count_once_per_update(tmp_path):
    lines = train(runner(tmp_path, non_finite=[5], iters=20, accumulative_counts=2))
    assert '1 of the last 5 optimizer steps were skipped: their gradients were not finite at loss scale 512 ' \
           '(1 of 5 in this run)' in lines
    assert '1 of 10 optimizer steps were skipped for non-finite gradients' in lines


def test_counts_go_on_after_a_resume(tmp_path):
    train(runner(tmp_path, non_finite=[2], iters=10))
    lines = train(runner(tmp_path, non_finite=[12], iters=20, resume=True))
    assert '1 of the last 10 optimizer steps were skipped: their gradients were not finite at loss scale 512 ' \
           '(2 of 20 in this run)' in lines
    assert '2 of 20 optimizer steps were skipped for non-finite gradients' in lines


def test_a_run_of_only_overflows_stops_with_the_reason(tmp_path):
    run = runner(tmp_path, non_finite=range(1000), iters=100, hook=dict(max_share=0.5, min_steps=20))
    with pytest.raises(TooManySkippedSteps, match=r'20 of the 20 optimizer steps so far were skipped because their '
                       r'gradients were not finite at loss scale 512, more than SkippedStepsHook.max_share=0.5'):
        train(run)
    assert run.iter == 20 - 1  # stopped in its 20th iteration


def test_skips_before_min_steps_or_within_the_share_do_not_stop_a_run(tmp_path):
    # all of the first 10 skipped (as a dynamic scale's first steps may be), then none: 10 of 40 at the end
    lines = train(runner(tmp_path, non_finite=range(10), iters=40, hook=dict(max_share=0.25, min_steps=40)))
    assert '10 of 40 optimizer steps were skipped for non-finite gradients' in lines


def test_max_share_is_a_share():
    with pytest.raises(ValueError, match='between 0 and 1'):
        SkippedStepsHook(max_share=10)
