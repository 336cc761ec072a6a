# What slurm_train.sh and slurm_test.sh share, sourced by both.
# slurm_run PARTITION JOB_NAME TOOL [TOOL ARGS...]: one srun task per GPU, each running tools/TOOL.
# Environment: GPUS (8), GPUS_PER_NODE (8), CPUS_PER_TASK (5), SRUN_ARGS, PYTHON, MALA_MM_ALLOW_CPU.
# Interpreter: chosen and checked as tools/dist_train.sh does (tools/find_python.sh), on the submitting machine.
source "$(dirname "${BASH_SOURCE[0]}")/find_python.sh"
slurm_run() {
    check_interpreter
    local tools
    tools="$(dirname "${BASH_SOURCE[0]}")"
    PYTHONPATH="$tools/..${PYTHONPATH:+:$PYTHONPATH}" \
    srun -p "$1" \
        --job-name="$2" \
        --gres=gpu:"${GPUS_PER_NODE:-8}" \
        --ntasks="${GPUS:-8}" \
        --ntasks-per-node="${GPUS_PER_NODE:-8}" \
        --cpus-per-task="${CPUS_PER_TASK:-5}" \
        --kill-on-bad-exit=1 \
        ${SRUN_ARGS:-} \
        "$PYTHON" -u "$tools/$3" "${@:4}"
}
