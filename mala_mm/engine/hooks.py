"""Hooks that let a training run be killed at any moment and resumed to the same result.

- :class:`AtomicCheckpointHook`: a checkpoint is either complete or absent, and the previous one stays until
  the new one is in place.
- :class:`IterationSeedHook`: the model's random draws depend on the iteration, not on the process's history.
- :class:`SyncNormStatsHook`: every process holds the same BatchNorm statistics, so the model that validates
  is the model that is saved.
"""
import glob
import os
import os.path as osp
from contextlib import contextmanager
from typing import Callable, Iterable, List, Optional

import numpy as np
import torch
from mmengine.dist import all_reduce_params, get_rank, is_distributed, is_main_process
from mmengine.fileio import LocalBackend, register_backend
from mmengine.hooks import CheckpointHook, Hook
from mmengine.registry import HOOKS
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _NormBase


def replace_durably(src: str, dst: str) -> None:
    """Rename the complete file ``src`` to ``dst`` after flushing it to disk: ``dst`` is either its old
    content or the whole new one, even if the process is killed or the machine loses power."""
    with open(src, 'rb') as f:
        os.fsync(f.fileno())
    os.replace(src, dst)
    directory = os.open(osp.dirname(osp.abspath(dst)), os.O_RDONLY)
    try:
        os.fsync(directory)  # makes the rename itself durable
    finally:
        os.close(directory)


class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend, registered as ``'atomic_local'``, whose writes are atomic and durable:
    ``put`` and ``put_text`` write ``<path>.part`` and rename it to ``<path>`` once complete and on disk.

    Inside :meth:`removals_after`, ``remove`` only records a path; the files are removed when the block ends
    without an error, so that a file is never removed before what replaces it is written.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.deferred_removals: Optional[List[str]] = None

    def put(self, obj: bytes, filepath) -> None:
        super().put(obj, f'{filepath}.part')
        replace_durably(f'{filepath}.part', str(filepath))

    def put_text(self, obj: str, filepath, encoding: str = 'utf-8') -> None:
        super().put_text(obj, f'{filepath}.part', encoding)
        replace_durably(f'{filepath}.part', str(filepath))

    def remove(self, filepath) -> None:
        if self.deferred_removals is None:
            super().remove(filepath)
        else:
            self.deferred_removals.append(str(filepath))

    @contextmanager
    def removals_after(self, keep: Callable[[], Iterable[str]] = tuple):
        """Defer ``remove`` to the end of the block, then remove what was asked for except the paths ``keep()``
        returns then (a file written again under the name it replaces)."""
        self.deferred_removals = []
        try:
            yield
            kept = set(map(str, keep()))
            for path in self.deferred_removals:
                if path not in kept and osp.isfile(path):
                    super().remove(path)
        finally:
            self.deferred_removals = None


