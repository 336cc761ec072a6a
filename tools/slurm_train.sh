#!/usr/bin/env bash
# Usage: [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] \
#        tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [tools/train.py options]
set -euxo pipefail
source "$(dirname "$0")/slurm_run.sh"
slurm_run "$1" "$2" train.py "$3" --work-dir="$4" --launcher=slurm "${@:5}"
