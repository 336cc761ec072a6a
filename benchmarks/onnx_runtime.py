"""ONNX Runtime against PyTorch eager, fp32 on CPU: MALA-T's backbone, UperNet with MALA-T, and Mask R-CNN with
MALA-T from the image to its detections and masks.

Each model is exported once with tools/export_onnx.py's library (TorchScript exporter, opset 18, free height and
width; the detector with ``nms=True``). At each size one child process times both engines, a warm-up each and
then --repeats runs of each in turn: the medians, and ``speed``, the median of the runs' PyTorch / ONNX Runtime
ratios (above 1: ONNX Runtime is faster). Two more children, one per engine, run it once and read their peak
resident memory. PyTorch runs what the libraries
run: the backbone's forward; the segmentor's normalisation, features and decode head, its logits resized to the
image (mmseg's ``predict`` but the arg-max); the detector's data preprocessor and ``predict``. The detector is
untrained, with a score threshold of 0, so that every image has ``max_per_img`` (100) detections and masks, as
many as a COCO image can have. ONNX Runtime runs with its default session options (all graph optimisations) and
as many intra-op threads as torch has.

For the backbone and the segmentor, the floor is the forward's FLOPs (as tools/get_flops.py counts them) over the
fp32 matmul rate measured in this run on a 2048^3 matmul. Writes results/cpu/onnx_runtime.{md,json}.

    python -m benchmarks.onnx_runtime [--repeats 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, Sequence

import torch

from .common import markdown_table, write_results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = {'1280x800': (800, 1280), '512x2048': (512, 2048)}
# name: (config, what the graph returns, sizes)
MODELS = {
    'MALA-T backbone': (None, 'backbone', ['1280x800', '512x2048']),
    'UperNet MALA-T': ('configs/segmentation/upernet_mala_t.py', 'logits', ['1280x800', '512x2048']),
    'Mask R-CNN MALA-T': ('configs/detection/mask_rcnn_mala_t.py', 'detections', ['1280x800']),
}
EXPORT_SHAPE = (256, 320)


def build(name: str, exportable: bool = False):
    """Model ``name`` in eval: what PyTorch times, or with ``exportable`` what is exported."""
    from mala_mm import MALA
    from mala_mm.export import ImageToTensors
    torch.manual_seed(0)
    config, returns, _ = MODELS[name]
    if config is None:
        model = MALA(arch='tiny').eval()
        model.init_weights()
        return model
    from mala_tools.config import read_config
    from mala_tools.model import build_model
    options = {'model.backbone.init_cfg': None}
    if returns == 'detections':
        options['model.test_cfg.rcnn.score_thr'] = 0.0
    model = build_model(read_config(os.path.join(ROOT, config), options))
    return ImageToTensors(model, exportable=exportable, nms=returns == 'detections').eval()


def onnxruntime_session(onnx_path: str):
    """ONNX Runtime's CPU session with its default options and as many intra-op threads as torch has."""
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    return onnxruntime.InferenceSession(onnx_path, options, providers=['CPUExecutionProvider'])


def engines(name: str, onnx_path: str, image: torch.Tensor) -> Dict[str, Callable[[], Sequence]]:
    """One forward of each engine on ``image``, as a function."""
    module, session = build(name), onnxruntime_session(onnx_path)
    feed = {session.get_inputs()[0].name: image.numpy()}

    def pytorch():
        with torch.no_grad():
            return module(image)
    return dict(pytorch=pytorch, onnxruntime=lambda: session.run(None, feed))


def child_times(name: str, onnx_path: str, height: int, width: int, repeats: int) -> dict:
    """Both engines in this (fresh) process, one warm-up each, then ``repeats`` runs of each in turn, so that the
    machine's drift falls on both alike: each engine's median ms, the median of the runs' ratios, and each
    engine's number of detections (the first output's length)."""
    runs = engines(name, onnx_path, torch.rand(1, 3, height, width) * 255)
    measured = {engine: dict(outputs=run(), ms=[]) for engine, run in runs.items()}
    for _ in range(repeats):
        for engine, run in runs.items():
            start = time.perf_counter()
            run()
            measured[engine]['ms'].append((time.perf_counter() - start) * 1e3)
    ratios = [a / b for a, b in zip(measured['pytorch']['ms'], measured['onnxruntime']['ms'])]
    found = {}
    if MODELS[name][1] == 'detections':
        found = {f'{engine} detections': len(m['outputs'][0]) for engine, m in measured.items()}
    return dict(**{f'{engine} ms': statistics.median(m['ms']) for engine, m in measured.items()}, **found,
                speed=statistics.median(ratios))


