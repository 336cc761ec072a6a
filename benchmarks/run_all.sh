#!/usr/bin/env bash
# Run every benchmark on one device (default: cuda if available, else cpu); tables and plots go to
# benchmarks/results/<device>/. Extra arguments go to the backbone benchmark (e.g. --variants tiny small).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
PY="${PYTHON:-../.venv/bin/python}"
DEVICE="${DEVICE:-$("$PY" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')}"
"$PY" attention_op.py --device "$DEVICE"
"$PY" softmax_kernels.py --device "$DEVICE"
"$PY" backbone.py --device "$DEVICE" "$@"
"$PY" backbone.py --device "$DEVICE" --dtype bf16 --scaling-sides "$@"
if "$PY" -c 'import mmcv.ops' 2>/dev/null; then
    "$PY" dense_step.py --device "$DEVICE"
    "$PY" kernel_count.py
    "$PY" preflight_data.py
else
    echo "dense_step.py, kernel_count.py and preflight_data.py skipped: they need mmdet/mmseg with mmcv's compiled ops"
fi
