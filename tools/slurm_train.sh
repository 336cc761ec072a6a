#!/usr/bin/env bash
# Usage: [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] \
#        tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [--max-restarts N] [tools/train.py options]
# --max-restarts N: when a task dies, the whole job step starts again up to N times, each start resuming from
# the latest checkpoint in WORK_DIR (tools/slurm_run.sh). For a run longer than an interactive session:
# tools/slurm_batch.sh.
set -euo pipefail
source "$(dirname "$0")/slurm_run.sh"
[[ $# -ge 4 ]] || usage_error "usage: $0 PARTITION JOB_NAME CONFIG WORK_DIR [--max-restarts N] [train.py options]"
split_max_restarts "${@:5}"
MAX_RESTARTS="$RESTARTS" slurm_run "$1" "$2" train.py "$3" --work-dir="$4" --launcher=slurm \
    ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"}
