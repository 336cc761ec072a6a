#!/usr/bin/env bash
# Create or reuse the virtual environment .venv at the repository root and install what is missing.
# Idempotent: a second run with nothing changed returns in about a second.
#
# mmcv is built from source (it has no wheels on PyPI), with the ops the machine can run:
# - with its CUDA ops where torch has CUDA and there are GPU architectures to compile for (TORCH_CUDA_ARCH_LIST,
#   else those of the visible GPUs). The build uses a complete CUDA toolkit of torch's CUDA major version:
#   CUDA_HOME (or the one torch's extension builder finds) if it is complete, else PyPI's cuda-toolkit of the
#   version torch itself was built against, installed into .venv; and the C++ standard torch's headers require.
# - with its CPU ops otherwise (a CPU torch, or a CUDA torch on a machine without a visible GPU): the demo and the
#   tests run on CPU, and a line says what to set for GPU training.
#
# Environment variables:
#   PYTHON                interpreter used to create .venv (default: python3; see SUPPORTED_PYTHONS)
#   TORCH_SPEC            pip requirement for torch (default: the newest with wheels for .venv's Python, see
#                         default_torch_spec; set it for your CUDA build)
#   MMCV_WHEEL_DIR        a directory holding a prebuilt mmcv 2.1.0 wheel for this torch and Python
#   MALA_MM_CACHE         where built mmcv wheels are kept between checkouts (default: ~/.cache/mala_mm)
#   TORCH_CUDA_ARCH_LIST  GPU architectures the CUDA ops are compiled for, e.g. "8.0;9.0"
#   CUDA_HOME             a CUDA toolkit to build the CUDA ops with
#
# Sourcing it defines its functions without installing anything (the tests call them).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
MMCV_VERSION=2.1.0
CACHE="${MALA_MM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mala_mm}"
# the Pythons the setup takes: those mmcv 2.1.0, mmdet 3.3 and mmseg 1.2 support, with a torch that has wheels for
# each (which were set up and tested here, and how: docs/dev/tested_versions.md)
SUPPORTED_PYTHONS="3.8 3.9 3.10 3.11 3.12 3.13"

log() { printf '[setup_env] %s\n' "$*" >&2; }

# major.minor of the Python interpreter $1; fails where $1 is not one
python_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }

# The torch installed for Python $1 (major.minor) where TORCH_SPEC is unset: 2.13.0 where it has wheels (3.10 and
# newer), else the newest release with wheels for that Python (torch 2.5 dropped 3.8, 2.9 dropped 3.9).
default_torch_spec() {
    case "$1" in
        3.8) echo 'torch==2.4.1' ;;
        3.9) echo 'torch==2.8.0' ;;
        *) echo 'torch==2.13.0' ;;
    esac
}

# Everything that decides what gets installed (not where mmcv comes from); a change in any of it triggers a new
# install pass.
stamp_inputs() {
    printf '%s\n' "$TORCH_SPEC" "$MMCV_VERSION" "${TORCH_CUDA_ARCH_LIST:-}"
    cat "$ROOT/setup.py" "$ROOT/tools/setup.py" "$ROOT/tools/setup_env.sh"
}

pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

# Stops, before anything is downloaded, when the interpreter $1 that would create .venv is not a Python the
# stack is set up with, saying which to use instead.
check_python() {
    local version
    if ! version="$(python_version "$1")"; then
        log "error: '$1' is not a Python interpreter; set PYTHON to one (Python $SUPPORTED_PYTHONS)"
        exit 2
    fi
    if [[ " $SUPPORTED_PYTHONS " != *" $version "* ]]; then
        local newest="${SUPPORTED_PYTHONS##* }"
        log "error: $1 is Python $version, and the stack sets up with Python" \
            "${SUPPORTED_PYTHONS// /, } only (mmcv $MMCV_VERSION is built here from source): install Python" \
            "$newest (e.g. 'uv python install $newest' or pyenv) and run again with PYTHON=python$newest"
        exit 2
    fi
}

