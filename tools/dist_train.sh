#!/usr/bin/env bash
# Usage: tools/dist_train.sh CONFIG GPUS [tools/train.py options]
# Environment: NNODES, NODE_RANK, MASTER_ADDR, PORT (multi-node), PYTHON (interpreter, default: the
# repository's .venv, else python).
# Without CUDA the GPUS processes train on CPU with the gloo backend.
set -euo pipefail
TOOLS="$(dirname "$0")"
source "$TOOLS/dist_checks.sh"
[[ $# -ge 2 ]] || usage_error "usage: $0 CONFIG GPUS [train.py options]"
CONFIG="$1"
GPUS="$2"
check_config "$CONFIG"
check_process_count "$GPUS"
launch "$GPUS" "$TOOLS/train.py" "$CONFIG" --launcher pytorch "${@:3}"
