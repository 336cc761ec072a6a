# Checks shared by the launchers (dist_*.sh, slurm_*.sh), run before any process starts.

# PYTHON, the interpreter the launchers run, chosen so that they run what the user runs:
#   1. PYTHON, if set;
#   2. else the active environment's python: $VIRTUAL_ENV/bin/python, else $CONDA_PREFIX/bin/python;
#   3. else the repository's .venv (made by tools/setup_env.sh), so that the launchers work in a new shell
#      without activating anything;
#   4. else python on PATH.
# PYTHON_CHOSEN_BY says which rule chose it, for check_interpreter's line.
if [[ -n "${PYTHON:-}" ]]; then
    PYTHON_CHOSEN_BY="PYTHON"
elif [[ -n "${VIRTUAL_ENV:-}" && -x "$VIRTUAL_ENV/bin/python" ]]; then
    PYTHON="$VIRTUAL_ENV/bin/python" PYTHON_CHOSEN_BY="the active environment (VIRTUAL_ENV)"
elif [[ -n "${CONDA_PREFIX:-}" && -x "$CONDA_PREFIX/bin/python" ]]; then
    PYTHON="$CONDA_PREFIX/bin/python" PYTHON_CHOSEN_BY="the active environment (CONDA_PREFIX)"
elif [[ -x "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin/python" ]]; then
    PYTHON="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin/python"
    PYTHON_CHOSEN_BY="the repository .venv, as neither PYTHON nor an active environment names one"
else
    PYTHON=python PYTHON_CHOSEN_BY="PATH, as neither PYTHON, an active environment nor a repository .venv names one"
fi

# One line on stderr: the interpreter, its torch and CUDA, and why it was chosen. Then stops (exit 2) when this
# machine has NVIDIA GPUs that the chosen torch cannot use (a CPU build, or a CUDA build that sees none), since
# the run would silently train on CPU; MALA_MM_ALLOW_CPU=1 runs it on CPU anyway. The check is the tools' own
# (python -m mala_tools.device, tools/mala_tools/device.py), run by the chosen interpreter, whose environment
# has mala_tools installed beside mala_mm (tools/setup.py).
# Sets TORCH_GPUS (GPUs the chosen torch can use) and CPU_CORES (cores this process may run on), for the
# launchers' own checks. Importing torch takes seconds, so it is the only Python call the checks make.
check_interpreter() {
    local shown facts status=0 messages
    if ! shown="$(command -v "$PYTHON")"; then
        echo "error: the interpreter '$PYTHON' (chosen by $PYTHON_CHOSEN_BY) does not exist;" \
             "set PYTHON to the python of the environment that has torch and mala_mm" >&2
        exit 2
    fi
    messages="$(mktemp)"
    facts="$("$PYTHON" -m mala_tools.device "$shown" "$PYTHON_CHOSEN_BY" 2>"$messages")" || status=$?
    if (( status != 0 && status != 2 )); then
        echo "error: $shown (chosen by $PYTHON_CHOSEN_BY) cannot run the launch check: $(tail -n 1 "$messages");" \
             "activate the environment that has the stack (docs/get_started.md) or set PYTHON to its python" >&2
        rm -f "$messages"
        exit 2
    fi
    cat "$messages" >&2
    rm -f "$messages"
    (( status == 0 )) || exit 2
    read -r TORCH_GPUS CPU_CORES <<< "${facts##*$'\n'}"
}


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
    "$PYTHON" -m torch.distributed.run --nproc_per_node="$nproc" "${rendezvous[@]}" "$@"
}
