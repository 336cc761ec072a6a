"""Hooks that SIGKILL the training process at chosen points; the resume tests import them into child runs."""
import os
import signal

from mmengine.fileio import LocalBackend
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


def die():
    os.kill(os.getpid(), signal.SIGKILL)


@HOOKS.register_module()
class KillAfterIterationHook(Hook):
    """Kills the run once training iteration ``iteration`` (1-based) is done."""

    priority = 'LOWEST'

    def __init__(self, iteration: int):
        self.iteration = iteration

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter + 1 == self.iteration:
            die()


@HOOKS.register_module()
class KillWhileSavingHook(Hook):
    """Kills the run half-way through writing the checkpoint of iteration ``iteration``: the file being
    written holds the first half of the checkpoint's bytes."""

    def __init__(self, iteration: int):
        self.iteration = iteration

    def before_save_checkpoint(self, runner, checkpoint):
        if checkpoint['meta']['iter'] != self.iteration:
            return

        def write_half_and_die(backend, data: bytes, filepath):
            with open(filepath, 'wb') as f:
                f.write(data[:len(data) // 2])
            die()

        LocalBackend.put = write_half_and_die


class _Once:
    """Fires on one process (global rank ``rank``) and only the first time, across restarts: the marker
    file records that it fired."""

    def __init__(self, rank: int, marker: str):
        self.rank, self.marker = rank, marker

    def fire(self) -> bool:
        from mmengine.dist import get_rank
        if get_rank() != self.rank or os.path.exists(self.marker):
            return False
        open(self.marker, 'w').close()
        return True


@HOOKS.register_module()
class KillRankOnceHook(Hook):
    """SIGKILLs process ``rank`` once training iteration ``iteration`` (1-based) is done, the first time only."""

    priority = 'LOWEST'

    def __init__(self, iteration: int, rank: int, marker: str):
        self.iteration, self.once = iteration, _Once(rank, marker)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter + 1 == self.iteration and self.once.fire():
            die()


@HOOKS.register_module()
class KillWhileSavingOnceHook(KillWhileSavingHook):
    """:class:`KillWhileSavingHook` on process ``rank``, the first time only."""

    def __init__(self, iteration: int, rank: int, marker: str):
        super().__init__(iteration)
        self.once = _Once(rank, marker)

    def before_save_checkpoint(self, runner, checkpoint):
        if checkpoint['meta']['iter'] == self.iteration and self.once.fire():
            super().before_save_checkpoint(runner, checkpoint)