register_backend('atomic_local', AtomicLocalBackend)


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """:class:`~mmengine.hooks.CheckpointHook` that survives being killed while it saves.

    mmengine's hook first deletes the oldest checkpoint beyond ``max_keep_ckpts`` (and the previous best), then
    writes the new one under its final name: a kill during the write leaves a truncated file and, with
    ``max_keep_ckpts=1``, no usable checkpoint at all. This hook saves to local folders through
    :class:`AtomicLocalBackend`: every checkpoint is written as ``<name>.part`` and renamed once complete, and the
    files mmengine deletes are deleted only after the hook's save has finished, ``last_checkpoint`` by then
    pointing at the new one. A ``.part`` file left by a killed run is removed when training starts again.

    Takes the same arguments as ``CheckpointHook``. Checkpoints on remote storage (an ``out_dir`` URL, or
    ``backend_args``/``file_client_args`` of the config's own), whose objects are written whole, are saved as
    mmengine saves them.
    """

    def before_train(self, runner) -> None:
        if self.backend_args is None and self.file_client_args is None and '://' not in str(self.out_dir or ''):
            self.backend_args = dict(backend='atomic_local')
        super().before_train(runner)
        if isinstance(self.file_backend, AtomicLocalBackend) and is_main_process():
            pattern = osp.join(self.out_dir, self.filename_tmpl.replace('{}', '*') + '.part')
            for leftover in glob.glob(pattern) + glob.glob(osp.join(self.out_dir, 'best_*.part')):
                os.remove(leftover)

    @contextmanager
    def _saving(self, runner):
        """Around each of mmengine's hook methods that may save: the removals it asks for wait until its save
        is complete and ``last_checkpoint`` names the new checkpoint durably."""
        if not isinstance(self.file_backend, AtomicLocalBackend):
            yield
            return
        last = self.last_ckpt
        with self.file_backend.removals_after(keep=self._current_files):
            yield
            if self.last_ckpt != last and is_main_process():
                self.file_backend.put_text(self.last_ckpt, osp.join(runner.work_dir, 'last_checkpoint'))

    def _current_files(self) -> List[str]:
        # the best checkpoints' paths exist with save_best only
        best = [getattr(self, 'best_ckpt_path', None), *getattr(self, 'best_ckpt_path_dict', {}).values()]
        return [path for path in (self.last_ckpt, *best) if path]

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        with self._saving(runner):
            super().after_train_iter(runner, batch_idx, data_batch, outputs)

    def after_train_epoch(self, runner) -> None:
        with self._saving(runner):
            super().after_train_epoch(runner)

    def after_val_epoch(self, runner, metrics) -> None:
        with self._saving(runner):
            super().after_val_epoch(runner, metrics)

    def after_train(self, runner) -> None:
        with self._saving(runner):
            super().after_train(runner)


@HOOKS.register_module()
class IterationSeedHook(Hook):
    """Seeds torch's generators at the start of every training iteration from (seed, rank, iteration).

    Drop path, dropout and RoI sampling then draw the same numbers at a given iteration whether the run went
    there in one go or was killed and resumed from a checkpoint: the checkpoint does not hold torch's
    generator state, and whatever ran before the iteration (validation, data loader start-up) no longer
    matters. The data pipeline's numpy and ``random`` draws need no help: on resume mmengine replays the data
    loader up to the checkpoint's iteration, drawing them again.
    """

    priority = 'VERY_HIGH'  # before any other hook of the iteration could draw

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        # SeedSequence mixes the three numbers, so that neighbouring seeds do not give shifted streams
        state = np.random.SeedSequence([runner.seed, get_rank(), runner.iter]).generate_state(1, np.uint64)
        torch.manual_seed(int(state[0]))


@HOOKS.register_module()
class SyncNormStatsHook(Hook):
    """Averages the model's normalisation statistics (:func:`norm_statistics`) over the processes after every
    training iteration.

    Without SyncBN (on CPU, or with plain BN) each process's running statistics follow its own batches. Only
    rank 0's go into a checkpoint, while validation at the end of training runs every process on its own
    statistics, so the printed metrics are not those of the saved model. mmengine's ``SyncBuffersHook``
    averages before validation, but only after the checkpoint of that iteration is saved. The running
    statistics are linear in the batch statistics, so averaging at every step gives what averaging at the end
    would, and it does not touch training itself: BN in training mode normalises with the batch's own
    statistics. The buffers are a few thousand numbers, all-reduced in one call.
    """

    priority = 'ABOVE_NORMAL'  # before CheckpointHook saves

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if is_distributed():
            statistics = norm_statistics(runner.model)
            if statistics:
                all_reduce_params(statistics, op='mean')


def norm_statistics(model: nn.Module) -> List[Tensor]:
    """The running statistics of ``model``'s BatchNorm and InstanceNorm layers. Other buffers, RoPE's angles
    among them, are the same on every process and stay untouched: a mean over a ring moves them by rounding."""
    return [buffer for module in model.modules() if isinstance(module, _NormBase)
            for buffer in module.buffers(recurse=False) if buffer.is_floating_point()]
