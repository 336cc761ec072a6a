# Sourced by the launchers: chooses PYTHON, the interpreter they run, so that they run what the user runs.
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

# The NVIDIA GPUs of this machine, counted without torch (the chosen torch may be the CPU build that cannot
# see them): nvidia-smi's list, else the driver's /proc entries. MALA_MM_NVIDIA_SMI and MALA_MM_NVIDIA_GPUS_DIR
# replace the two probes, to test the launchers as they behave on a GPU machine.
nvidia_gpu_count() {
    local listing count=0
    if listing="$("${MALA_MM_NVIDIA_SMI:-nvidia-smi}" -L 2>/dev/null)"; then
        count="$(grep -c '^GPU [0-9]' <<< "$listing" || true)"
    fi
    if (( count == 0 )); then
        local gpus_dir="${MALA_MM_NVIDIA_GPUS_DIR:-/proc/driver/nvidia/gpus}"
        [[ -d "$gpus_dir" ]] && count="$(find "$gpus_dir" -mindepth 1 -maxdepth 1 | wc -l)"
    fi
    echo "$count"
}

# One line on stderr: the interpreter, its torch and CUDA, and why it was chosen. Then stops (exit 2) when this
# machine has NVIDIA GPUs that the chosen torch cannot use (a CPU build, or a CUDA build that sees none), since
# the run would silently train on CPU; MALA_MM_ALLOW_CPU=1 runs it on CPU anyway.
# Sets TORCH_GPUS (GPUs the chosen torch can use) and CPU_CORES (cores this process may run on), for the
# launchers' own checks. Importing torch takes seconds, so it is the only Python call the checks make.
check_interpreter() {
    local shown facts
    if ! shown="$(command -v "$PYTHON")"; then
        echo "error: the interpreter '$PYTHON' (chosen by $PYTHON_CHOSEN_BY) does not exist;" \
             "set PYTHON to the python of the environment that has torch and mala_mm" >&2
        exit 2
    fi
    # the facts come last on stdout; anything before them is a warning torch printed (e.g. about the driver)
    if ! facts="$("$PYTHON" -c '
import os, torch
gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
print(torch.__version__, torch.version.cuda or "none", gpus, len(os.sched_getaffinity(0)))' 2>&1)"; then
        echo "error: cannot import torch with $shown (chosen by $PYTHON_CHOSEN_BY): ${facts##*$'\n'};" \
             "activate the environment that has the stack (docs/get_started.md) or set PYTHON to its python" >&2
        exit 2
    fi
    local torch_version torch_cuda
    read -r torch_version torch_cuda TORCH_GPUS CPU_CORES <<< "${facts##*$'\n'}"
    local cuda_shown="CUDA: none"
    if [[ "$torch_cuda" != none ]]; then
        cuda_shown="CUDA $torch_cuda, $TORCH_GPUS GPU$( (( TORCH_GPUS == 1 )) || echo s)"
    fi
    echo "[mala_mm] python: $shown (torch $torch_version, $cuda_shown), chosen by $PYTHON_CHOSEN_BY" >&2
    if [[ "$facts" == *$'\n'* ]]; then echo "${facts%$'\n'*}" >&2; fi

    local machine_gpus
    machine_gpus="$(nvidia_gpu_count)"
    if (( machine_gpus > 0 && TORCH_GPUS == 0 )); then
        local why="built without CUDA"
        if [[ "$torch_cuda" != none ]]; then
            why="built with CUDA $torch_cuda but sees no GPU (driver too old? CUDA_VISIBLE_DEVICES?)"
        fi
        if [[ "${MALA_MM_ALLOW_CPU:-}" == 1 ]]; then
            echo "[mala_mm] MALA_MM_ALLOW_CPU=1: running on CPU although this machine has" \
                 "$machine_gpus NVIDIA GPUs" >&2
        else
            echo "error: this machine has $machine_gpus NVIDIA GPUs, but the chosen python, $shown, has torch" \
                 "$torch_version, $why; activate the environment with a CUDA torch or set PYTHON to its python" \
                 "(MALA_MM_ALLOW_CPU=1 runs on CPU anyway)" >&2
            exit 2
        fi
    fi
}
