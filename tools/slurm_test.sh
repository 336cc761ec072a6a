#!/usr/bin/env bash
# Usage: [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] \
#        tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [tools/test.py options]
set -euo pipefail
source "$(dirname "$0")/slurm_run.sh"
[[ $# -ge 4 ]] || usage_error "usage: $0 PARTITION JOB_NAME CONFIG CHECKPOINT [test.py options]"
slurm_run "$1" "$2" test.py "$3" "$4" --launcher=slurm "${@:5}"
