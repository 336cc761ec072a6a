"""The loss scale at which one MALA attention's fp16 backward first overflows, at stage 0 of a 1333 x 800 image
(200 x 334 tokens, MALA-T's 64 channels in one head, RoPE), under a random-weighted mean of the output as loss:
for each scale, which gradients are finite, the input's (through the attention) and each parameter's.

    python -m benchmarks.fp16_loss_scale [--device cpu|cuda] [--exponents 9 16 22 25 28 31]
"""
import argparse

import torch

from mala_mm.models.layers import MALAttention, RoPE2d

HEIGHT, WIDTH, CHANNELS = 200, 334, 64


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--exponents', type=int, nargs='+', default=[9, 16, 22, 25, 28, 31])
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    attention = MALAttention(CHANNELS, 1).to(device)
    tables = RoPE2d(CHANNELS).to(device).tables(HEIGHT, WIDTH)
    x = torch.randn(1, CHANNELS, HEIGHT, WIDTH, device=device, requires_grad=True)
    weights = torch.randn(x.shape, device=device)
    print(f'fp16 autocast on {device}, {HEIGHT * WIDTH} tokens; loss = 2^e * mean(weights * attention(x))')
    for exponent in args.exponents:
        attention.zero_grad()
        x.grad = None
        with torch.autocast(device.type, dtype=torch.float16):
            y = attention(x, tables)
        ((y.float() * weights).mean() * 2.0**exponent).backward()
        grads = [('input', x.grad), *attention.named_parameters()]
        overflowed = [name for name, grad in ((n, g if n == 'input' else g.grad) for n, g in grads)
                      if not torch.isfinite(grad).all()]
        print(f'2^{exponent}: ' + (f'non-finite: {", ".join(overflowed)}' if overflowed else 'all finite'))


if __name__ == '__main__':
    main()
