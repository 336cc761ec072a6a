"""One check of a machine, phase by phase, into one results folder: fidelity to the release, the attention
operator, the backbone against Swin-T, the kernels a backbone step launches, a training step of the dense models,
torch.compile, and the mmcv build.
Fidelity, attention and backbone run each implementation of the attention (``impl``) this machine has: the
torch operators, and the Triton kernels on CUDA (or in Triton's interpreter where TRITON_INTERPRET=1 is set).

Each phase prints its name and elapsed time and writes <phase>.md and <phase>.json into --out; summary.md and
summary.json list the phases and their times. --quick runs every phase at small inputs (minutes on a laptop CPU);
the default sizes are the papers' (1280x800 detection, 512x2048 segmentation), about 10 minutes on one H200.

    python -m benchmarks.gpu_check [--device cuda] [--quick] [--out DIR] [--only PHASE ...] [--skip PHASE ...]
"""
import argparse
import contextlib
import json
import os
import time
from typing import Callable, Dict, List, Tuple

import torch
from torch._dynamo.utils import counters

from mala_mm import MALA
from mala_mm.ops.dispatch import TRITON_AVAILABLE

from .attention_op import measure as attention_cost
from .backbone import measure as backbone_speed
from .backbone import step as backbone_step
from .backbone import swin_tiny
from .common import RESULTS_DIR, device_name, exact_fp32, markdown_table, peak_mib, synchronize, time_ms, write_results
from .dense_step import CASES as DENSE_CASES
from .dense_step import build, fake_batch
from .device_check import fixture_errors

# (height, width) of each input, full and --quick (a tenth of detection's sides, a quarter of the dense models';
# --quick measures the backbone at the detection size alone)
SIZES = {
    'full': dict(detection=(800, 1280), segmentation=(512, 2048), mask_rcnn=(800, 1333), upernet=(512, 512)),
    'quick': dict(detection=(80, 128), mask_rcnn=(200, 333), upernet=(128, 128)),
}
# a second input the compiled backbone runs after the first, to count its graphs across sizes (full: the 3x
# recipe's smallest padded training size)
SECOND_COMPILED_SIZE = {'full': (480, 736), 'quick': (64, 96)}
AUTOCAST = {'fp32': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}
# timed repeats of a dense training step and of the compile phase's steps, after one untimed step
REPEATS = {'full': 3, 'quick': 1}
# the compiled backbone: MALA-T; --quick compiles a narrow arch with one block a stage (both attention kinds
# still), as inductor takes minutes for MALA-T's 12 blocks on a CPU
COMPILED_ARCH = {'full': 'tiny', 'quick': dict(embed_dims=[32, 64, 96, 128], depths=[1, 1, 1, 1],
                                               num_heads=[1, 2, 3, 4])}
# the backbone's autocast dtypes: --quick leaves out fp16, which CPUs without fp16 units emulate (a Swin-T train
# step at 256x160 took 7 s on 2 cores of an AMD EPYC with AVX-512 bf16 units, against 0.3 s in bf16)
BACKBONE_DTYPES = {'full': ('fp32', 'bf16', 'fp16'), 'quick': ('fp32', 'bf16')}
# MALA-T's attention per stage: (stride, heads) at 64 channels a head
MALA_T_STAGES = ((4, 1), (8, 2), (16, 4), (32, 8))
HEAD_DIMS = 64
# the test suite's bounds on the release fixture: fp32's max abs error (tests/unit/models/test_backbone.py), the
# autocast dtypes' relative error as a number of the dtype's epsilons (BACKBONE in
# tests/unit/models/test_mixed_precision.py); TF32 rounds to fp16's 10-bit mantissa
FP32_MAX_ABS_ERROR = 1e-4
EPSILONS = 12
RELATIVE_BOUNDS = {'tf32': EPSILONS * 2.0**-10, 'bf16 autocast': EPSILONS * torch.finfo(torch.bfloat16).eps,
                   'fp16 autocast': EPSILONS * torch.finfo(torch.float16).eps}
