"""Optimizer steps that mixed-precision training skipped, counted and shown.

A loss scaler skips the optimizer step of an iteration whose scaled gradients are not finite. With a dynamic scale
it then halves the scale; with the static scale of the paper configs (512, as the release trained) the scale stays,
and a run can skip step after step with nothing in its log but a loss that stops falling.
"""
from typing import Optional

from mmengine.hooks import Hook, LoggerHook
from mmengine.optim import OptimWrapperDict
from mmengine.registry import HOOKS


class TooManySkippedSteps(RuntimeError):
    """More of a run's optimizer steps were skipped for non-finite gradients than its config allows."""


@HOOKS.register_module()
class SkippedStepsHook(Hook):
    """Counts the optimizer steps that were due and did not run, logs them each logging interval, gives the run's
    total at its end, and stops the run when too many are skipped.

    An optimizer step is due when the optim wrapper updates (every ``accumulative_counts`` iterations); it ran when
    the optimizer's step hook fired. Without a loss scaler every due step runs and nothing is logged. The counts
    live in the message hub, so a resumed run goes on counting.

    Args:
        max_share: the run stops (:class:`TooManySkippedSteps`) once more than this share of its due steps were
            skipped; checked at each logging interval.
        min_steps: how many steps are due before the share is checked: a dynamic scale skips the first steps
            while it falls from its initial 65536 to what the gradients allow, one for each halving.
        interval: iterations between checks; by default the logger hook's interval.
    """

    priority = 'BELOW_NORMAL'
    SKIPPED, DUE = 'skipped_optimizer_steps', 'due_optimizer_steps'

    def __init__(self, max_share: float = 0.1, min_steps: int = 500, interval: Optional[int] = None):
        if not 0 <= max_share <= 1:
            raise ValueError(f'max_share is a share of the steps, between 0 and 1, not {max_share!r}')
        self.max_share, self.min_steps, self.interval = max_share, min_steps, interval
        self._ran = {}  # id(optimizer) -> whether its step ran since the last iteration
        self._skipped_in_interval = self._due_in_interval = 0

    def before_train(self, runner) -> None:
        if self.interval is None:
            self.interval = next((hook.interval for hook in runner.hooks if isinstance(hook, LoggerHook)), 50)
        for wrapper in self._wrappers(runner):
            self._ran[id(wrapper.optimizer)] = False
            wrapper.optimizer.register_step_post_hook(self._record_step)

    def _record_step(self, optimizer, args, kwargs) -> None:
        self._ran[id(optimizer)] = True

    @staticmethod
    def _wrappers(runner):
        wrapper = runner.optim_wrapper
        return list(wrapper.values()) if isinstance(wrapper, OptimWrapperDict) else [wrapper]

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        hub = runner.message_hub
        for wrapper in self._wrappers(runner):
            if wrapper.should_update():  # asked after this iteration's update, so: was a step due in it
                ran, self._ran[id(wrapper.optimizer)] = self._ran[id(wrapper.optimizer)], False
                self._due_in_interval += 1
                self._skipped_in_interval += not ran
                hub.update_info(self.DUE, hub.get_info(self.DUE, 0) + 1)
                hub.update_info(self.SKIPPED, hub.get_info(self.SKIPPED, 0) + (not ran))
        if self.every_n_train_iters(runner, self.interval) or self.is_last_train_iter(runner):
            self._report(runner)

    def _report(self, runner) -> None:
        skipped, due = runner.message_hub.get_info(self.SKIPPED, 0), runner.message_hub.get_info(self.DUE, 0)
        if self._skipped_in_interval:
            runner.logger.warning(
                f'{self._skipped_in_interval} of the last {self._due_in_interval} optimizer steps were skipped: '
                f'their gradients were not finite{self._at_scale(runner)} ({skipped} of {due} in this run)')
        self._skipped_in_interval = self._due_in_interval = 0
        if due >= self.min_steps and skipped > self.max_share * due:
            raise TooManySkippedSteps(
                f'{skipped} of the {due} optimizer steps so far were skipped because their gradients were not '
                f'finite{self._at_scale(runner)}, more than SkippedStepsHook.max_share={self.max_share} allows. '
                f"Lower the optim wrapper's loss_scale or make it 'dynamic', train in fp32 or bfloat16, or look "
                f'for the loss that diverges')

    def _at_scale(self, runner) -> str:
        scales = [wrapper.loss_scaler.get_scale() for wrapper in self._wrappers(runner)
                  if hasattr(wrapper, 'loss_scaler')]
        return f' at loss scale {", ".join(f"{scale:g}" for scale in scales)}' if scales else ''

    def after_train(self, runner) -> None:
        skipped, due = runner.message_hub.get_info(self.SKIPPED, 0), runner.message_hub.get_info(self.DUE, 0)
        if skipped or any(hasattr(wrapper, 'loss_scaler') for wrapper in self._wrappers(runner)):
            runner.logger.info(f'{skipped} of {due} optimizer steps were skipped for non-finite gradients')
