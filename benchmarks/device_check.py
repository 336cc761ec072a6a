"""The release fixture's outputs on a device against the release's: the error in fp32, with TF32 convolutions
and under bf16 autocast; on CUDA also that the softmax stages run on the fused SDPA kernels (flash for bf16,
memory-efficient for fp32) for every head width the variants use.

    python benchmarks/device_check.py [--device cuda|cpu]
"""
import argparse
import os

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from common import exact_fp32
from mala_mm import MALA
from mala_mm.checkpoint import load_backbone_weights
from mala_mm.models.layers import softmax_attention
from mala_mm.reference import relative_error

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'tests', 'data')


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', default='cuda')
    device = torch.device(parser.parse_args().device)
    io = torch.load(os.path.join(DATA, 'official_det_io.pth'), weights_only=True)
    model = MALA(arch=io['arch'])
    load_backbone_weights(model, os.path.join(DATA, 'official_det_ckpt.pth'))
    model = model.to(device).eval()
    x = io['input'].to(device)
    with torch.no_grad():
        with exact_fp32():
            fp32 = model(x)
        tf32 = model(x)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            bf16 = model(x)
    for i, (exact, fast, low, release) in enumerate(zip(fp32, tf32, bf16, io['outputs'])):
        release = release.to(device)
        print(f'stage {i}: max abs error vs release, fp32 {(exact - release).abs().max().item():.2e}, '
              f'with the default TF32 convs {(fast - release).abs().max().item():.2e}; '
              f'bf16 autocast max abs error / max |output| {relative_error(low, release):.2e}')
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
