#!/usr/bin/env bash
# Usage: tools/dist_test.sh CONFIG CHECKPOINT GPUS [tools/test.py options]
# Environment: NNODES, NODE_RANK, MASTER_ADDR, PORT (multi-node), PYTHON (interpreter, default: the
# repository's .venv, else python).
# Without CUDA the GPUS processes run on CPU with the gloo backend.
set -euo pipefail
TOOLS="$(dirname "$0")"
source "$TOOLS/dist_checks.sh"
[[ $# -ge 3 ]] || usage_error "usage: $0 CONFIG CHECKPOINT GPUS [test.py options]"
CONFIG="$1"
CHECKPOINT="$2"
GPUS="$3"
check_config "$CONFIG"
[[ -f "$CHECKPOINT" ]] || usage_error "checkpoint '$CHECKPOINT' does not exist"
check_process_count "$GPUS"
launch "$GPUS" "$TOOLS/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "${@:4}"
