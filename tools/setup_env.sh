#!/usr/bin/env bash
# Create or reuse the virtual environment .venv at the repository root and install what is missing.
# Idempotent: a second run with nothing changed returns in about a second.
#
# With a CUDA torch (TORCH_SPEC), mmcv is built with its CUDA ops (FORCE_CUDA=1), for the GPU architectures in
# TORCH_CUDA_ARCH_LIST if set, else torch's default (those of the GPUs visible during the build); that needs the
# CUDA toolkit (nvcc) of torch's CUDA version.
#
# Environment variables:
#   PYTHON                interpreter used to create .venv (default: python3; the stack is tested on 3.11)
#   TORCH_SPEC            pip requirement for torch (default: torch==2.13.0; set it for your CUDA build)
#   MMCV_WHEEL_DIR        a directory holding a prebuilt mmcv 2.1.0 wheel for this torch and Python
#   MALA_MM_CACHE         where built mmcv wheels are kept between checkouts (default: ~/.cache/mala_mm)
#   TORCH_CUDA_ARCH_LIST  GPU architectures the CUDA ops are compiled for, e.g. "8.0;9.0"
#
# Sourcing it defines its functions without installing anything (the tests use build_progress).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
MMCV_VERSION=2.1.0
CACHE="${MALA_MM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mala_mm}"

log() { printf '[setup_env] %s\n' "$*" >&2; }

# Everything that decides what gets installed (not where mmcv comes from); a change in any of it triggers a new
# install pass.
stamp_inputs() {
    printf '%s\n' "$TORCH_SPEC" "$MMCV_VERSION"
    cat "$ROOT/setup.py" "$ROOT/tools/setup_env.sh"
}

pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

# Succeeds when the installed mmcv is $MMCV_VERSION and its compiled ops run where training will run them: NMS
# on CUDA tensors with a CUDA torch and a GPU, else on CPU tensors. With a CUDA torch, an mmcv built without
# CUDA ops is refused even where no GPU is visible to try them. Otherwise prints why not, in one line.
mmcv_works() {
    "$PY" - <<PYCODE 2>/dev/null
import sys
try:
    import torch, mmcv, mmcv.ops
    assert mmcv.__version__ == "$MMCV_VERSION", f'mmcv {mmcv.__version__} is installed, not $MMCV_VERSION'
    if torch.version.cuda and mmcv.ops.get_compiling_cuda_version() == 'not available':
        raise RuntimeError(f'mmcv was built without CUDA ops, and torch {torch.__version__} has CUDA')
    device = 'cuda' if torch.version.cuda and torch.cuda.is_available() else 'cpu'
    # boxes 0 and 1 overlap with IoU 0.81, so NMS at 0.5 keeps boxes 0 and 2
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.], [20., 20., 30., 30.]], device=device)
    kept = mmcv.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7], device=device), 0.5)[1]
    assert kept.tolist() == [0, 2], f'mmcv.ops.nms on {device} kept boxes {kept.tolist()}, not [0, 2]'
except Exception as err:
    print(f'{type(err).__name__}: {err}'.splitlines()[0])
    sys.exit(1)
PYCODE
}

install_mmcv_wheel() {  # $1: a wheel file; succeeds only if the installed mmcv then works with this torch
    log "installing $1"
    local problem
    # --no-deps --force-reinstall replaces a broken mmcv of the same version; the second call adds its dependencies
    pip_install --no-deps --force-reinstall "$1" && pip_install "$1" || return 1
    if ! problem="$(mmcv_works)"; then
        log "$1 does not work with this torch/Python (${problem:-its check crashed})"
        return 1
    fi
}

