"""ONNX Runtime against PyTorch eager, fp32 on CPU: MALA-T's backbone, UperNet with MALA-T, and Mask R-CNN with
MALA-T from the image to its detections and masks.

Each model is exported once with tools/export_onnx.py's library (TorchScript exporter, opset 18, free height and
width; the detector with ``nms=True``), then each engine is timed in its own child process at each size (median
of --repeats runs after one warm-up), with that process's peak resident memory. PyTorch runs what the libraries
run: the backbone's forward; the segmentor's normalisation, features and decode head, its logits resized to the
image (mmseg's ``predict`` but the arg-max); the detector's data preprocessor and ``predict``. The detector is
untrained, with a score threshold of 0, so that every image has ``max_per_img`` (100) detections and masks, as
many as a COCO image can have. ONNX Runtime runs with its default session options (all graph optimisations) and
as many intra-op threads as torch has.

For the backbone and the segmentor, the floor is the forward's FLOPs (as tools/get_flops.py counts them) over the
fp32 matmul rate measured in this run on a 2048^3 matmul. Writes results/cpu/onnx_runtime.{md,json}.

    python benchmarks/onnx_runtime.py [--repeats 3]
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import torch

from common import markdown_table, write_results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = {'1280x800': (800, 1280), '512x2048': (512, 2048)}
# name: (config, what the graph returns, sizes)
MODELS = {
    'MALA-T backbone': (None, 'backbone', ['1280x800', '512x2048']),
    'UperNet MALA-T': ('configs/segmentation/upernet_mala_t.py', 'logits', ['1280x800', '512x2048']),
    'Mask R-CNN MALA-T': ('configs/detection/mask_rcnn_mala_t.py', 'detections', ['1280x800']),
}
EXPORT_SHAPE = (256, 320)


def build(name: str):
    """The module PyTorch times and the one that is exported, for model ``name``, both eval."""
    from mala_mm import MALA
    from mala_mm.export import ImageToTensors
    torch.manual_seed(0)
    config, returns, _ = MODELS[name]
    if config is None:
        model = MALA(arch='tiny').eval()
        model.init_weights()
        return model, model
    from mala_mm.cli import build_model, read_config
    options = {'model.backbone.init_cfg': None}
    if returns == 'detections':
        options['model.test_cfg.rcnn.score_thr'] = 0.0
    model = build_model(read_config(os.path.join(ROOT, config), options))
    nms = returns == 'detections'
    return ImageToTensors(model, exportable=False, nms=nms).eval(), ImageToTensors(model, nms=nms).eval()


def child(name: str, engine: str, onnx_path: str, height: int, width: int, repeats: int) -> dict:
    """Time one engine on one size in this (fresh) process; returns the median ms and the peak RSS in MiB."""
    image = torch.rand(1, 3, height, width) * 255
    if engine == 'pytorch':
        module = build(name)[0]

        def run():
            with torch.no_grad():
                return module(image)
    else:
        import onnxruntime
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        session = onnxruntime.InferenceSession(onnx_path, options, providers=['CPUExecutionProvider'])
        feed = {session.get_inputs()[0].name: image.numpy()}

        def run():
            return session.run(None, feed)
    outputs = run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return dict(ms=times[len(times) // 2], peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                first_output_shape=list(outputs[0].shape))


def sgemm_gflops(size: int = 2048, repeats: int = 5) -> float:
    a = torch.randn(size, size)
    a @ a
    start = time.perf_counter()
    for _ in range(repeats):
        a @ a
    return 2 * size ** 3 * repeats / (time.perf_counter() - start) / 1e9


def forward_gflops(module, height: int, width: int) -> float:
    """FLOPs of one forward, counted as tools/get_flops.py counts them (2 per multiply-accumulate)."""
    from mala_mm.analysis.flops import count_macs
    image = torch.rand(1, 3, height, width) * 255
    with torch.no_grad():
        macs = count_macs(lambda: module(image))
    return 2 * sum(macs.values()) / 1e9


def export(name: str, module, path: str):
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
    parser.add_argument('--child', nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, engine, path, height, width, repeats = args.child
        print(json.dumps(child(name, engine, path, int(height), int(width), int(repeats))))
        return

    rate = sgemm_gflops()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, (_, returns, sizes) in MODELS.items():
            reference, exportable = build(name)
            path = os.path.join(folder, 'model.onnx')
            export(name, exportable, path)
            for size_name in sizes:
                height, width = SIZES[size_name]
                row = {'model': name, 'graph returns': returns, 'input': size_name}
                if returns != 'detections':  # mmcv's RoIAlign and NMS have no FLOP count
                    row['GFLOPs'] = forward_gflops(reference, height, width)
                    row['floor ms'] = row['GFLOPs'] / rate * 1e3
                for engine in ('pytorch', 'onnxruntime'):
                    out = subprocess.run([sys.executable, __file__, '--child', name, engine, path, str(height),
                                          str(width), str(args.repeats)], capture_output=True, text=True)
                    if out.returncode:
                        raise RuntimeError(f'{name} {engine} {size_name} failed:\n{out.stderr[-3000:]}')
                    measured = json.loads(out.stdout.strip().splitlines()[-1])
                    row[f'{engine} ms'], row[f'{engine} peak RSS MiB'] = measured['ms'], measured['peak_rss_mib']
                    if returns == 'detections':
                        row[f'{engine} detections'] = measured['first_output_shape'][0]
                row['onnxruntime / pytorch speed'] = row['pytorch ms'] / row['onnxruntime ms']
                if 'floor ms' in row:
                    row['pytorch / floor'] = row['pytorch ms'] / row['floor ms']
                    row['onnxruntime / floor'] = row['onnxruntime ms'] / row['floor ms']
                rows.append(row)
                print(row, flush=True)
    columns = ['model', 'input', 'pytorch ms', 'onnxruntime ms', 'onnxruntime / pytorch speed',
               'pytorch peak RSS MiB', 'onnxruntime peak RSS MiB', 'GFLOPs', 'floor ms', 'pytorch / floor',
               'onnxruntime / floor']
    table = markdown_table(rows, columns)
    table += (f'\n\nSGEMM {rate:.0f} GFLOP/s (2048^3, fp32). The detector: {rows[-1]["pytorch detections"]} '
              f'detections in PyTorch, {rows[-1]["onnxruntime detections"]} in ONNX Runtime.')
    print(table)
    print(f"written to {write_results('onnx_runtime', torch.device('cpu'), rows, table)}")


if __name__ == '__main__':
    main()