# the dense phase's configs: ours and, beside each, the library's own Swin-T config of the same model (dense_step.py);
# --quick trains ours alone, a check that they run, where the comparison would double the phase's minutes on a CPU
CONFIGS = {f'{model} {backbone}': config for model, (ours, swin, _) in DENSE_CASES.items()
           for backbone, config in (('MALA-T', ours), ('Swin-T', swin))}

Table = Tuple[List[dict], List[str]]  # rows and the columns of their Markdown table


def _interpreted() -> bool:
    from mala_mm.ops.triton_launch import INTERPRETED
    return INTERPRETED


def impls(device) -> List[str]:
    """The attention implementations that run on ``device`` here."""
    triton_runs = TRITON_AVAILABLE and (device.type == 'cuda' or _interpreted())
    return ['torch', 'triton'] if triton_runs else ['torch']


def tiny_backbones(device) -> Dict[str, torch.nn.Module]:
    """MALA-T with each attention implementation ``device`` runs, initialised as released, and mmdet's Swin-T; on
    the CPU until moved."""
    models = {}
    for impl in impls(device):
        models[f'MALA-T {impl}'] = MALA(arch='tiny', impl=impl)
        models[f'MALA-T {impl}'].init_weights()
    models['Swin-T'] = swin_tiny()
    return models


def fidelity(args, device) -> Table:
    """The release fixture in each precision against the release's outputs, with the suite's bound."""
    rows = [dict(impl=impl, **row) for impl in impls(device) for row in fixture_errors(device, impl)]
    for row in rows:
        if row['precision'] == 'fp32':
            row['bound'], row['within'] = f'max abs < {FP32_MAX_ABS_ERROR:g}', row['max_abs_error'] < FP32_MAX_ABS_ERROR
        else:
            bound = RELATIVE_BOUNDS[row['precision']]
            row['bound'], row['within'] = f'relative < {bound:.3g}', row['relative_error'] < bound
    return rows, ['impl', 'precision', 'stage', 'max_abs_error', 'relative_error', 'bound', 'within']


