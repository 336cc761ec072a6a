#!/usr/bin/env bash
# Usage: tools/dist_test.sh CONFIG CHECKPOINT GPUS [tools/test.py options]
# Environment: NNODES, NODE_RANK, MASTER_ADDR, PORT (multi-node; on one node torchrun chooses a free port
# unless PORT is set), PYTHON, MALA_MM_ALLOW_CPU.
# Interpreter: PYTHON if set, else the active environment's python ($VIRTUAL_ENV, else $CONDA_PREFIX), else the
# repository's .venv, else python on PATH (tools/dist_checks.sh). The first line on stderr names it, its torch and
# CUDA, and why it was chosen. On a machine with NVIDIA GPUs whose chosen torch cannot use them, the launcher
# stops (exit 2) instead of training on CPU; MALA_MM_ALLOW_CPU=1 runs it on CPU anyway.
# Without CUDA the GPUS processes run on CPU with the gloo backend.
set -euo pipefail
TOOLS="$(dirname "$0")"
source "$TOOLS/dist_checks.sh"
[[ $# -ge 3 ]] || usage_error "usage: $0 CONFIG CHECKPOINT GPUS [test.py options]"
CONFIG="$1" CHECKPOINT="$2" GPUS="$3"
[[ -f "$CHECKPOINT" ]] || usage_error "checkpoint '$CHECKPOINT' does not exist"
check_launch "$CONFIG" "$GPUS"
launch "$GPUS" "$TOOLS/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "${@:4}"