# One line about the installed torch, for building mmcv against it: its version, its CUDA version ("cpu"
# without), the GPU architectures a build compiles for (TORCH_CUDA_ARCH_LIST, else torch's default: those of
# the visible GPUs; "none" without either), the Python tag, and the CUDA toolkit torch's extension builder
# uses ("none" where it finds none).
torch_build_facts() {
    "$PY" - <<'PYCODE'
import os, sys, torch
from torch.utils.cpp_extension import CUDA_HOME
archs = os.environ.get('TORCH_CUDA_ARCH_LIST', '').replace(';', ' ').split() or sorted(
    {'%d.%d' % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
print(torch.__version__, torch.version.cuda or 'cpu', '_'.join(archs) or 'none',
      f'cp{sys.version_info.major}{sys.version_info.minor}', CUDA_HOME or 'none')
PYCODE
}

# The build an mmcv wheel is for, as the name of its cache folder, from torch_build_facts' first four fields:
# e.g. mmcv2.1.0-torch2.5.1+cu124-cuda12.4-sm8.0_9.0-cp311 or mmcv2.1.0-torch2.13.0+cpu-cpu-cp311. A CPU wheel
# then never stands in for a CUDA one, nor one GPU generation's for another's where machines share the cache.
mmcv_build_name() {  # $1: torch version, $2: CUDA version or cpu, $3: architectures, $4: Python tag
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

# Build mmcv's wheel with its ops into the cache folder $1, against a torch with CUDA version $2 ("cpu": CPU ops
# only), for the GPU architectures $3, with the CUDA toolkit at $4 (torch_build_facts' fields).
build_mmcv() {
    local cached_dir="$1" torch_cuda="$2" cuda_archs="$3" cuda_home="$4" force_cuda=0 build_dir build_log
    if [[ "$torch_cuda" != cpu ]]; then
        force_cuda=1
        if [[ ! -x "$cuda_home/bin/nvcc" ]]; then
            log "torch has CUDA $torch_cuda, and its CUDA ops need that version's nvcc to build: install the CUDA" \
                "toolkit and set CUDA_HOME to it (torch's extension builder found: $cuda_home)"
            exit 1
        fi
        if [[ "$cuda_archs" == none ]]; then
            log "no GPU is visible to compile mmcv's CUDA ops for; set TORCH_CUDA_ARCH_LIST to the GPUs' compute" \
                "capabilities, e.g. TORCH_CUDA_ARCH_LIST=\"8.0;9.0\" for A100 and H100"
            exit 1
        fi
        log "building with the CUDA ops for the architectures $cuda_archs, nvcc of $cuda_home"
    fi
    mkdir -p "$cached_dir"
    build_dir="$(mktemp -d)"
    build_log="$cached_dir/build.log"
    log "building mmcv $MMCV_VERSION with its ops from source (15-30 minutes on 2 cores); whole output: $build_log"
    MMCV_WITH_OPS=1 FORCE_CUDA="$force_cuda" MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
        "$PY" -m pip wheel --disable-pip-version-check -v --no-build-isolation --no-deps \
        -w "$build_dir" "mmcv==$MMCV_VERSION" > "$build_log" 2>&1 &
    if ! show_progress $! "$build_log"; then
        tail -20 "$build_log" >&2
        log "the mmcv build failed; whole output: $build_log"
        exit 1
    fi
    mv "$build_dir"/mmcv-*.whl "$cached_dir"/
    rmdir "$build_dir"
}

main() {
    local stamp="$VENV/.mala_mm_setup" want_stamp
    want_stamp="$(stamp_inputs | sha256sum | cut -d' ' -f1)"
    if [[ -x "$PY" && -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]]; then
        exit 0
    fi

    if [[ ! -x "$PY" ]]; then
        log "creating $VENV"
        "${PYTHON:-python3}" -m venv "$VENV"
    fi

    # torch >= 2.6 needs setuptools >= 77.0.3; mmcv's setup.py and mmengine's `mmdet::`/`mmseg::` base-config
    # resolution import pkg_resources, which setuptools 82 removed.
    pip_install "setuptools>=77.0.3,<82" wheel ninja numpy
    pip_install "$TORCH_SPEC"

    # Where the installed mmcv came from, for the test suite's header: a slow run explains itself.
    local mmcv_source="$VENV/.mala_mm_mmcv_source"
    if ! mmcv_works > /dev/null; then
        local torch_version torch_cuda cuda_archs py_tag cuda_home cached_dir dir whl installed=0
        read -r torch_version torch_cuda cuda_archs py_tag cuda_home <<< "$(torch_build_facts)"
        cached_dir="$CACHE/wheels/$(mmcv_build_name "$torch_version" "$torch_cuda" "$cuda_archs" "$py_tag")"
        for dir in "${MMCV_WHEEL_DIR:-}" "$cached_dir"; do
            [[ -n "$dir" && -d "$dir" ]] || continue
            for whl in "$dir"/mmcv-"$MMCV_VERSION"-*.whl; do
                [[ -f "$whl" ]] || continue
                if install_mmcv_wheel "$whl"; then
                    installed=1
                    if [[ "$dir" == "$cached_dir" ]]; then
                        echo "cached wheel $whl" > "$mmcv_source"
                    else
                        echo "wheel directory $whl" > "$mmcv_source"
                    fi
                    break 2
                fi
            done
        done
        if [[ $installed == 0 ]]; then
            build_mmcv "$cached_dir" "$torch_cuda" "$cuda_archs" "$cuda_home"
            if ! install_mmcv_wheel "$cached_dir"/mmcv-"$MMCV_VERSION"-*.whl; then
                log "the built mmcv does not work"
                exit 1
            fi
            echo "source build, kept as $(ls "$cached_dir"/mmcv-"$MMCV_VERSION"-*.whl)" > "$mmcv_source"
        fi
    fi

    pip_install -e "$ROOT[tests,deploy]"
    echo "$want_stamp" > "$stamp"
    log "ready: $VENV"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