def child_memory(name: str, engine: str, onnx_path: str, height: int, width: int) -> dict:
    """The peak resident memory (MiB) of a process that runs one engine once."""
    image = torch.rand(1, 3, height, width) * 255
    if engine == 'pytorch':
        with torch.no_grad():
            build(name)(image)
    else:
        session = onnxruntime_session(onnx_path)
        session.run(None, {session.get_inputs()[0].name: image.numpy()})
    return {f'{engine} peak RSS MiB': peak_rss_mib()}


def peak_rss_mib() -> float:
    """This process's peak resident memory since it started its program. Not getrusage's ru_maxrss: Linux carries
    that over from the parent at fork, so a child would report its parent's peak where that is higher."""
    with open('/proc/self/status') as status:
        return next(int(line.split()[1]) for line in status if line.startswith('VmHWM:')) / 1024


def in_child(*args) -> dict:
    out = subprocess.run([sys.executable, '-m', 'benchmarks.onnx_runtime', '--child', *map(str, args)], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f'{args} failed:\n{out.stderr[-3000:]}')
    return json.loads(out.stdout.strip().splitlines()[-1])


def sgemm_gflops(size: int = 2048, repeats: int = 5) -> float:
    a = torch.randn(size, size)
    a @ a
    start = time.perf_counter()
    for _ in range(repeats):
        a @ a
    return 2 * size ** 3 * repeats / (time.perf_counter() - start) / 1e9


def forward_gflops(module, height: int, width: int) -> float:
    """FLOPs of one forward, counted as tools/get_flops.py counts them (2 per multiply-accumulate)."""
    from mala_tools.analysis.flops import count_macs
    image = torch.rand(1, 3, height, width) * 255
    with torch.no_grad():
        macs = count_macs(lambda: module(image))
    return 2 * sum(macs.values()) / 1e9


def export(module, path: str):
    from mala_mm.export import ImageToTensors, export_onnx
    example = torch.rand(1, 3, *EXPORT_SHAPE) * 255
    if isinstance(module, ImageToTensors):
        export_onnx(module, example, path, dynamic=True, exporter='torchscript')
    else:
        torch.onnx.export(module, (example, ), path, dynamo=False, input_names=['image'],
                          dynamic_axes={'image': {2: 'height', 3: 'width'}})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--child', nargs='+', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, name, *rest = args.child
        if kind == 'times':
            path, height, width, repeats = rest
            print(json.dumps(child_times(name, path, int(height), int(width), int(repeats))))
        else:
            engine, path, height, width = rest
            print(json.dumps(child_memory(name, engine, path, int(height), int(width))))
        return

    rate = sgemm_gflops()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, (_, returns, sizes) in MODELS.items():
            path = os.path.join(folder, 'model.onnx')
            export(build(name, exportable=True), path)
            reference = build(name) if returns != 'detections' else None
            for size_name in sizes:
                height, width = SIZES[size_name]
                row = {'model': name, 'graph returns': returns, 'input': size_name}
                if returns != 'detections':  # mmcv's RoIAlign and NMS have no FLOP count
                    row['GFLOPs'] = forward_gflops(reference, height, width)
                    row['floor ms'] = row['GFLOPs'] / rate * 1e3
                row.update(in_child('times', name, path, height, width, args.repeats))
                for engine in ('pytorch', 'onnxruntime'):
                    row.update(in_child('memory', name, engine, path, height, width))
                if 'floor ms' in row:
                    row['pytorch / floor'] = row['pytorch ms'] / row['floor ms']
                    row['onnxruntime / floor'] = row['onnxruntime ms'] / row['floor ms']
                rows.append(row)
                print(row, flush=True)
    columns = ['model', 'input', 'pytorch ms', 'onnxruntime ms', 'speed',
               'pytorch peak RSS MiB', 'onnxruntime peak RSS MiB', 'GFLOPs', 'floor ms', 'pytorch / floor',
               'onnxruntime / floor']
    table = markdown_table(rows, columns)
    table += (f'\n\nSGEMM {rate:.0f} GFLOP/s (2048^3, fp32). The detector: {rows[-1]["pytorch detections"]} '
              f'detections in PyTorch, {rows[-1]["onnxruntime detections"]} in ONNX Runtime.')
    print(table)
    print(f"written to {write_results('onnx_runtime', torch.device('cpu'), rows, table)}")


if __name__ == '__main__':
    main()