# Succeeds when the installed mmcv is $MMCV_VERSION and its compiled ops run where training will run them. $1:
# the ops it must have, "cuda" or "cpu" (default: cuda for a CUDA torch). With "cuda", an mmcv without CUDA ops
# is refused, and NMS runs on CUDA tensors where a GPU is visible; else NMS runs on CPU tensors. Otherwise
# prints why not, in one line.
mmcv_works() {
    MMCV_OPS="${1:-}" "$PY" - <<PYCODE 2>/dev/null
import os, sys
try:
    import torch, mmcv, mmcv.ops
    assert mmcv.__version__ == "$MMCV_VERSION", f'mmcv {mmcv.__version__} is installed, not $MMCV_VERSION'
    cuda_ops = os.environ['MMCV_OPS'] == 'cuda' if os.environ['MMCV_OPS'] else bool(torch.version.cuda)
    if cuda_ops and mmcv.ops.get_compiling_cuda_version() == 'not available':
        raise RuntimeError(f'mmcv was built without CUDA ops, and torch {torch.__version__} is to train on CUDA')
    device = 'cuda' if cuda_ops and torch.cuda.is_available() else 'cpu'
    # boxes 0 and 1 overlap with IoU 0.81, so NMS at 0.5 keeps boxes 0 and 2
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.], [20., 20., 30., 30.]], device=device)
    kept = mmcv.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7], device=device), 0.5)[1]
    assert kept.tolist() == [0, 2], f'mmcv.ops.nms on {device} kept boxes {kept.tolist()}, not [0, 2]'
except Exception as err:
    print(f'{type(err).__name__}: {err}'.splitlines()[0])
    sys.exit(1)
PYCODE
}

install_mmcv_wheel() {  # $1: a wheel file, $2: the ops it must have; succeeds only if the installed mmcv then works
    log "installing $1"
    local problem
    # --no-deps --force-reinstall replaces a broken mmcv of the same version; the second call adds its dependencies
    pip_install --no-deps --force-reinstall "$1" && pip_install "$1" || return 1
    if ! problem="$(mmcv_works "$2")"; then
        log "$1 does not work with this torch/Python (${problem:-its check crashed})"
        return 1
    fi
}

