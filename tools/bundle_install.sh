#!/usr/bin/env bash
# Install an offline bundle (tools/make_bundle.py makes it; this file is its install.sh) with no network, into a
# Python environment that has torch: the active interpreter's (or --python's) environment, or a --target folder.
# torch is never installed, upgraded or replaced. mmcv is built from the bundle's source against that torch by
# tools/setup_env.sh's functions: with the CUDA ops for the visible GPUs (or TORCH_CUDA_ARCH_LIST) on every core,
# with the CPU ops only under --cpu-ops; a prebuilt wheel (the bundle's mmcv/, or MMCV_WHEEL_DIR) skips the build
# where it works with that torch.
#
#   bash BUNDLE/install.sh [--python PY] [--target DIR] [--cpu-ops] [--record FILE] [--check [GPU_CHECK_ARGS ...]]
#
#   --python PY    the interpreter whose torch the stack is built against (default: python3 on PATH)
#   --target DIR   install into DIR (then run with PYTHONPATH=DIR) instead of PY's environment
#   --cpu-ops      mmcv with its CPU ops only: minutes to build, but Mask R-CNN cannot then run on a GPU
#   --record FILE  where the install's facts go, the mmcv build time among them (default: BUNDLE/install_record.json)
#   --check ...    then run benchmarks/gpu_check.py of the bundle, with the arguments that follow
#
# Exit status 2, with one "error:" line, where the bundle does not fit the interpreter.
set -euo pipefail
BUNDLE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

die() { printf '[install] error: %s\n' "$*" >&2; exit 2; }
say() { printf '[install] %s\n' "$*" >&2; }

python_arg="" target="" ops="" record="$BUNDLE/install_record.json" check=0
while (( $# )); do
    case "$1" in
        --python|--target|--record)
            (( $# >= 2 )) || die "$1 needs a value"
            case "$1" in --python) python_arg="$2" ;; --target) target="$2" ;; --record) record="$2" ;; esac
            shift 2 ;;
        --cpu-ops) ops=cpu; shift ;;
        --check) check=1; shift; break ;;
        -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | cut -c3-; exit 0 ;;
        *) die "unknown argument '$1' (bash $0 --help lists them)" ;;
    esac
done

[[ -f "$BUNDLE/bundle.json" ]] || die "$BUNDLE has no bundle.json: run the install.sh of a bundle made by tools/make_bundle.py"
if [[ -z "$python_arg" ]]; then
    python_arg="$(command -v python3 || command -v python || true)"
    [[ -n "$python_arg" ]] || die "no python3 on PATH: activate the environment that has torch, or pass --python"
fi
command -v "$python_arg" > /dev/null || die "--python $python_arg: no such interpreter"

# tools/setup_env.sh's functions (sourcing installs nothing); they install into $PY's environment, or with
# PIP_TARGET into the target folder, from the bundle alone
source "$BUNDLE/source/tools/setup_env.sh"
PY="$(command -v "$python_arg")"
# a prebuilt mmcv the bundle carries (make_bundle.py --mmcv-wheel), unless MMCV_WHEEL_DIR names another
if [[ -z "${MMCV_WHEEL_DIR:-}" && -d "$BUNDLE/mmcv" ]]; then
    export MMCV_WHEEL_DIR="$BUNDLE/mmcv"
fi
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$BUNDLE/wheels" PIP_DISABLE_PIP_VERSION_CHECK=1
if [[ -n "$target" ]]; then
    mkdir -p "$target"
    target="$(cd "$target" && pwd)"
    # --target ignores what the environment has installed, so every package is named and none is resolved
    export PIP_TARGET="$target" PIP_NO_DEPS=1 PIP_UPGRADE=1 PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
    VENV="$target"
else
    VENV="$("$PY" -c 'import sys; print(sys.prefix)')"
fi

# The bundle's Python, torch, and the packages the bundle was made without: one error line naming what is missing.
# prints "NAME PROVIDER" for each left-out package that another distribution stands in for
stand_ins="$("$PY" - "$BUNDLE/bundle.json" <<'PYCODE'
import json, sys
from importlib import metadata
# the builds of OpenCV on PyPI: each provides cv2, which is what mmcv and mmengine import
OPENCV = ('opencv-python', 'opencv-python-headless', 'opencv-contrib-python', 'opencv-contrib-python-headless')


