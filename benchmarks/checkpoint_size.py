"""What each paper config's checkpoints take on disk: one checkpoint as the training run saves it (weights and
the AdamW state of the config's optim wrapper) and the weights alone, saved and measured; and what a whole run
keeps under the config's ``max_keep_ckpts`` (UperNet also keeps its best mIoU). Writes
results/cpu/checkpoint_size.{md,json}.

    python -m benchmarks.checkpoint_size
"""
import glob
import logging
import os
import tempfile

import torch
from mmengine.logging import MMLogger
from mmengine.optim import build_optim_wrapper

from mala_tools.config import read_config
from mala_tools.machine_fit import fit_optim_wrapper_to_device
from mala_tools.model import build_model

from .common import markdown_table, write_results

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'configs')
MIB = 2 ** 20


def saved_mib(obj, folder: str) -> float:
    path = os.path.join(folder, 'checkpoint.pth')
    torch.save(obj, path)
    size = os.path.getsize(path) / MIB
    os.remove(path)
    return size


def sizes(config: str, folder: str) -> dict:
    cfg = read_config(os.path.join(CONFIGS, config))
    model = build_model(cfg)
    # the config's optimizer and parameter groups; the fp16 wrapper (which needs CUDA) adds only its loss scale's
    # few numbers
    optim_wrapper = cfg.optim_wrapper.copy()
    fit_optim_wrapper_to_device(optim_wrapper, amp=False, cuda=False)
    wrapper = build_optim_wrapper(model, optim_wrapper)
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    wrapper.step()  # AdamW's state appears with the first step
    weights = model.state_dict()
    checkpoint = saved_mib(dict(meta=dict(), state_dict=weights, optimizer=wrapper.state_dict()), folder)
    hook = cfg.default_hooks.checkpoint
    kept, best = hook.get('max_keep_ckpts', -1), int('save_best' in hook)  # -1: mmengine keeps every one
    return dict(config=config, params_M=sum(p.numel() for p in model.parameters()) / 1e6,
                weights_MiB=saved_mib(weights, folder), checkpoint_MiB=checkpoint,
                kept=('all' if kept < 0 else str(kept)) + (' + best' if best else ''),
                run_GiB=None if kept < 0 else checkpoint * (kept + best) / 1024)


def main():
    MMLogger.get_instance('mmengine').setLevel(logging.WARNING)  # not a line for each parameter group
    configs = sorted(os.path.relpath(path, CONFIGS) for path in glob.glob(os.path.join(CONFIGS, '*/*_mala_[tsbl]*.py'))
                     if 'builtin' not in path)
    with tempfile.TemporaryDirectory() as folder:
        rows = []
        for config in configs:
            rows.append(sizes(config, folder))
            print(rows[-1], flush=True)
    columns = ['config', 'params_M', 'weights_MiB', 'checkpoint_MiB', 'kept', 'run_GiB']
    table = markdown_table(rows, columns)
    print(table)
    print('written to', write_results('checkpoint_size', torch.device('cpu'), rows, table))


if __name__ == '__main__':
    main()