# One line about the installed torch, for building mmcv against it: its version, its CUDA version ("cpu"
# without), the GPU architectures a build compiles for (TORCH_CUDA_ARCH_LIST, else those of the visible GPUs;
# "none" without either), the Python tag, the CUDA toolkit torch's extension builder finds ("none" where it
# finds none), the C++ standard torch's headers require (17 or 20), and the version of PyPI's cuda-toolkit torch
# was built against ("none" for builds that do not depend on it).
torch_build_facts() {
    "$PY" - <<'PYCODE'
import os, re, sys, torch
from importlib import metadata
from torch.utils.cpp_extension import CUDA_HOME, include_paths
archs = os.environ.get('TORCH_CUDA_ARCH_LIST', '').replace(';', ' ').split()
if torch.version.cuda and not archs and torch.cuda.is_available():
    archs = sorted({'%d.%d' % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
with open(os.path.join(include_paths()[0], 'ATen', 'ATen.h')) as header:
    cxx_standard = 20 if 'C++20 or later' in header.read() else 17
toolkit = next((m.group(1) for m in map(re.compile(r'cuda-toolkit\[.*\]==([0-9.]+)').match,
                                        metadata.requires('torch') or []) if m), 'none')
print(torch.__version__, torch.version.cuda or 'cpu', '_'.join(archs) or 'none',
      f'cp{sys.version_info.major}{sys.version_info.minor}', CUDA_HOME or 'none', cxx_standard, toolkit)
PYCODE
}

# The build an mmcv wheel is for, as the name of its cache folder: $1 torch version, $2 the ops ("cpu", or the
# CUDA version they are built with), $3 GPU architectures, $4 Python tag; e.g.
# mmcv2.1.0-torch2.13.0+cu130-cuda13.0-sm8.0_9.0-cp311 or mmcv2.1.0-torch2.13.0+cu130-cpu-cp311. A CPU wheel then
# never stands in for a CUDA one, nor one GPU generation's for another's where machines share the cache.
mmcv_build_name() {
    local build=cpu
    [[ "$2" == cpu ]] || build="cuda$2-sm$3"
    echo "mmcv$MMCV_VERSION-torch$1-$build-$4"
}

# "building mmcv: M min, files compiled: N/TOTAL" from the build log $1 after $2 minutes: ninja's latest
# "[done/total]" line, which pip -v indents.
build_progress() {
    local compiled
    compiled="$(grep -oE '^[[:space:]]*\[[0-9]+/[0-9]+\]' "$1" | tail -1 | tr -d '[:space:][]' || true)"
    echo "building mmcv: $2 min, files compiled: ${compiled:-none yet}"
}

# Wait for the build $1 writing to $2, with a line a minute. Returns the build's exit status.
show_progress() {
    local pid="$1" build_log="$2" start=$SECONDS next=60
    while kill -0 "$pid" 2>/dev/null; do
        sleep 2
        if (( SECONDS - start >= next )); then
            log "$(build_progress "$build_log" $(( (SECONDS - start) / 60 )))"
            next=$(( next + 60 ))
        fi
    done
    wait "$pid"
}

# Why the folder $1 is not a CUDA toolkit that builds mmcv's CUDA ops against a torch of CUDA $2, in a few
# words; nothing where it is one: nvcc of the same major version, and the runtime, cuBLAS and cuSPARSE headers
# that mmcv's sources include.
toolkit_gaps() {
    local home="$1" want_major="${2%%.*}" version header
    if [[ ! -x "$home/bin/nvcc" ]]; then echo "no bin/nvcc"; return; fi
    version="$("$home/bin/nvcc" --version | grep -oE 'release [0-9]+\.[0-9]+' | cut -d' ' -f2)"
    if [[ "${version%%.*}" != "$want_major" ]]; then echo "nvcc is CUDA ${version:-of no known version}"; return; fi
    for header in cuda_runtime.h cublas_v2.h cusparse.h; do
        [[ -f "$home/include/$header" ]] || { echo "no include/$header"; return; }
    done
}

# PyPI's cuda-toolkit $1 with the parts mmcv's CUDA build needs, every compiler part pinned to that version by the
# toolkit's own extras: without the nvvm extra, nvcc's unpinned nvidia-nvvm comes at its newest, whose cicc writes
# PTX that the toolkit's own ptxas refuses (nvvm 13.5 against ptxas 13.0: "Unsupported .version 9.5").
cuda_toolkit_requirement() {
    echo "cuda-toolkit[nvcc,nvvm,cccl,crt,cudart,cublas,cusparse]==$1"
}

# The CUDA toolkit to build with, for a torch of CUDA $1 whose extension builder found $2 and that was built
# against PyPI's cuda-toolkit $3 ("none" if not): CUDA_HOME or $2 where complete, else that cuda-toolkit's
# compiler and headers installed into .venv. Stops with what to install where there is none.
find_cuda_toolkit() {
    local torch_cuda="$1" found="$2" pypi_toolkit="$3" home gaps="" site
    for home in "${CUDA_HOME:-}" "$found"; do
        [[ -n "$home" && "$home" != none ]] || continue
        local why
        why="$(toolkit_gaps "$home" "$torch_cuda")"
        [[ -z "$why" ]] && { echo "$home"; return; }
        gaps+="${gaps:+; }$home: $why"
    done
    if [[ "$pypi_toolkit" == none ]]; then
        log "error: building mmcv's CUDA ops for torch's CUDA $torch_cuda needs a complete CUDA ${torch_cuda%%.*}" \
            "toolkit (${gaps:-none found}); install one and set CUDA_HOME to it"
        exit 1
    fi
    log "no complete CUDA toolkit (${gaps:-none found}); installing PyPI's cuda-toolkit $pypi_toolkit, the one" \
        "torch was built against, into $VENV"
    pip_install $(cuda_toolkit_requirement "$pypi_toolkit") >&2
    site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    home="$site/nvidia/cu${torch_cuda%%.*}"
    gaps="$(toolkit_gaps "$home" "$torch_cuda")"
    if [[ -n "$gaps" ]]; then
        log "error: PyPI's cuda-toolkit $pypi_toolkit in $home is not complete ($gaps)"
        exit 1
    fi
    echo "$home"
}

# A folder holding libcudart.so for the link (-lcudart), where the toolkit $1 has only the versioned runtime
# (PyPI's runtime ships libcudart.so.13 alone); printed, or nothing where the toolkit has it.
unversioned_cudart() {
    local home="$1" dir runtime links
    for dir in "$home/lib64" "$home/lib"; do
        [[ -e "$dir/libcudart.so" ]] && return
    done
    runtime="$(ls "$home"/lib64/libcudart.so.* "$home"/lib/libcudart.so.* 2>/dev/null | head -1 || true)"
    [[ -n "$runtime" ]] || return
    links="$(mktemp -d)"
    ln -s "$runtime" "$links/libcudart.so"
    echo "$links"
}

# mmcv's source, unpacked into the folder $1, its setup.py made to run: set to the C++ standard $2 that torch's
# headers require (mmcv $MMCV_VERSION's setup.py passes -std=c++17 to g++ and nvcc, and torch >= 2.14 refuses
# anything below C++20), and reading its version through a namespace of its own (get_version reads what exec
# defined back through locals(), which Python 3.13 no longer updates: KeyError: '__version__'). The archive is
# fetched where pip would find it (tools/mala_tools/sdist.py): pip's own download runs the unpatched setup.py.
mmcv_source() {
    local into="$1" standard="$2" archive setup
    if ! archive="$("$PY" "$ROOT/tools/mala_tools/sdist.py" mmcv "$MMCV_VERSION" "$into")"; then
        log "error: could not fetch mmcv $MMCV_VERSION's source (above: why)"
        return 1
    fi
    tar -xzf "$archive" -C "$into"
    setup="$into/mmcv-$MMCV_VERSION/setup.py"
    if [[ "$standard" != 17 ]]; then
        log "torch requires C++$standard; building mmcv with -std=c++$standard in place of its setup.py's c++17"
        sed -i "s/-std=c++17/-std=c++$standard/g" "$setup"
    fi
    sed -i -e "s/exec(compile(f.read(), version_file, 'exec'))/exec(compile(f.read(), version_file, 'exec'), globals())/" \
        -e "s/return locals()\['__version__'\]/return globals()['__version__']/" "$setup"
    if ! grep -q "return globals()\['__version__'\]" "$setup"; then
        log "error: mmcv $MMCV_VERSION's setup.py has no get_version of the form patched here"
        return 1
    fi
    echo "$into/mmcv-$MMCV_VERSION"
}

# The debug information out of the wheel $1's shared objects, in place: a CUDA build's _ext is 109 MB with it and
# 26.5 MB without, its wheel 37.8 MB against 6.0 MB, which every cache, bundle and copy to a cluster carries.
strip_wheel() {
    local wheel="$1" unpacked
    unpacked="$(mktemp -d)"
    "$PY" -m wheel unpack -d "$unpacked" "$wheel" > /dev/null
    find "$unpacked" -name '*.so' -exec strip --strip-debug {} +
    "$PY" -m wheel pack -d "$(dirname "$wheel")" "$unpacked"/* > /dev/null
    rm -rf "$unpacked"
}

# Build mmcv's wheel into the cache folder $1: $2 the ops ("cpu", or the CUDA version for its CUDA ops), $3 the
# GPU architectures, $4 the CUDA toolkit, $5 the C++ standard.
build_mmcv() {
    local cached_dir="$1" ops="$2" cuda_archs="$3" cuda_home="$4" standard="$5" force_cuda=0 build_dir build_log
    local source cudart_dir=""
    if [[ "$ops" != cpu ]]; then
        force_cuda=1
        cudart_dir="$(unversioned_cudart "$cuda_home")"
        # for the download too: mmcv's setup.py, which pip runs to read its metadata, asks for CUDA_HOME
        export CUDA_HOME="$cuda_home" PATH="$cuda_home/bin:$PATH" TORCH_CUDA_ARCH_LIST="${cuda_archs//_/;}"
        export LIBRARY_PATH="${cudart_dir:+$cudart_dir:}${LIBRARY_PATH:-}"
        log "building with the CUDA ops for the architectures ${cuda_archs//_/, }, nvcc of $cuda_home"
    fi
    mkdir -p "$cached_dir"
    build_dir="$(mktemp -d)"
    build_log="$cached_dir/build.log"
    source="$(mmcv_source "$build_dir" "$standard")" || exit 1
    log "building mmcv $MMCV_VERSION with its ops from source (CPU ops: 15-30 minutes on 2 cores; CUDA ops: much" \
        "longer); whole output: $build_log"
    MMCV_WITH_OPS=1 FORCE_CUDA="$force_cuda" MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
        "$PY" -m pip wheel --disable-pip-version-check -v --no-build-isolation --no-deps \
        -w "$build_dir" "$source" > "$build_log" 2>&1 &
    if ! show_progress $! "$build_log"; then
        tail -20 "$build_log" >&2
        log "the mmcv build failed; whole output: $build_log"
        exit 1
    fi
    strip_wheel "$(ls "$build_dir"/mmcv-*.whl)"
    mv "$build_dir"/mmcv-*.whl "$cached_dir"/
    rm -rf "$build_dir" ${cudart_dir:+"$cudart_dir"}
}

# Installs an mmcv $MMCV_VERSION whose ops fit torch and the machine: a working one stays; else a wheel from
# MMCV_WHEEL_DIR or the cache; else one built here. $1: "cpu" for the CPU ops alone, also for a CUDA torch with a
# visible GPU (a build of minutes instead of one of tens of minutes; the offline bundle's --cpu-ops).
install_mmcv() {
    local only_cpu="${1:-}" torch_version torch_cuda cuda_archs py_tag cuda_home standard pypi_toolkit ops=cpu
    read -r torch_version torch_cuda cuda_archs py_tag cuda_home standard pypi_toolkit <<< "$(torch_build_facts)"
    if [[ "$only_cpu" == cpu ]]; then
        log "mmcv gets its CPU ops, as asked: the detectors' NMS and RoIAlign then run on CPU tensors only"
    elif [[ "$torch_cuda" != cpu ]]; then
        if [[ "$cuda_archs" == none ]]; then
            log "torch $torch_version has CUDA $torch_cuda, but no GPU is visible and TORCH_CUDA_ARCH_LIST is" \
                "unset: mmcv gets its CPU ops, and this environment trains on CPU; for GPU training set" \
                "TORCH_CUDA_ARCH_LIST to the GPUs' compute capabilities (e.g. \"8.0;9.0\" for A100 and H100)" \
                "and run again"
        else
            ops="$torch_cuda"
        fi
    fi
    local want=cpu
    [[ "$ops" == cpu ]] || want=cuda
    mmcv_works "$want" > /dev/null && return

    local mmcv_source="$VENV/.mala_mm_mmcv_source" cached_dir dir whl
    cached_dir="$CACHE/wheels/$(mmcv_build_name "$torch_version" "$ops" "$cuda_archs" "$py_tag")"
    for dir in "${MMCV_WHEEL_DIR:-}" "$cached_dir"; do
        [[ -n "$dir" && -d "$dir" ]] || continue
        for whl in "$dir"/mmcv-"$MMCV_VERSION"-*.whl; do
            [[ -f "$whl" ]] || continue
            if install_mmcv_wheel "$whl" "$want"; then
                if [[ "$dir" == "$cached_dir" ]]; then
                    echo "cached wheel $whl" > "$mmcv_source"
                else
                    echo "wheel directory $whl" > "$mmcv_source"
                fi
                return
            fi
        done
    done
    if [[ "$ops" != cpu ]]; then
        cuda_home="$(find_cuda_toolkit "$torch_cuda" "$cuda_home" "$pypi_toolkit")"
    fi
    build_mmcv "$cached_dir" "$ops" "$cuda_archs" "$cuda_home" "$standard"
    if ! install_mmcv_wheel "$cached_dir"/mmcv-"$MMCV_VERSION"-*.whl "$want"; then
        log "the built mmcv does not work"
        exit 1
    fi
    echo "source build, kept as $(ls "$cached_dir"/mmcv-"$MMCV_VERSION"-*.whl)" > "$mmcv_source"
}

main() {
    local stamp="$VENV/.mala_mm_setup" want_stamp interpreter="$PY"
    [[ -x "$PY" ]] || interpreter="${PYTHON:-python3}"
    # an interpreter that is not a Python gets the newest's torch here, and check_python's error below
    TORCH_SPEC="${TORCH_SPEC:-$(default_torch_spec "$(python_version "$interpreter" || true)")}"
    want_stamp="$(stamp_inputs | sha256sum | cut -d' ' -f1)"
    if [[ -x "$PY" && -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]]; then
        exit 0
    fi

    if [[ ! -x "$PY" ]]; then
        check_python "${PYTHON:-python3}"
        log "creating $VENV"
        "${PYTHON:-python3}" -m venv "$VENV"
    fi

    # torch >= 2.6 needs setuptools >= 77.0.3, which needs Python 3.9 (Python 3.8 gets torch 2.4.1, which does
    # not); mmcv's setup.py and mmengine's `mmdet::`/`mmseg::` base-config resolution import pkg_resources, which
    # setuptools 82 removed.
    pip_install "setuptools>=77.0.3,<82; python_version >= '3.9'" "setuptools<82; python_version < '3.9'" \
        wheel ninja numpy
    pip_install "$TORCH_SPEC"
    install_mmcv
    # the plugin, and beside it the code its tools, benchmarks and tests share (tools/setup.py)
    pip_install -e "$ROOT[tests,deploy]" -e "$ROOT/tools"
    echo "$want_stamp" > "$stamp"
    log "ready: $VENV"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
