"""Check the fused Triton kernels against the torch operators on this machine's GPUs, before a long run.

    python tools/check_kernels.py CONFIG [--images N] [--amp] [--shape H W] [--device cuda:0]
    python tools/check_kernels.py [--device cuda:0 cuda:1 ...]

With a config, runs one training step of its backbone at the config's training size (its crop, or its largest
resize, padded as its data preprocessor pads) for N images (default: the config's batch size a GPU), in its
precision (fp16 under its AmpOptimWrapper; --amp: as tools/train.py --amp takes it), with impl='auto', so that
each kernel variant the run would launch is checked against the torch operators and timed, as a run does at its
first launch (mala_mm.ops.verdicts); prints the table of choices: operator, shape, dtype, error, kernels ms, torch
ms, choice. The verdicts are kept in the cache, where the run then reads them. Without one, each operator's usual
calls run once on small inputs in fp32 on each GPU (default: every visible one), a line each.

Exits 0 where all agree, 2 where a variant computes other numbers or fails to run: training with impl='auto' (the
default) would run it in torch operators, with a warning, and impl='triton' would stop. Where Triton is missing or
older than the kernels need (torch 2.1's wheels pin Triton 2.1), it says so and exits 0: the torch operators serve
every device there. --device cpu runs the kernels in Triton's interpreter where TRITON_INTERPRET=1 is set, which is
how the tests run them without a GPU.
"""
import argparse

import torch

from mala_tools.errors import fail, tool_main


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', nargs='?', help="a training config: check the variants of its backbone's step")
    parser.add_argument('--images', type=int, help="images a GPU (default: the config's batch size)")
    parser.add_argument('--amp', action='store_true', help='mixed precision as tools/train.py --amp takes it')
    parser.add_argument('--shape', type=int, nargs=2, metavar=('H', 'W'),
                        help="the images' size (default: the config's training size)")
    parser.add_argument('--device', nargs='+', help='the devices to check (default: every visible GPU)')
    return parser.parse_args()


def devices(named) -> list:
    if named:
        return [torch.device(name) for name in named]
    if not torch.cuda.is_available():
        fail('no GPU is visible to torch here, and the kernels run on GPUs only (the torch operators serve the '
             'CPU); run this on a GPU node')
    return [torch.device('cuda', index) for index in range(torch.cuda.device_count())]


def main():
    args = parse_args()
    from mala_mm.ops.dispatch import NEEDS_TRITON, TRITON_AVAILABLE, TRITON_MISSING
    if not TRITON_AVAILABLE:  # e.g. torch 2.1's CUDA wheels, which pin Triton 2.1
        print(f'nothing to check: {NEEDS_TRITON}, and {TRITON_MISSING}, so every device runs the torch operators, '
              "which impl='auto' takes there")
        return
    if args.config:
        from mala_tools.kernel_step import check_config
        for device in devices(args.device):
            check_config(args.config, device, args.images, args.amp, args.shape)
        return
    check_operators(args)


def check_operators(args):
    from mala_mm.ops import OPERATORS
    from mala_mm.ops.self_check import check_operator
    from mala_mm.ops.triton_launch import INTERPRETED, KernelUnavailable, gpu_of, unserved
    differing = []
    for device in devices(args.device):
        if device.type == 'cpu' and not INTERPRETED:
            fail('--device cpu: the kernels run on the CPU only in Triton\'s interpreter: set TRITON_INTERPRET=1')
        gpu = gpu_of(torch.empty(0, device=device))
        why_not = unserved(gpu) if device.type == 'cuda' else None
        if why_not is not None:
            print(f'{device} {gpu}: not checked: {why_not}; impl=\'auto\' runs the torch operators there')
            continue
        for name, operator in OPERATORS.items():
            try:
                problem = check_operator(operator, device)
            except KernelUnavailable as error:
                problem = str(error)
            print(f'{device} {gpu}: {name}: {problem or "the kernels agree with the torch operators"}')
            if problem:
                differing.append(f'{name} on {device}')
    if differing:
        fail(f"the kernels of {', '.join(differing)} differ from the torch operators or do not run: impl='auto' "
             f"runs those in torch operators (with a warning), impl='triton' stops")


if __name__ == '__main__':
    tool_main(main)
