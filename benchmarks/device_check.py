"""The release fixture's outputs on a device against the release's: the error in fp32, with TF32 convolutions
and matmuls, and under bf16 and fp16 autocast; on CUDA also that the softmax stages run on the fused SDPA kernels
(flash for bf16, memory-efficient for fp32) for every head width the variants use.

    python -m benchmarks.device_check [--device cuda|cpu]
"""
import argparse
import os
from typing import List

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from mala_mm import MALA
from mala_mm.checkpoint import load_backbone_weights
from mala_mm.ops.softmax_attention import softmax_attention
from mala_tools.reference import relative_error

from .common import tf32

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'tests', 'data')
# precision -> (TF32 on, autocast dtype or None)
PRECISIONS = {'fp32': (False, None), 'tf32': (True, None), 'bf16 autocast': (False, torch.bfloat16),
              'fp16 autocast': (False, torch.float16)}


def fixture_errors(device: torch.device, impl: str = 'auto') -> List[dict]:
    """One row per precision and stage of the release fixture's backbone (a narrow arch, the release's random
    weights, one input) with ``impl``: the max abs error of its output against the release's and the relative
    error (max abs error / max |release output|). TF32 exists on CUDA only: on CPU its rows are fp32's."""
    io = torch.load(os.path.join(DATA, 'official_det_io.pth'), weights_only=True)
    model = MALA(arch=io['arch'], impl=impl)
    load_backbone_weights(model, os.path.join(DATA, 'official_det_ckpt.pth'))
    model = model.to(device).eval()
    x = io['input'].to(device)
    rows = []
    for precision, (with_tf32, dtype) in PRECISIONS.items():
        with torch.no_grad(), tf32(with_tf32), torch.autocast(device.type, dtype=dtype or torch.bfloat16,
                                                              enabled=dtype is not None):
            outputs = model(x)
        for stage, (ours, release) in enumerate(zip(outputs, io['outputs'])):
            release = release.to(device)
            rows.append(dict(precision=precision, stage=stage, relative_error=relative_error(ours, release),
                             max_abs_error=(ours.float() - release).abs().max().item()))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', default='cuda')
    device = torch.device(parser.parse_args().device)
    for row in fixture_errors(device):
        print(f"{row['precision']}, stage {row['stage']}: max abs error vs release {row['max_abs_error']:.2e}, "
              f"relative {row['relative_error']:.2e}")
    if device.type != 'cuda':
        return  # the fused kernels checked below are CUDA's
    for head_dims in (32, 48, 64, 80):
        for dtype, backend in ((torch.bfloat16, SDPBackend.FLASH_ATTENTION),
                               (torch.float32, SDPBackend.EFFICIENT_ATTENTION)):
            q, k, v = (torch.randn(1, 4, 4096, head_dims, device=device, dtype=dtype) for _ in range(3))
            with sdpa_kernel([backend]):  # raises if the fused kernel cannot take these inputs
                softmax_attention(q, k, v)
            print(f'head width {head_dims}, {dtype}: {backend.name} ok')


if __name__ == '__main__':
    main()
