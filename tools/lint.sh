#!/usr/bin/env bash
# The checks OpenMMLab's repositories run before a commit, over the repository (settings in setup.cfg): flake8's
# errors and style at 120 columns, isort's import order, and codespell over the code and the pages. They come at
# the versions below, installed into .venv where missing (tools/setup_env.sh makes it); the same hooks run from
# .pre-commit-config.yaml in a clone with pre-commit installed. A few seconds.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
LINTERS=(flake8==7.5.0 isort==9.0.2 codespell==2.4.3)
cd "$ROOT"
if ! "$PY" - "${LINTERS[@]}" <<'PYCODE' 2>/dev/null; then
import sys
from importlib import metadata
sys.exit(any(metadata.version(name) != version for name, version in (spec.split('==') for spec in sys.argv[1:])))
PYCODE
    "$PY" -m pip install --disable-pip-version-check -q "${LINTERS[@]}"
fi
SOURCES=(mala_mm tools tests benchmarks configs setup.py)
status=0
"$PY" -m flake8 "${SOURCES[@]}" || status=1
"$PY" -m isort --check-only --diff "${SOURCES[@]}" || status=1
"$PY" -m codespell_lib || status=1
exit $status
