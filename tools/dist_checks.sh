# Checks shared by the launchers (dist_*.sh, slurm_*.sh), run before any process starts.
source "$(dirname "${BASH_SOURCE[0]}")/find_python.sh"

usage_error() { echo "error: $*" >&2; exit 2; }

check_config() {
    [[ -f "$1" ]] || usage_error "config file '$1' does not exist (see configs/detection and configs/segmentation)"
}

# With CUDA, at most one process per visible GPU; without it the processes run on CPU (gloo), and more
# processes than cores would only make each one slower, so that is refused as well. Uses the counts
# check_interpreter found.
check_process_count() {
    [[ "$1" =~ ^[1-9][0-9]*$ ]] || usage_error "GPUS must be a positive number of processes, got '$1'"
    local available="$TORCH_GPUS" what="CUDA GPUs"
    if (( TORCH_GPUS == 0 )); then
        available="$CPU_CORES" what="CPU cores and no CUDA GPU (on CPU: one process per core at most)"
    fi
    (( $1 <= available )) ||
        usage_error "asked for $1 processes, but this machine has $available $what; pass GPUS <= $available"
}

# check_launch CONFIG PROCS: what every local launch checks before torchrun starts.
check_launch() {
    check_config "$1"
    check_interpreter
    check_process_count "$2"
}

# split_max_restarts [train.py options]: sets RESTARTS (the value of --max-restarts N, 0 without) and TRAIN_ARGS
# (the other options, with --resume added where RESTARTS > 0: every restart picks up the latest checkpoint, and
# the first start finds none).
split_max_restarts() {
    TRAIN_ARGS=()
    RESTARTS=0
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --max-restarts) [[ $# -ge 2 ]] || usage_error "--max-restarts needs a number"; RESTARTS="$2"; shift 2 ;;
            --max-restarts=*) RESTARTS="${1#*=}"; shift ;;
            *) TRAIN_ARGS+=("$1"); shift ;;
        esac
    done
    [[ "$RESTARTS" =~ ^[0-9]+$ ]] || usage_error "--max-restarts must be a number of restarts, got '$RESTARTS'"
    if (( RESTARTS > 0 )) && [[ ! " ${TRAIN_ARGS[*]-} " =~ " --resume" ]]; then
        TRAIN_ARGS+=(--resume)
    fi
}

# torchrun with the multi-node settings upstream's scripts read from the environment.
# - One node without PORT: torchrun's --standalone rendezvous on a free port of this machine, so that a second job
#   on the machine (two 4-GPU jobs on an 8-GPU node, a test beside a training) does not collide with the first.
# - Several nodes, or PORT set: the nodes meet at MASTER_ADDR:PORT (default 29500). MAX_RESTARTS > 0: torchrun
#   restarts the process group that often after a process fails; the restarted processes must meet afresh, which
#   the static rendezvous cannot do (they would connect to their predecessors' addresses), so such runs use the
#   c10d rendezvous there (--standalone is one too).
launch() {
    local nproc="$1"; shift
    local address="${MASTER_ADDR:-127.0.0.1}" port="${PORT:-29500}" rendezvous
    if [[ "${NNODES:-1}" == 1 && -z "${PORT:-}" ]]; then
        rendezvous=(--standalone)
    elif (( ${MAX_RESTARTS:-0} > 0 )); then
        rendezvous=(--nnodes="${NNODES:-1}" --rdzv-backend=c10d --rdzv-endpoint="$address:$port"
                    --rdzv-id="${RDZV_ID:-mala_mm}")
    else
        rendezvous=(--nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" --master_addr="$address"
                    --master_port="$port")
    fi
    if (( ${MAX_RESTARTS:-0} > 0 )); then
        rendezvous+=(--max-restarts="$MAX_RESTARTS")
    fi
    PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")/..${PYTHONPATH:+:$PYTHONPATH}" \
    "$PYTHON" -m torch.distributed.run --nproc_per_node="$nproc" "${rendezvous[@]}" "$@"
}
