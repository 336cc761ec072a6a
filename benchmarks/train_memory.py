"""The memory of each paper config's training step, and the batch that fits on 16, 24, 40 and 80 GB GPUs, counted
on any machine by kernel_count's counter.

Each config of configs/detection and configs/segmentation (not the built-in dataset's) is built as it says, in one
process (SyncBN as BN, which leaves the stem's norms to torch's operators, as SyncBN runs them), its backbone on
its CUDA path (``impl='triton'``, launches recorded as kernel_count records them). Its training step is counted at
the recipes' largest training input, COCO's 1333x800 (padded to 1344x800) or ADE20K's 512x512 crops, in the config's
precision (fp16 autocast where it trains with AmpOptimWrapper, counted under bf16 autocast, which casts the same
operators to as many bytes; else fp32), at two batches (COUNTED_BATCHES). mmcv's CPU RoIAlign and NMS have no fp16
kernels: the count runs them on fp32 copies that it does not count, as a GPU's fp16 kernels make none.

The step is the loss's forward and backward and AdamW's multi-tensor step, as on a GPU. Counted, a GPU holds at b
images the parameters in fp32 and AdamW's two fp32 moments of each trainable one (the gradients are the step's
own), and the step's peak at b images, linear between the two counts (the maps grow with the images, the gradients
do not). The batch reported for a GPU is the largest that fits when the step's counted peak is taken as many times as
the one GPU run of these steps (GPU_STEPS) held over the count at most, over the configs both ran, and UNCOUNTED_GIB
is left for CUDA's context. That run's steps held more than the count sees (cuDNN's workspaces, the allocator's
rounding), and more than today's code would: the attention ran in torch operators, the backbone before its memory
was cut. The batches are counts calibrated by one GPU run on the safe side, not a measurement of each config.

    python -m benchmarks.train_memory [--only CONFIG_NAME ...]

writes results/cpu/train_memory.{md,json}.
"""
import argparse
import contextlib
import glob
import importlib
import os

os.environ.setdefault('TRITON_INTERPRET', '1')  # before mala_mm imports Triton, as kernel_count sets it

import torch  # noqa: E402
from torch.utils._python_dispatch import _get_current_dispatch_mode  # noqa: E402

from mala_tools.config import read_config  # noqa: E402

from .common import RESULTS_DIR, markdown_table, write_results  # noqa: E402
from .dense_step import CONFIGS, build, fake_batch  # noqa: E402
from .kernel_count import MIB, count, dense_part, dense_steps  # noqa: E402

GPUS_GIB = (16, 24, 40, 80)
# the one GPU run of the configs' training steps at 2 images: the peak memory each step allocated
GPU_STEPS = os.path.join(RESULTS_DIR, 'h200', 'first_run', 'paper_steps.md')
# CUDA's context and the caching allocator's free blocks, which no allocated-bytes figure holds
UNCOUNTED_GIB = 1.0
TRAIN_SIZES = {'mmdet': (800, 1333), 'mmseg': (512, 512)}
# the batches counted: mmseg's pooling module's BatchNorm takes no single image
COUNTED_BATCHES = {'mmdet': (1, 2), 'mmseg': (2, 3)}
# autocast's fp16 counted as bf16: the same bytes, and the CPU's fp16 convolutions take minutes a step
PRECISIONS = {'AmpOptimWrapper': ('fp16', torch.bfloat16), 'OptimWrapper': ('fp32', None)}
# bytes a parameter: its fp32 value, and for a trainable one AdamW's two fp32 moments
PARAMETER_BYTES, ADAMW_BYTES = 4, 8


def paper_configs():
    """The zoo's configs under configs/, by name."""
    paths = sorted(glob.glob(os.path.join(CONFIGS, 'detection', '*.py')) +
                   glob.glob(os.path.join(CONFIGS, 'segmentation', '*.py')))
    return {os.path.basename(p)[:-3]: os.path.relpath(p, CONFIGS) for p in paths if not p.endswith('_builtin.py')}


@contextlib.contextmanager
def mmcv_cpu_kernels_in_fp32():
    """mmcv's RoIAlign and NMS on fp32 copies of low-precision tensors, which the count does not see: their CPU
    kernels take fp32 only, while a GPU's take the tensors as they are."""
    # (module, kernel, the index of the tensor argument it writes its result into, or None: it returns it)
    kernels = [('mmcv.ops.roi_align', 'roi_align_forward', 2), ('mmcv.ops.roi_align', 'roi_align_backward', 4),
               ('mmcv.ops.nms', 'nms', None)]
    originals = []

    def in_fp32(kernel, written):
        def run(*args, **options):
            low = [isinstance(a, torch.Tensor) and a.dtype in (torch.float16, torch.bfloat16) for a in args]
            if not any(low):
                return kernel(*args, **options)
            counter = _get_current_dispatch_mode()  # none in the warm-up step
            with counter.paused() if counter is not None else contextlib.nullcontext():
                copies = [a.float() if is_low else a for a, is_low in zip(args, low)]
                result = kernel(*copies, **options)
                if written is not None:
                    args[written].copy_(copies[written])
            return result
        return run
    for module, name, written in kernels:
        ext = importlib.import_module(module).ext_module
        originals.append((ext, name, getattr(ext, name)))
        setattr(ext, name, in_fp32(getattr(ext, name), written))
    try:
        yield
    finally:
        for ext, name, kernel in originals:
            setattr(ext, name, kernel)


