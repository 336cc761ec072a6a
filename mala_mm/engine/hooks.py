"""Hooks that let a training run be killed at any moment and resumed to the same result.

- :class:`AtomicCheckpointHook`: a checkpoint is either complete or absent, and the previous one stays until
  the new one is in place.
- :class:`IterationSeedHook`: the model's random draws depend on the iteration, not on the process's history.
"""
import glob
import os
import os.path as osp

import numpy as np
import torch
from mmengine.dist import get_rank, is_main_process
from mmengine.fileio import LocalBackend
from mmengine.hooks import CheckpointHook, Hook
from mmengine.registry import HOOKS


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


def write_text_durably(path: str, text: str) -> None:
    with open(f'{path}.part', 'w') as f:
        f.write(text)
    replace_durably(f'{path}.part', path)


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """:class:`~mmengine.hooks.CheckpointHook` that survives being killed while it saves.

    mmengine's hook first deletes the oldest checkpoint beyond ``max_keep_ckpts``, then writes the new one
    under its final name: a kill during the write leaves a truncated file and, with ``max_keep_ckpts=1``, no
    usable checkpoint at all. This hook writes ``<name>.part``, renames it to ``<name>`` once complete, points
    ``last_checkpoint`` at it (also by a rename), and only then deletes outdated checkpoints. A ``.part`` file
    left by a killed run is removed when training starts again.

    Takes the same arguments as ``CheckpointHook``. Checkpoints on remote storage, whose objects are written
    whole, and ``save_best`` checkpoints are saved as mmengine saves them.
    """

    def before_train(self, runner) -> None:
        super().before_train(runner)
        if isinstance(self.file_backend, LocalBackend) and is_main_process():
            pattern = osp.join(self.out_dir, self.filename_tmpl.replace('{}', '*') + '.part')
            for leftover in glob.glob(pattern):
                os.remove(leftover)

    def _save_checkpoint_with_step(self, runner, step, meta):
        if not isinstance(self.file_backend, LocalBackend):
            return super()._save_checkpoint_with_step(runner, step, meta)
        outdated = self._track_kept_checkpoints(runner, step)
        filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir, filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        runner.save_checkpoint(
            self.out_dir,
            f'{filename}.part',
            self.file_client_args,
            save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler,
            meta=meta,
            by_epoch=self.by_epoch,
            backend_args=self.backend_args,
            **self.args)
        if not is_main_process():  # only the main process writes
            return
        replace_durably(f'{self.last_ckpt}.part', self.last_ckpt)
        write_text_durably(osp.join(runner.work_dir, 'last_checkpoint'), self.last_ckpt)
        for old_step in outdated:
            old_path = self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(old_step))
            if osp.isfile(old_path):
                os.remove(old_path)

    def _track_kept_checkpoints(self, runner, step) -> list:
        """Record ``step`` among the kept checkpoints (the list is saved in the checkpoint, so a resumed run
        goes on deleting the right files); return the steps whose checkpoints are now outdated."""
        if self.max_keep_ckpts <= 0 or (self.keep_ckpt_ids and self.keep_ckpt_ids[-1] == step):
            return []
        outdated = []
        if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
            outdated.append(self.keep_ckpt_ids.popleft())
        self.keep_ckpt_ids.append(step)
        runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))
        return outdated


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
