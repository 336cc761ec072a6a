#!/usr/bin/env bash
# Create or reuse the virtual environment .venv at the repository root and install what is missing.
# Idempotent: a second run with nothing changed returns in about a second.
#
# Environment variables:
#   PYTHON          interpreter used to create .venv (default: python3; the stack is tested on 3.11)
#   TORCH_SPEC      pip requirement for torch (default: torch==2.13.0; set it for your CUDA build)
#   MMCV_WHEEL_DIR  a directory holding a prebuilt mmcv 2.1.0 wheel for this torch and Python
#   MALA_MM_CACHE   where built mmcv wheels are kept between checkouts (default: ~/.cache/mala_mm)
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
STAMP="$VENV/.mala_mm_setup"
want_stamp="$(stamp_inputs | sha256sum | cut -d' ' -f1)"
if [[ -x "$PY" && -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" ]]; then
    exit 0
fi

if [[ ! -x "$PY" ]]; then
    log "creating $VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
fi
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

# torch >= 2.6 needs setuptools >= 77.0.3; mmcv's setup.py and mmengine's `mmdet::`/`mmseg::` base-config
# resolution import pkg_resources, which setuptools 82 removed.
pip_install "setuptools>=77.0.3,<82" wheel ninja numpy
pip_install "$TORCH_SPEC"

mmcv_works() {
    "$PY" - <<PYCODE 2>/dev/null
import mmcv, mmcv.ops
assert mmcv.__version__ == "$MMCV_VERSION", mmcv.__version__
mmcv.ops.nms  # the compiled ops are what Mask R-CNN needs
PYCODE
}

install_mmcv_wheel() {  # $1: a wheel file; succeeds only if the installed mmcv then works with this torch
    log "installing $1"
    # --no-deps --force-reinstall replaces a broken mmcv of the same version; the second call adds its dependencies
    pip_install --no-deps --force-reinstall "$1" && pip_install "$1" && mmcv_works
}

# Wait for the build $1 writing to $2, with a line a minute: minutes so far and ninja's "[done/total]" count of
# compiled files. Returns the build's exit status.
show_progress() {
    local pid="$1" build_log="$2" start=$SECONDS next=60 compiled
    while kill -0 "$pid" 2>/dev/null; do
        sleep 2
        if (( SECONDS - start >= next )); then
            compiled="$(grep -oE '^\[[0-9]+/[0-9]+\]' "$build_log" | tail -1 || true)"
            log "building mmcv: $(( (SECONDS - start) / 60 )) min, files compiled: ${compiled:-none yet}"
            next=$(( next + 60 ))
        fi
    done
    wait "$pid"
}

# Where the installed mmcv came from, for the test suite's header: a slow run explains itself.
MMCV_SOURCE="$VENV/.mala_mm_mmcv_source"
if ! mmcv_works; then
    key="$("$PY" -c 'import sys, torch; print(f"mmcv'"$MMCV_VERSION"'-torch{torch.__version__}-cp{sys.version_info.major}{sys.version_info.minor}")')"
    cached_dir="$CACHE/wheels/$key"
    installed=0
    for dir in "${MMCV_WHEEL_DIR:-}" "$cached_dir"; do
        [[ -n "$dir" && -d "$dir" ]] || continue
        for whl in "$dir"/mmcv-"$MMCV_VERSION"-*.whl; do
            [[ -f "$whl" ]] || continue
            if install_mmcv_wheel "$whl"; then
                installed=1
                if [[ "$dir" == "$cached_dir" ]]; then echo "cached wheel $whl"; else echo "wheel directory $whl"; fi \
                    > "$MMCV_SOURCE"
                break 2
            fi
            log "$whl does not work with this torch/Python; trying the next source"
        done
    done
    if [[ $installed == 0 ]]; then
        mkdir -p "$cached_dir"
        build_dir="$(mktemp -d)"
        build_log="$cached_dir/build.log"
        log "building mmcv $MMCV_VERSION with its ops from source (15-30 minutes on 2 cores); whole output: $build_log"
        MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
            "$PY" -m pip wheel --disable-pip-version-check -v --no-build-isolation --no-deps \
            -w "$build_dir" "mmcv==$MMCV_VERSION" > "$build_log" 2>&1 &
        show_progress $! "$build_log" || { tail -20 "$build_log" >&2; log "the mmcv build failed; whole output: $build_log"; exit 1; }
        mv "$build_dir"/mmcv-*.whl "$cached_dir"/
        rmdir "$build_dir"
        install_mmcv_wheel "$cached_dir"/mmcv-"$MMCV_VERSION"-*.whl || { log "the built mmcv does not import"; exit 1; }
        echo "source build, kept as $(ls "$cached_dir"/mmcv-"$MMCV_VERSION"-*.whl)" > "$MMCV_SOURCE"
    fi
fi

pip_install -e "$ROOT[tests,deploy]"
echo "$want_stamp" > "$STAMP"
log "ready: $VENV"
