"""Compile every Triton kernel of mala_mm.ops for each GPU architecture, on a machine without a GPU, and check that
each fits the GPU: shared memory within what a block may use there, and no stack (registers spilled to local
memory).

Triton's interpreter, which runs the kernels on CPU tensors in the suite, executes them as Python: it accepts what
the GPU compiler refuses and says nothing of shared memory or registers. Here each kernel goes through Triton's full
pipeline to a cubin, in each variant its launcher makes on that GPU (its plan: tiles, warps, stages), with maps in
fp32, bf16 and fp16. Shared memory is Triton's own figure; registers and stack are read from the cubin Triton
built, with the cuobjdump that ships with Triton (a separate ptxas run allocates registers differently).

    python tools/compile_kernels.py [--arch 80 --arch 86 ...] [--jobs N]

Default: sm_80 (A100), sm_86 (RTX 30xx, A10, A6000), sm_89 (RTX 40xx, L4, L40S), sm_90 (H100, H200), and the
newer architectures the installed Triton compiles for. Prints a table per GPU; stops with ``error:`` and status 2
where a variant does not compile, is over its shared memory or has a stack.
"""
import argparse
import inspect
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from importlib import import_module
from typing import List, Optional, Tuple

from mala_tools.errors import fail, tool_main

REQUIRED_ARCHS = (80, 86, 89, 90)
NEWER_ARCHS = (100, 120)
MAP_DTYPES = ('fp32', 'bf16', 'fp16')
LAUNCH_OPTIONS = ('num_warps', 'num_stages', 'maxnreg')
# scalar arguments that are floats; every other non-pointer, non-constexpr argument is an int32
FLOAT_ARGS = {'eps', 'scale'}
# pointer arguments to the fp32 parameters, workspaces and tables; every other pointer is a feature map's
FP32_POINTERS = ('weight', 'bias', 'gamma', 'factors', 'partial', 'state', 'd_state', 'cos', 'sin', 'terms')


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


def cuobjdump() -> str:
    import triton
    bundled = os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin', 'cuobjdump')
    found = bundled if os.path.isfile(bundled) else shutil.which('cuobjdump')
    if found is None:
        fail(f'no cuobjdump: neither {bundled} (Triton ships it) nor one on PATH')
    return found


def ast_source(ASTSource, kernel, types: dict, constexprs: dict):
    """The compiler's source of ``kernel`` with its ``constexprs`` bound. Triton 3.3 and newer take every argument's
    type and the constexprs by argument index; Triton 3.2 takes the other arguments' types and the constexprs by
    name."""
    if 'constexprs' in inspect.signature(ASTSource).parameters:
        names = kernel.arg_names
        return ASTSource(fn=kernel, signature=types,
                         constexprs={(names.index(name),): value for name, value in constexprs.items()})
    return ASTSource(fn=kernel, signature={name: kind for name, kind in types.items() if kind != 'constexpr'},
                     constants=dict(constexprs))


