"""Hooks that the resume and cluster tests load into child runs: SIGKILLs at chosen points, a dump of each
process's buffers, and the threads a process still has when the interpreter begins to exit."""
import atexit
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


@HOOKS.register_module()
class SaveBuffersHook(Hook):
    """Saves this process's model buffers (BatchNorm statistics) to ``<folder>/rank<r>.pth`` after training."""

    priority = 'LOWEST'

    def __init__(self, folder: str):
        self.folder = folder

    def after_train(self, runner):
        import torch
        from mmengine.dist import get_rank
        model = getattr(runner.model, 'module', runner.model)
        torch.save({name: b.clone() for name, b in model.named_buffers()}, f'{self.folder}/rank{get_rank()}.pth')


@HOOKS.register_module()
class KillWhileSavingBestHook(Hook):
    """Kills the run half-way through writing the first ``save_best`` checkpoint (a file named ``best_*``)."""

    def before_train(self, runner):
        put = LocalBackend.put

        def write_half_and_die_on_best(backend, data: bytes, filepath):
            if os.path.basename(str(filepath)).startswith('best_'):
                with open(filepath, 'wb') as f:
                    f.write(data[:len(data) // 2])
                die()
            return put(backend, data, filepath)

        LocalBackend.put = write_half_and_die_on_best


@HOOKS.register_module()
class ThreadsAtExitHook(Hook):
    """Writes the names of the process's native threads (gloo's workers are 'pt_gloo_runloop') to
    ``folder/threads_rank{RANK}.txt`` when the interpreter begins to exit, after the tool has returned."""

    def __init__(self, folder: str):
        path = os.path.join(folder, f'threads_rank{os.environ.get("RANK", 0)}.txt')
        atexit.register(self._write_thread_names, path)

    @staticmethod
    def _write_thread_names(path: str):
        names = []
        for tid in os.listdir('/proc/self/task'):
            with open(f'/proc/self/task/{tid}/comm') as f:
                names.append(f.read().strip())
        with open(path, 'w') as f:
            f.write('\n'.join(sorted(names)))
