"""Compile every Triton kernel of mala_mm.ops for a GPU, on a machine without one.

Triton's interpreter, which runs the kernels on CPU tensors in the suite, executes them as Python: it accepts what
the GPU compiler refuses (a Python float global inside a kernel, a type that changes across a loop) and says
nothing of registers. Here each kernel goes through Triton's full pipeline to a cubin, with its own ptxas, for
``--arch`` (default sm_90, the H100 and H200), in each variant its launcher makes: maps in fp32 and bf16, the
parameters fp32, and the constexprs and launch options the launcher's own plan gives for a small map.

    python tools/compile_kernels.py [--arch 90]

Stops with ``error:`` and status 2, naming the kernel and the variant, where one does not compile.
"""
import argparse
import os

import torch

from mala_tools.errors import fail, tool_main

# scalar arguments that are floats; every other non-pointer, non-constexpr argument is an int32
FLOAT_ARGS = {'eps', 'scale'}
# pointer arguments to the fp32 parameters, workspaces and tables; every other pointer is a feature map's
FP32_POINTERS = ('weight', 'bias', 'gamma', 'factors', 'partial', 'state', 'd_state', 'cos', 'sin')


def signature(kernel, constexprs: dict, map_dtype: str) -> dict:
    """Each argument's type for the compiler: constexpr, a pointer to fp32 or to ``map_dtype``, fp32 or int32."""
    types = {}
    for name in kernel.arg_names:
        if name in constexprs:
            types[name] = 'constexpr'
        elif name.endswith('_ptr'):
            types[name] = '*fp32' if name.startswith(FP32_POINTERS) else f'*{map_dtype}'
        else:
            types[name] = 'fp32' if name in FLOAT_ARGS else 'i32'
    return types


def compile_kernel(kernel, options: dict, map_dtype: str, arch: int) -> None:
    """``kernel`` compiled with ``options`` (its constexprs and launch options, as a launcher passes them)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    launch = {key: options.pop(key) for key in ('num_warps', 'num_stages') if key in options}
    names = kernel.arg_names
    source = ASTSource(fn=kernel, signature=signature(kernel, options, map_dtype),
                       constexprs={(names.index(name),): value for name, value in options.items()})
    triton.compile(source, target=GPUTarget('cuda', arch, 32), options=launch)


def variants():
    """(kernel, its options) for each variant a launcher makes, from the launchers' own plans for small maps."""
    from mala_mm.ops import depthwise_triton, mala_triton, mala_triton_kernels, residual_triton, rope_triton
    for head_dims in (64, 96):  # MALA-T/S's heads and MALA-B/L's wider ones, which take other tiles
        block_n, block_d, launch = mala_triton._tiles(head_dims)
        for kernel in (mala_triton_kernels.state_kernel, mala_triton_kernels.output_kernel,
                       mala_triton_kernels.query_grad_kernel, mala_triton_kernels.key_value_grad_kernel):
            for rope in (False, True):
                yield kernel, dict(HAS_ROPE=rope, BLOCK_N=block_n, BLOCK_D=block_d, **launch)
        for transposed in (False, True):
            yield rope_triton._rotate_pair_kernel, dict(TRANSPOSED=transposed, BLOCK_N=max(16, 4096 // block_d),
                                                        BLOCK_D=block_d)
    for channels, kernel_size in ((64, 3), (64, 5)):
        plan = depthwise_triton._Plan(torch.empty(1, channels, 8, 8), torch.empty(channels, 1, kernel_size,
                                                                                   kernel_size))
        if kernel_size == 3:
            for gelu in (False, True):
                yield depthwise_triton._residual_conv_kernel, dict(plan.options, GELU=gelu)
                yield depthwise_triton._residual_conv_grad_kernel, dict(plan.grad_options, GELU=gelu)
        else:
            yield depthwise_triton._gated_conv_kernel, dict(plan.options)
            yield depthwise_triton._gated_conv_grad_kernel, dict(plan.grad_options)
    for channels in (64, 640):  # MALA-T's first stage and MALA-L's last, the widest row
        plan = residual_triton._Plan(torch.empty(1, channels, 8, 8))
        for factors in (False, True):
            for norm in (False, True):
                for kernel in (residual_triton._residual_kernel, residual_triton._residual_grad_kernel):
                    yield kernel, dict(HAS_FACTORS=factors, NORM=norm, BLOCK_P=plan.block_p, BLOCK_C=plan.block_c)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--arch', type=int, default=90, help='compute capability, e.g. 90 for sm_90 (default)')
    args = parser.parse_args()
    # the kernels are defined when mala_mm.ops imports them: under the interpreter they would not be compiled
    if os.environ.get('TRITON_INTERPRET') == '1':
        fail('unset TRITON_INTERPRET: under the interpreter the kernels are not compiled')
    import triton
    count = 0
    for kernel, options in variants():
        for map_dtype in ('fp32', 'bf16'):
            try:
                compile_kernel(kernel, dict(options), map_dtype, args.arch)
            except Exception as error:  # the compiler's own errors have no common type
                fail(f'{kernel.__name__} {options} with {map_dtype} maps does not compile for sm_{args.arch}:\n'
                     f'{error}')
            count += 1
    print(f'{count} variants of the Triton kernels compiled for sm_{args.arch} with Triton {triton.__version__}')


if __name__ == '__main__':
    tool_main(main)
