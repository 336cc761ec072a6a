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