def installed(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


manifest = json.load(open(sys.argv[1]))
have = '%d.%d' % sys.version_info[:2]
problems = []
if have != manifest['python']:
    problems.append(f"the bundle is for Python {manifest['python']}, {sys.executable} is Python {have}: make the "
                    f"bundle with --python {have}, or pass --python with a Python {manifest['python']}")
missing = []
for name in ['torch', *manifest['left_out']]:
    if installed(name):
        continue
    provider = next((other for other in OPENCV if installed(other)), None) if name in OPENCV else None
    if provider:
        print(name, provider)
    else:
        missing.append(name)
if 'torch' in missing:
    problems.append(f'{sys.executable} has no torch: install torch first, or pass the --python that has it')
left_out = [name for name in missing if name != 'torch']
if left_out:
    tested = ', '.join(f"{name} {manifest['left_out'][name]}" for name in left_out)
    problems.append(f"the bundle was made without {', '.join(left_out)} (--leave-out), and {sys.executable} lacks "
                    f'them: install them (tested: {tested}), or make the bundle without leaving them out')
if problems:
    print('[install] error: ' + '; '.join(problems), file=sys.stderr)
    sys.exit(2)
PYCODE
)" || exit 2
if [[ -n "$stand_ins" && -z "$target" ]]; then
    # pip would resolve mmengine's and mmcv's requirement of opencv-python and find none: every bundled package
    # is named and none is resolved, as --target installs them ('pip check' will name the stand-in)
    export PIP_NO_DEPS=1
fi
while read -r name provider; do
    [[ -n "$name" ]] && say "$provider provides cv2 in place of $name"
done <<< "$stand_ins"

torch_before="$("$PY" -W ignore -c 'import torch; print(torch.__version__, torch.__file__)')"
say "installing into ${target:-the environment of $PY} (torch ${torch_before%% *}, left as it is)"
if [[ -n "$target" || -n "$stand_ins" ]]; then
    mapfile -t wheels < <(ls "$BUNDLE"/wheels/*.whl | grep -v '/mala_mm\(_tools\)\?-')
    pip_install "${wheels[@]}"
else
    mapfile -t roots < <("$PY" -c 'import json, sys; print(*json.load(open(sys.argv[1]))["roots"], sep="\n")' \
                                "$BUNDLE/bundle.json")
    pip_install "${roots[@]}"
fi

started=$SECONDS
install_mmcv "$ops"
mmcv_seconds=$(( SECONDS - started ))
mmcv_from="already installed, working"
[[ -f "$VENV/.mala_mm_mmcv_source" ]] && mmcv_from="$(cat "$VENV/.mala_mm_mmcv_source")"
pip_install --no-deps "$BUNDLE"/wheels/mala_mm-*.whl "$BUNDLE"/wheels/mala_mm_tools-*.whl

"$PY" -c 'import mala_mm, mala_tools, mmdet, mmseg, mmcv.ops' \
    || die "the installed stack does not import (above: why)"
[[ "$("$PY" -c 'import torch; print(torch.__version__, torch.__file__)')" == "$torch_before" ]] \
    || die "torch changed during the install (was $torch_before)"
"$PY" - "$record" "$mmcv_from" "$mmcv_seconds" "${ops:-as the machine allows}" "${target:-}" <<'PYCODE'
import json, sys, torch
record, mmcv_from, seconds, ops, target = sys.argv[1:]
json.dump(dict(python=sys.version.split()[0], torch=torch.__version__, mmcv=mmcv_from, mmcv_seconds=int(seconds),
               mmcv_ops=ops, target=target or None), open(record, 'w'), indent=1)
PYCODE
say "ready: mmcv ($mmcv_from) in $mmcv_seconds s; facts in $record"

if (( check )); then
    # the benchmarks are a package of the source's root, which -m finds on PYTHONPATH from any folder
    PYTHONPATH="$BUNDLE/source${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m benchmarks.gpu_check --install-record "$record" "$@"
fi
