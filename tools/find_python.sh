# Sourced by the launchers: PYTHON is the interpreter they run. Unless it is set, the repository's .venv (made
# by tools/setup_env.sh) when it exists, so that the launchers work in a new shell without activating anything.
if [[ -z "${PYTHON:-}" ]]; then
    PYTHON="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin/python"
    [[ -x "$PYTHON" ]] || PYTHON=python
fi
