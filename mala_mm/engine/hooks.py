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
from typing import List

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _NormBase
from mmengine.dist import all_reduce_params, get_rank, is_distributed, is_main_process
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

    ``save_best`` checkpoints are written the same way: the new best under ``<name>.part``, renamed once
    complete, and only then is the previous best deleted (mmengine deletes it first).

    Takes the same arguments as ``CheckpointHook``. Checkpoints on remote storage, whose objects are written
    whole, are saved as mmengine saves them.
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

    def _save_best_checkpoint(self, runner, metrics) -> None:
        if not self.save_best or not isinstance(self.file_backend, LocalBackend):
            return super()._save_best_checkpoint(runner, metrics)
        step = runner.epoch if self.by_epoch else runner.iter
        if 'auto' in self.key_indicators:
            self._init_rule(self.rules, [list(metrics.keys())[0]])
        improved = False
        single = len(self.key_indicators) == 1
        for indicator, rule in zip(self.key_indicators, self.rules):
            # mmengine's message-hub keys, so that resuming and mmengine's own hook read them alike
            score_key, path_key = (('best_score', 'best_ckpt') if single
                                   else (f'best_score_{indicator}', f'best_ckpt_{indicator}'))
            best = runner.message_hub.runtime_info.get(score_key, self.init_value_map[rule])
            score = metrics.get(indicator)
            if score is None or not self.is_better_than[indicator](score, best):
                continue
            improved = True
            previous = self.best_ckpt_path if single else self.best_ckpt_path_dict.get(indicator)
            name = f'best_{indicator}_{self.filename_tmpl.format(step)}'.replace('/', '_')
            path = self.file_backend.join_path(self.out_dir, name)
            runner.save_checkpoint(self.out_dir, filename=f'{name}.part', file_client_args=self.file_client_args,
                                   save_optimizer=False, save_param_scheduler=False,
                                   meta=dict(epoch=runner.epoch, iter=runner.iter), by_epoch=False,
                                   backend_args=self.backend_args)
            if is_main_process():
                replace_durably(f'{path}.part', path)
                if previous and previous != path and osp.isfile(previous):
                    os.remove(previous)
            runner.message_hub.update_info(score_key, score)
            runner.message_hub.update_info(path_key, path)
            if single:
                self.best_ckpt_path = path
            else:
                self.best_ckpt_path_dict[indicator] = path
            runner.logger.info(f'The best checkpoint with {score:0.4f} {indicator} at '
                               f'{"epoch" if self.by_epoch else "iter"} {step} is saved to {name}.')
        # the latest regular checkpoint holds the message hub: save it again so that a resumed run knows the
        # new best (and deletes the right file when a better one comes)
        if improved and self.last_ckpt is not None:
            self._save_checkpoint_with_step(runner, step, dict(epoch=runner.epoch, iter=runner.iter))

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