def attention(args, device) -> Table:
    """MALA's attention, in torch operators and in the Triton kernels, against SDPA's softmax attention,
    forward+backward, at MALA-T's token maps of the detection input: one row per stage and dtype."""
    height, width = SIZES[args.sizes]['detection']
    kinds = ['mala', 'softmax'] + (['mala triton'] if 'triton' in impls(device) else [])
    rows = []
    for dtype_name in ('fp32', 'bf16', 'fp16'):
        for stride, heads in MALA_T_STAGES:
            h, w = -(-height // stride), -(-width // stride)
            row = dict(dtype=dtype_name, tokens=f'{h}x{w}', heads=heads, d=HEAD_DIMS)
            for kind in kinds:
                row[f'{kind} ms'], row[f'{kind} MiB'] = attention_cost(
                    kind, h, w, HEAD_DIMS, AUTOCAST[dtype_name] or torch.float32, heads, device, backward=True)
            row['softmax/mala time'] = row['softmax ms'] / row['mala ms']
            if 'mala triton ms' in row:
                row['triton speed-up'] = row['mala ms'] / row['mala triton ms']
                row['softmax/mala triton time'] = row['softmax ms'] / row['mala triton ms']
            rows.append(row)
    return rows, ['dtype', 'tokens', 'heads', 'd', 'mala ms', 'mala triton ms', 'triton speed-up', 'softmax ms',
                  'softmax/mala time', 'softmax/mala triton time', 'mala MiB', 'mala triton MiB', 'softmax MiB']


def backbone(args, device) -> Table:
    """MALA-T, with each attention implementation, against mmdet's Swin-T: images/s and peak MiB, eval and train
    step, under each autocast dtype."""
    models = {name: model.to(device) for name, model in tiny_backbones(device).items()}
    rows = []
    for size_name in (name for name in ('detection', 'segmentation') if name in SIZES[args.sizes]):
        height, width = SIZES[args.sizes][size_name]
        for train in (False, True):
            for dtype_name in BACKBONE_DTYPES[args.sizes]:
                dtype = AUTOCAST[dtype_name]
                row = dict(input=f'{width}x{height}', mode='train step' if train else 'eval', dtype=dtype_name)
                for name, model in models.items():
                    row[f'{name} img/s'], row[f'{name} MiB'] = backbone_speed(
                        model, (height, width), device, train, dtype or torch.float32)
                for name in models:
                    if name != 'Swin-T':
                        row[f'{name}/Swin-T speed'] = row[f'{name} img/s'] / row['Swin-T img/s']
                rows.append(row)
    names = list(models)
    return rows, ['input', 'mode', 'dtype', *(f'{name} img/s' for name in names),
                  *(f'{name}/Swin-T speed' for name in names[:-1]), *(f'{name} MiB' for name in names)]


def launches(args, device) -> Table:
    """Whether a step is bound by kernel launches: per model, the kernels one eval forward and one train step
    launch under bf16 autocast at the detection size, the GPU's busy time (the kernels' own time, summed) and the
    wall time. A wall time far above the busy time is spent launching. CUDA only."""
    if device.type != 'cuda':
        return [dict(note='not measured: CUDA kernels only')], ['note']
    from torch.profiler import ProfilerActivity, profile
    height, width = SIZES[args.sizes]['detection']
    models = tiny_backbones(device)
    x = torch.randn(1, 3, height, width, device=device)
    rows = []
    for name, model in models.items():
        model.to(device)
        for train in (False, True):
            model.train(train)

            def run():
                with torch.autocast('cuda', dtype=torch.bfloat16):
                    backbone_step(model, x, train)
            run()  # Triton's and cuDNN's first-call work out of the count
            torch.cuda.synchronize(device)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                started = time.perf_counter()
                run()
                torch.cuda.synchronize(device)
                wall_ms = (time.perf_counter() - started) * 1e3
            kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            busy_ms = sum(e.device_time_total for e in kernels) / 1e3
            # a second step with the operators recorded too, apart: recording them slows the step timed above
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as by_operator:
                run()
                torch.cuda.synchronize(device)
            rows.append({'model': name, 'mode': 'train step' if train else 'eval', 'kernels': len(kernels),
                         'GPU busy ms': busy_ms, 'wall ms (profiled)': wall_ms, 'busy/wall': busy_ms / wall_ms,
                         'most called launching operators': most_called_launchers(by_operator)})
        model.cpu()
    return rows, ['model', 'mode', 'kernels', 'GPU busy ms', 'wall ms (profiled)', 'busy/wall',
                  'most called launching operators']


def most_called_launchers(prof, top: int = 8) -> str:
    """The ATen operators that launched GPU kernels themselves, the most called first, as ``name calls``: where
    the launches of a step go (casts, elementwise ops, convolutions). Triton's kernels, launched from Python, are
    no ATen operator and are not among them."""
    launchers = [e for e in prof.key_averages() if e.self_device_time_total > 0 and e.key.startswith('aten::')]
    launchers.sort(key=lambda e: e.count, reverse=True)
    return ', '.join(f'{e.key[len("aten::"):]} {e.count}' for e in launchers[:top])


def optim_wrapper_for(cfg, model, device):
    """The config's optim wrapper (the paper recipe's AmpOptimWrapper, static loss scale 512) built as the Runner
    builds it; on CPU, where mmengine refuses AmpOptimWrapper, a plain OptimWrapper of the same optimizer."""
    from mmengine.optim import build_optim_wrapper
    wrapper_cfg = dict(cfg.optim_wrapper)
    if device.type != 'cuda' and wrapper_cfg['type'] == 'AmpOptimWrapper':
        wrapper_cfg = {k: v for k, v in wrapper_cfg.items() if k != 'loss_scale'}
        wrapper_cfg['type'] = 'OptimWrapper'
    return build_optim_wrapper(model, wrapper_cfg)


def dense(args, device) -> Table:
    """One training step of each dense config on 2 images through its optim wrapper: the loss, whether the
    optimizer step ran (a loss scaler skips it when the scaled gradients overflow), time and peak memory."""
    import mmcv.ops
    rows = []
    for name, config in CONFIGS.items():
        if args.sizes == 'quick' and 'Swin-T' in name:
            continue
        scope, model = build(config)
        height, width = SIZES[args.sizes]['mask_rcnn' if scope == 'mmdet' else 'upernet']
        row = dict(model=name, input=f'2 x {width}x{height}')
        if scope == 'mmdet' and device.type == 'cuda' and mmcv.ops.get_compiling_cuda_version() == 'not available':
            row['optim wrapper'] = 'not run: mmcv has CPU ops only (install.sh --cpu-ops), RoIAlign needs CUDA ones'
            rows.append(row)
            continue
        model = model.to(device)
        if scope == 'mmseg':  # its preprocessor pads every image to the config's 512x512 crop: to this size instead
            model.data_preprocessor.size = (height, width)
        batch = fake_batch(scope, (height, width), device)
        if len(batch['inputs']) == 1:  # the detector's one image, twice
            batch = {key: value * 2 for key, value in batch.items()}
        wrapper = optim_wrapper_for(model.cfg, model, device)
        ran, calls = [], []
        wrapper.optimizer.register_step_post_hook(lambda *_: ran.append(True))

        def train_step():
            calls.append(True)
            model.train()
            with wrapper.optim_context(model):
                losses = model(**model.data_preprocessor(batch, True), mode='loss')
            loss, _ = model.parse_losses(losses)
            wrapper.update_params(loss)
            return loss

        scaler = getattr(wrapper, 'loss_scaler', None)
        row['optim wrapper'] = type(wrapper).__name__
        if model.cfg.optim_wrapper['type'] != row['optim wrapper']:
            row['optim wrapper'] += f" (the config's {model.cfg.optim_wrapper['type']} needs CUDA)"
        row['loss scale'] = scaler.get_scale() if scaler is not None else None
        row['first loss'] = train_step().item()
        row['first step skipped'] = not ran
        row['train step ms'] = time_ms(train_step, device, warmup=0, repeats=REPEATS[args.sizes])
        row['train MiB'] = peak_mib(train_step, device)
        row['steps skipped'] = f'{len(calls) - len(ran)} of {len(calls)}'
        rows.append(row)
    return rows, ['model', 'input', 'optim wrapper', 'loss scale', 'first loss', 'first step skipped',
                  'steps skipped', 'train step ms', 'train MiB']


def compile_variants(args, device) -> List[Tuple[str, object, str, Tuple[bool, ...]]]:
    """The compile phase's rows: (compile mode, ``compile`` argument, precision, train flags). fp32 with TF32 off
    checks inductor's code against eager's to the last bits; on CUDA the paper recipes' AMP (fp16 autocast), as
    GPU users train and test, with the default mode and with CUDA graphs (``mode='reduce-overhead'``), which replay
    a block's kernels without launching each from Python."""
    modes = (False, True)[:1 if args.sizes == 'quick' else 2]
    if device.type != 'cuda':
        return [('default', True, 'fp32', modes)]
    return [('default', True, 'fp32', (False,)), ('default', True, 'fp16', modes),
            ('reduce-overhead', dict(mode='reduce-overhead'), 'fp16', modes)]


def compiled(args, device) -> Table:
    """``MALA(compile=...)`` against the eager model, for COMPILED_ARCH, in each of ``compile_variants``: the first
    call's time (the compilation), the time of a step, the largest difference of the outputs (absolute, and
    relative to the largest output), and the graphs compiled for the input and SECOND_COMPILED_SIZE together (one
    per kind of block where sizes share their graphs). A train step is left out with --quick (its compilation takes
    minutes on a CPU)."""
    height, width = SIZES[args.sizes]['detection']
    arch = COMPILED_ARCH[args.sizes]
    model = MALA(arch=arch, drop_path_rate=0.0).to(device)  # no random drop: eager and compiled see one function
    model.init_weights()
    x = torch.randn(1, 3, height, width, device=device)
    second_x = torch.randn(1, 3, *SECOND_COMPILED_SIZE[args.sizes], device=device)
    rows = []
    for compile_mode, compile, precision, train_modes in compile_variants(args, device):
        torch.compiler.reset()  # each variant's compile time from dynamo's empty cache
        fast = MALA(arch=arch, drop_path_rate=0.0, compile=compile).to(device)
        fast.load_state_dict(model.state_dict())
        dtype = AUTOCAST[precision]
        for train in train_modes:
            model.train(train)
            fast.train(train)

            def run(m, x=x):
                with torch.set_grad_enabled(train), torch.autocast(device.type, dtype=dtype, enabled=bool(dtype)):
                    outputs = m(x)
                    if train:
                        m.zero_grad()
                        sum(out.float().mean() for out in outputs).backward()
                return [out.detach().to(torch.float32, copy=True) for out in outputs]  # CUDA graphs reuse memory

            row = dict(arch=str(arch), compile_mode=compile_mode, precision=precision,
                       mode='train step' if train else 'eval', input=f'{width}x{height}')
            rows.append(row)
            with exact_fp32() if precision == 'fp32' else contextlib.nullcontext():
                started = time.perf_counter()
                graphs_before = counters['stats']['unique_graphs']
                try:
                    ours = run(fast)
                    synchronize(device)
                except Exception as err:  # a compiler failure is this phase's finding, not the end of the check
                    row['error'] = f'{type(err).__name__}: {str(err).strip().splitlines()[0]}'
                    continue
                row['compile_s'] = time.perf_counter() - started
                eager = run(model)
                difference = max((a - b).abs().max().item() for a, b in zip(ours, eager))
                row['max_abs_difference'] = difference
                row['relative_difference'] = difference / max(out.abs().max().item() for out in eager)
                # two untimed steps more: CUDA graphs record on the second call and replay from the third
                row['eager_ms'], row['compiled_ms'] = (
                    time_ms(lambda: run(m), device, warmup=2, repeats=REPEATS[args.sizes]) for m in (model, fast))
                run(fast, second_x)
                row['graphs, 2 sizes'] = counters['stats']['unique_graphs'] - graphs_before
            row['speed-up'] = row['eager_ms'] / row['compiled_ms']
    return rows, ['arch', 'compile_mode', 'precision', 'mode', 'input', 'compile_s', 'eager_ms', 'compiled_ms',
                  'speed-up', 'max_abs_difference', 'relative_difference', 'graphs, 2 sizes', 'error']


def install(args, device) -> Table:
    """The bundle's install, as its install.sh recorded it: where mmcv came from and the seconds it took."""
    if not args.install_record:
        return [dict(note='not run through the bundle (bash BUNDLE/install.sh --check records the mmcv build)')], \
            ['note']
    with open(args.install_record) as f:
        row = json.load(f)
    return [row], list(row)


PHASES: Dict[str, Callable[..., Table]] = dict(install=install, fidelity=fidelity, attention=attention,
                                               backbone=backbone, launches=launches, dense=dense, compile=compiled)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--quick', dest='sizes', action='store_const', const='quick', default='full',
                        help=f"small inputs: {SIZES['quick']}")
    parser.add_argument('--out', help='the results folder (default: benchmarks/results/<device>/gpu_check)')
    parser.add_argument('--only', nargs='+', choices=list(PHASES), help='run these phases alone')
    parser.add_argument('--skip', nargs='+', choices=list(PHASES), default=[], help='leave these phases out')
    parser.add_argument('--install-record', help="the JSON file the bundle's install.sh wrote")
    args = parser.parse_args()
    device = torch.device(args.device)
    out = args.out or os.path.join(RESULTS_DIR, device.type, 'gpu_check')
    os.makedirs(out, exist_ok=True)
    phases = [name for name in (args.only or PHASES) if name not in args.skip]
    print(f'[gpu_check] {device_name(device)}, torch {torch.__version__}, {args.sizes} sizes, phases: '
          f'{" ".join(phases)}; results in {out}', flush=True)
    summary = []
    for name in phases:
        print(f'[gpu_check] {name} ...', flush=True)
        started = time.perf_counter()
        rows, columns = PHASES[name](args, device)
        seconds = time.perf_counter() - started
        table = markdown_table(rows, columns)
        write_results(name, device, rows, table, folder=out)
        print(f'{table}\n[gpu_check] {name}: {seconds:.1f} s', flush=True)
        summary.append(dict(phase=name, seconds=seconds))
    write_results('summary', device, [dict(sizes=args.sizes), *summary],
                  f'{args.sizes} sizes\n\n' + markdown_table(summary, ['phase', 'seconds']), folder=out)
    print(f'[gpu_check] done: {sum(row["seconds"] for row in summary):.1f} s, written to {out}')


if __name__ == '__main__':
    main()
