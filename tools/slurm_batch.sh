#!/usr/bin/env bash
# A training run as a slurm batch job, for runs longer than one allocation. Submit from the repository root:
#   sbatch [--nodes=2] [--partition=P] [--time=2-00:00:00] tools/slurm_batch.sh CONFIG WORK_DIR \
#       [--max-restarts N] [train.py options]
# One task per GPU: the defaults below (one node of 8 GPUs) change on sbatch's command line, where --gres=gpu:G
# goes with --ntasks-per-node=G. --max-restarts N: a failed job step starts again within the job up to N times
# (tools/slurm_run.sh). Environment: PYTHON, MALA_MM_ALLOW_CPU.
# Every start resumes from the latest checkpoint in WORK_DIR (train.py --resume; the first finds none). Five
# minutes before the time limit the job requeues itself, and slurm requeues it too when a node fails (--requeue),
# so a 160k-iteration schedule runs to its end over as many allocations as it takes, losing at most the
# iterations since the last checkpoint each time.
#SBATCH --job-name=mala_mm
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gres=gpu:8
#SBATCH --cpus-per-task=5
#SBATCH --time=3-00:00:00
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@300
#SBATCH --output=%x-%j.out
set -euo pipefail
# sbatch runs a copy of this script from its spool folder, so the repository is found from where it was submitted
ROOT="${MALA_MM_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}"
if [[ ! -f "$ROOT/tools/slurm_run.sh" ]]; then
    echo "error: $ROOT is not the mala_mm repository; submit from its root or set MALA_MM_ROOT" >&2
    exit 2
fi
source "$ROOT/tools/slurm_run.sh"
[[ $# -ge 2 ]] || usage_error "usage: sbatch [sbatch options] tools/slurm_batch.sh CONFIG WORK_DIR [train.py options]"
check_config "$1"
check_interpreter  # on the job's first node, which has the GPUs

requeue() {
    echo "[mala_mm] the time limit is near: job $SLURM_JOB_ID requeues itself and resumes from the latest" \
         "checkpoint in its next allocation" >&2
    scontrol requeue "$SLURM_JOB_ID"
}
trap requeue USR1

SRUN_OPTIONS=()  # the job's allocation: one task per GPU
split_max_restarts "${@:3}"
[[ " ${TRAIN_ARGS[*]-} " =~ " --resume" ]] || TRAIN_ARGS+=(--resume)
# in the background, so that the signal's trap runs while the step does: bash runs traps between commands
MAX_RESTARTS="$RESTARTS" srun_restarting "$ROOT/tools/train.py" "$1" --work-dir="$2" --launcher=slurm \
    ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"} &
step=$!
status=0
wait "$step" || status=$?
while kill -0 "$step" 2>/dev/null; do  # a wait cut short by the signal: the step goes on until slurm ends it
    status=0
    wait "$step" || status=$?
done
exit "$status"
