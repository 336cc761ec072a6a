"""Check the fused Triton kernels against the torch operators on this machine's GPUs, before a long run.

    python tools/check_kernels.py [--device cuda:0 cuda:1 ...]

Each operator runs once on small inputs in its kernels and in its torch operators on each GPU (default: every
visible one), forward and backward in fp32 without TF32, and the two are compared (mala_mm.ops.self_check), in
seconds. Prints a line for each operator and GPU. Exits 0 where all agree, 2 where one differs or fails to run:
training with impl='auto' (the default) would then run that operator in torch operators, and impl='triton' would
stop. A run checks and times each variant it launches at its first launch on a GPU, at its own widths and precision
(mala_mm.ops.verdicts); this command checks each operator's usual calls in fp32 on its own, before the job (on a new
cluster, or after a driver or Triton update). --device cpu runs the kernels in Triton's
interpreter where TRITON_INTERPRET=1 is set, which is how the tests run them without a GPU.
"""
import argparse

import torch

from mala_tools.errors import fail, tool_main


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    from mala_mm.ops import OPERATORS
    from mala_mm.ops.dispatch import NEEDS_TRITON, TRITON_AVAILABLE, TRITON_MISSING
    if not TRITON_AVAILABLE:
        fail(f'{NEEDS_TRITON}, and {TRITON_MISSING}: every device runs the torch operators')
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
