"""ONNX Runtime against PyTorch eager for MALA-T (released layout), eval, fp32 on CPU, with the compute floor.

Exports MALA-T once (dynamic H and W), then times each engine in its own child process at 1280x800 and 512x2048
(median of --repeats runs after one warm-up) and reads that process's peak resident memory. The floor is the
forward's FLOPs (convs, matmuls and attention, counted as tools/get_flops.py counts them) over the fp32 matmul rate
measured in this run on a 2048^3 matmul. Writes results/cpu/onnx_runtime.{md,json}.

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
from mala_mm import MALA
from mala_mm.analysis.flops import count_macs

SIZES = {'1280x800': (800, 1280), '512x2048': (512, 2048)}


def build_model():
    torch.manual_seed(0)
    model = MALA(arch='tiny').eval()
    model.init_weights()
    return model


def child(engine: str, onnx_path: str, height: int, width: int, repeats: int) -> dict:
    """Time one engine on one size in this (fresh) process; returns the median ms and the peak RSS in MiB."""
    image = torch.randn(1, 3, height, width)
    if engine == 'pytorch':
        model = build_model()

        def run():
            with torch.no_grad():
                model(image)
    else:
        import onnxruntime
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        session = onnxruntime.InferenceSession(onnx_path, options, providers=['CPUExecutionProvider'])
        feed = {session.get_inputs()[0].name: image.numpy()}

        def run():
            session.run(None, feed)
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return dict(ms=times[len(times) // 2], peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def sgemm_gflops(size: int = 2048, repeats: int = 5) -> float:
    a = torch.randn(size, size)
    a @ a
    start = time.perf_counter()
    for _ in range(repeats):
        a @ a
    return 2 * size ** 3 * repeats / (time.perf_counter() - start) / 1e9


def forward_gflops(model, height: int, width: int) -> float:
    """FLOPs of one forward, counted as tools/get_flops.py counts them (2 per multiply-accumulate)."""
    macs = count_macs(lambda: model(torch.randn(1, 3, height, width)))
    return 2 * sum(macs.values()) / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--child', nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        engine, path, height, width, repeats = args.child
        print(json.dumps(child(engine, path, int(height), int(width), int(repeats))))
        return

    model = build_model()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, 'mala_t.onnx')
        torch.onnx.export(model, (torch.randn(1, 3, 256, 320), ), path, dynamo=False, input_names=['image'],
                          dynamic_axes={'image': {2: 'height', 3: 'width'}})
        rate = sgemm_gflops()
        for size_name, (height, width) in SIZES.items():
            row = dict(input=size_name, GFLOPs=forward_gflops(model, height, width))
            row['SGEMM GFLOP/s'] = rate
            row['floor ms'] = row['GFLOPs'] / rate * 1e3
            for engine in ('pytorch', 'onnxruntime'):
                out = subprocess.run([sys.executable, __file__, '--child', engine, path, str(height), str(width),
                                      str(args.repeats)], capture_output=True, text=True, check=True)
                measured = json.loads(out.stdout.strip().splitlines()[-1])
                row[f'{engine} ms'], row[f'{engine} peak RSS MiB'] = measured['ms'], measured['peak_rss_mib']
            row['onnxruntime / pytorch speed'] = row['pytorch ms'] / row['onnxruntime ms']
            row['pytorch / floor'] = row['pytorch ms'] / row['floor ms']
            rows.append(row)
            print(row, flush=True)
    columns = ['input', 'pytorch ms', 'onnxruntime ms', 'onnxruntime / pytorch speed', 'pytorch peak RSS MiB',
               'onnxruntime peak RSS MiB', 'GFLOPs', 'SGEMM GFLOP/s', 'floor ms', 'pytorch / floor']
    table = markdown_table(rows, columns)
    print(table)
    print(f"written to {write_results('onnx_runtime', torch.device('cpu'), rows, table)}")


if __name__ == '__main__':
    main()