def count_config(name: str, path: str) -> dict:
    """The config's precision and input, its parameters, the bytes of the parameters and AdamW's state, and its
    step's peak bytes at each batch of COUNTED_BATCHES."""
    cfg = read_config(os.path.join(CONFIGS, path))
    scope = cfg.default_scope
    precision, dtype = PRECISIONS[cfg.optim_wrapper.type]
    size = TRAIN_SIZES[scope]
    torch.manual_seed(0)
    _, model = build(path, backbone=dict(impl='triton', init_cfg=None))
    parameters = list(model.parameters())
    # AdamW's multi-tensor step, as on a GPU, whose temporaries the step holds beside the gradients
    optimizer = torch.optim.AdamW(parameters, lr=1e-4, foreach=True)
    peaks = {}
    for images in COUNTED_BATCHES[scope]:
        batch = fake_batch(scope, size, torch.device('cpu'), images=images)
        train = dense_steps(model, batch, scope)['train']

        def step(autocast):
            train(autocast)
            optimizer.step()
        torch.manual_seed(0)
        with mmcv_cpu_kernels_in_fp32():
            peaks[images] = count(model, step, dtype, dense_part)['peak_bytes']
    counted = dict(config=name, precision=precision, input=f'{size[1]}x{size[0]}',
                   parameters_m=sum(p.numel() for p in parameters) / 1e6, recipe_batch=cfg.train_dataloader.batch_size,
                   state=sum(p.numel() * (PARAMETER_BYTES + (ADAMW_BYTES if p.requires_grad else 0))
                             for p in parameters), peaks=peaks)
    print(counted, flush=True)
    return counted


def gpu_peaks() -> dict:
    """The GPU run's peak MiB of each config's step at 2 images, by config name."""
    peaks = {}
    for line in open(GPU_STEPS):
        cells = [c.strip() for c in line.split('|')[1:-1]]
        if cells and cells[0].endswith('.py') and cells[6].replace('.', '').isdigit():
            peaks[os.path.basename(cells[0])[:-3]] = float(cells[6]) * MIB
    return peaks


def table_rows(counts) -> tuple:
    """Each config's row: its counts, its GiB at its recipe's batch, and the largest batch on each GPU, the step's
    counted peak taken as many times as the GPU run held over the count at most (over the configs both ran); and
    that ratio."""
    lines = {}
    for counted in counts:  # the step's peak as bytes at no image and a slope a image
        (small, peak_small), (large, peak_large) = counted['peaks'].items()
        per_image = (peak_large - peak_small) / (large - small)
        lines[counted['config']] = (peak_small - small * per_image, per_image)
    measured = gpu_peaks()
    ratios = {name: measured[name] / (lines[name][0] + 2 * lines[name][1]) for name in measured if name in lines}
    factor = max(ratios.values())
    rows = []
    for counted in counts:
        at_zero, per_image = lines[counted['config']]
        state = counted['state']
        row = {key: counted[key] for key in ('config', 'precision', 'input', 'parameters_m')}
        peaks = ', '.join(f'{images}: {peak / MIB:.0f}' for images, peak in counted['peaks'].items())
        row.update(state_mib=state / MIB, counted_mib=peaks, per_image_mib=per_image / MIB,
                   gpu_2_images_mib=measured[counted['config']] / MIB
                   if counted['config'] in measured else '', recipe_batch=counted['recipe_batch'],
                   recipe_gib=(state + at_zero + counted['recipe_batch'] * per_image) / 2 ** 30)
        for gib in GPUS_GIB:
            room = (gib - UNCOUNTED_GIB) * 2 ** 30 - state - factor * at_zero
            row[f'batch_{gib}gb'] = max(int(room // (factor * per_image)), 0)
        rows.append(row)
    return rows, factor, ratios


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--only', nargs='+', help='config names (default: every paper config)')
    parser.add_argument('--out', help='results folder (default: results/cpu)')
    args = parser.parse_args()
    configs = paper_configs()
    unknown = set(args.only or ()) - set(configs)
    if unknown:
        parser.error(f'no paper config named {sorted(unknown)}; they are {sorted(configs)}')
    counts = [count_config(name, path) for name, path in configs.items() if not args.only or name in args.only]
    rows, factor, ratios = table_rows(counts)
    table = markdown_table(rows, list(rows[0])) + (
        f'\n\nThe batches take the counted step {factor:.2f} times: the GPU run held '
        + ', '.join(f'{ratio:.2f} times the count for {name}' for name, ratio in ratios.items()) + '.')
    print(table)
    print(f"written to {write_results('train_memory', torch.device('cpu'), rows, table, args.out)}")


if __name__ == '__main__':
    main()
