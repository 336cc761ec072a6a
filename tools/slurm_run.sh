# What slurm_train.sh, slurm_test.sh and slurm_batch.sh share, sourced by each.
# Environment: GPUS (8), GPUS_PER_NODE (8), CPUS_PER_TASK (5), SRUN_ARGS, PYTHON, MALA_MM_ALLOW_CPU, MAX_RESTARTS.
# Interpreter: chosen and checked as tools/dist_train.sh does (tools/dist_checks.sh), on the submitting machine;
# on the compute nodes, train.py and test.py themselves refuse CPU where the node has GPUs that torch cannot use.
source "$(dirname "${BASH_SOURCE[0]}")/dist_checks.sh"

# srun_restarting TOOL_PATH [TOOL ARGS...]: srun with the options in SRUN_OPTIONS (an array; none inside an
# allocation) running the tool. srun ends every task once one fails (--kill-on-bad-exit); with MAX_RESTARTS > 0
# the whole step is then started again, up to MAX_RESTARTS times, and each start resumes from the latest
# checkpoint (the caller passes train.py --resume), as torchrun --max-restarts does. An error the tool reports
# itself (exit status 2: a config, data or machine it refuses) stops at once, since a restart cannot fix it.
srun_restarting() {
    local restart=0 status
    while true; do
        status=0
        srun --kill-on-bad-exit=1 ${SRUN_OPTIONS[@]+"${SRUN_OPTIONS[@]}"} "$PYTHON" -u "$@" || status=$?
        if (( status == 0 || status == 2 || restart >= ${MAX_RESTARTS:-0} )); then
            return "$status"
        fi
        restart=$(( restart + 1 ))
        echo "[mala_mm] the job step failed (exit status $status); restart $restart of $MAX_RESTARTS," \
             "resuming from the latest checkpoint" >&2
    done
}

# slurm_run PARTITION JOB_NAME TOOL [TOOL ARGS...]: one srun task per GPU, each running tools/TOOL.
slurm_run() {
    check_interpreter
    SRUN_OPTIONS=(-p "$1" --job-name="$2" --gres=gpu:"${GPUS_PER_NODE:-8}" --ntasks="${GPUS:-8}"
                  --ntasks-per-node="${GPUS_PER_NODE:-8}" --cpus-per-task="${CPUS_PER_TASK:-5}" ${SRUN_ARGS:-})
    srun_restarting "$(dirname "${BASH_SOURCE[0]}")/$3" "${@:4}"
}
