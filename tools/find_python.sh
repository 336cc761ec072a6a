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

# One line on stderr: the interpreter, its torch and CUDA, and why it was chosen. Then stops (exit 2) when this
# machine has NVIDIA GPUs that the chosen torch cannot use (a CPU build, or a CUDA build that sees none), since
# the run would silently train on CPU; MALA_MM_ALLOW_CPU=1 runs it on CPU anyway. The check is the tools' own
# (python -m mala_tools.device, tools/mala_tools/device.py), run by the chosen interpreter.
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
    facts="$(PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")${PYTHONPATH:+:$PYTHONPATH}" \
             "$PYTHON" -m mala_tools.device "$shown" "$PYTHON_CHOSEN_BY" 2>"$messages")" || status=$?
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
