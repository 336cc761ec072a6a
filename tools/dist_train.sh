#!/usr/bin/env bash
# Usage: tools/dist_train.sh CONFIG GPUS [--max-restarts N] [tools/train.py options]
# Environment: NNODES, NODE_RANK, MASTER_ADDR, PORT (multi-node; on one node torchrun chooses a free port
# unless PORT is set), PYTHON, MALA_MM_ALLOW_CPU.
# Interpreter: PYTHON if set, else the active environment's python ($VIRTUAL_ENV, else $CONDA_PREFIX), else the
# repository's .venv, else python on PATH (tools/dist_checks.sh). The first line on stderr names it, its torch and
# CUDA, and why it was chosen. On a machine with NVIDIA GPUs whose chosen torch cannot use them, the launcher
# stops (exit 2) instead of training on CPU; MALA_MM_ALLOW_CPU=1 runs it on CPU anyway.
# Without CUDA the GPUS processes train on CPU with the gloo backend.
# --max-restarts N: when a process dies, torchrun restarts the whole group up to N times, and each start resumes
# from the latest complete checkpoint in the work dir (train.py --resume), so a killed rank costs the
# iterations since that checkpoint and no person.
set -euo pipefail
TOOLS="$(dirname "$0")"
source "$TOOLS/dist_checks.sh"
[[ $# -ge 2 ]] || usage_error "usage: $0 CONFIG GPUS [--max-restarts N] [train.py options]"
CONFIG="$1" GPUS="$2"
check_launch "$CONFIG" "$GPUS"
split_max_restarts "${@:3}"
MAX_RESTARTS="$RESTARTS" launch "$GPUS" "$TOOLS/train.py" "$CONFIG" --launcher pytorch ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"}
