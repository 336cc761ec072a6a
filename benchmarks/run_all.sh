#!/usr/bin/env bash
# Run every benchmark on one device (default: cuda if available, else cpu); tables and plots go to
# benchmarks/results/<device>/. Extra arguments go to the backbone benchmark (e.g. --variants tiny small).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."  # the repository root, from which python -m finds the package
PY="${PYTHON:-.venv/bin/python}"
DEVICE="${DEVICE:-$("$PY" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')}"
"$PY" -m benchmarks.attention_op --device "$DEVICE"
"$PY" -m benchmarks.softmax_kernels --device "$DEVICE"
"$PY" -m benchmarks.backbone --device "$DEVICE" "$@"
"$PY" -m benchmarks.backbone --device "$DEVICE" --dtype bf16 --scaling-sides "$@"
if "$PY" -c 'import mmcv.ops' 2>/dev/null; then
    "$PY" -m benchmarks.dense_step --device "$DEVICE"
    "$PY" -m benchmarks.kernel_count
    "$PY" -m benchmarks.preflight_data
else
    echo "dense_step.py, kernel_count.py and preflight_data.py skipped: they need mmdet/mmseg with mmcv's compiled ops"
fi