def compile_variant(module: str, kernel_name: str, options: dict, map_dtype: str, arch: int) -> Tuple[int, int, int]:
    """(shared memory in bytes, registers, stack bytes) of a kernel compiled for sm_``arch``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    kernel = getattr(import_module(module), kernel_name)
    options = dict(options)
    launch = {key: options.pop(key) for key in LAUNCH_OPTIONS if key in options}
    source = ast_source(ASTSource, kernel, signature(kernel, options, map_dtype), options)
    compiled = triton.compile(source, target=GPUTarget('cuda', arch, 32), options=launch)
    with tempfile.NamedTemporaryFile(suffix='.cubin') as cubin:
        cubin.write(compiled.asm['cubin'])
        cubin.flush()
        usage = subprocess.run([cuobjdump(), '-res-usage', cubin.name], capture_output=True, text=True,
                               check=True).stdout
    found = re.search(r'REG:(\d+) STACK:(\d+)', usage)
    if found is None:
        raise RuntimeError(f'cuobjdump -res-usage printed no registers:\n{usage}')
    return compiled.metadata.shared, int(found.group(1)), int(found.group(2))


def compiles_for(arch: int) -> Optional[str]:
    """None where the installed Triton compiles for sm_``arch``, else why not."""
    try:
        compile_variant('mala_mm.ops.triton_launch', 'empty_kernel', {}, 'fp32', arch)
    except Exception as error:  # the compiler's own errors have no common type
        return f'{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ""}'
    return None


def _compile_row(job) -> Tuple[tuple, object]:
    try:
        return job, compile_variant(*job)
    except Exception as error:  # reported per variant, with the compiler's message
        return job, error


def shown(options: dict) -> str:
    return ' '.join(f'{key}={value}' for key, value in options.items())


def check_arch(arch: int, jobs: int) -> List[str]:
    """Compiles every variant for sm_``arch``, prints its table and returns its problems."""
    from mala_mm.ops import OPERATORS
    from mala_mm.ops.triton_launch import GPU, PLAN_SHARED_MEMORY
    gpu = GPU.of_arch(arch)
    work = [(kernel.__module__, kernel.__name__, options, dtype, arch) for operator in OPERATORS.values()
            for kernel, options in operator.variants(gpu) for dtype in MAP_DTYPES]
    with ProcessPoolExecutor(jobs) as pool:
        results = list(pool.map(_compile_row, work))
    limit = gpu.shared_memory // 1024
    print(f'\nsm_{arch}: {len(work)} variants, shared memory limit {limit} KiB a block\n')
    print('| kernel | variant | maps | shared KiB | registers | stack bytes |\n|---|---|---|---|---|---|')
    problems = []
    for (module, name, options, dtype, _), result in results:
        where = f'sm_{arch} {name} [{shown(options)}] {dtype} maps'
        if isinstance(result, Exception):
            print(f'| {name} | {shown(options)} | {dtype} | does not compile | | |')
            problems.append(f'{where} does not compile: {type(result).__name__}: {result}')
            continue
        shared, registers, stack = result
        print(f'| {name} | {shown(options)} | {dtype} | {shared / 1024:.0f} / {limit} | {registers} | {stack} |')
        if shared > min(gpu.shared_memory, PLAN_SHARED_MEMORY):
            problems.append(f'{where}: {shared / 1024:.0f} KiB of shared memory, over the {limit} KiB of the GPU or '
                            f'the {PLAN_SHARED_MEMORY // 1024} KiB that mala_mm.ops.triton_launch promises')
        if stack:
            problems.append(f'{where}: {stack} bytes of stack a thread (registers spilled)')
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--arch', type=int, action='append',
                        help='a compute capability such as 86 for sm_86 (repeatable; default: all, see above)')
    parser.add_argument('--jobs', type=int, default=os.cpu_count(), help='compiler processes (default: the cores)')
    args = parser.parse_args()
    # the kernels are defined when mala_mm.ops imports them: under the interpreter they would not be compiled
    if os.environ.get('TRITON_INTERPRET') == '1':
        fail('unset TRITON_INTERPRET: under the interpreter the kernels are not compiled')
    import triton

    from mala_mm.ops.triton_launch import SHARED_MEMORY_BY_ARCH
    archs = args.arch or list(REQUIRED_ARCHS)
    if not args.arch:
        for arch in NEWER_ARCHS:
            why_not = compiles_for(arch)
            if why_not is None:
                archs.append(arch)
            else:
                print(f'sm_{arch}: not checked, Triton {triton.__version__} does not compile for it ({why_not})')
    unknown = [arch for arch in archs if arch not in SHARED_MEMORY_BY_ARCH]
    if unknown:
        fail(f'no shared memory limit known for sm_{unknown[0]}; known: {sorted(SHARED_MEMORY_BY_ARCH)}')
    problems = []
    for arch in archs:
        problems += check_arch(arch, args.jobs)
    if problems:
        fail('\n'.join(problems))
    print(f'\nevery variant fits sm_{", sm_".join(map(str, archs))} with no stack, in fp32, bf16 and fp16 maps '
          f'(Triton {triton.__version__})')


if __name__ == '__main__':
    tool_main(main)
