#!/usr/bin/env bash
# Set up .venv (tools/setup_env.sh) and run the test suite; extra arguments go to pytest,
# e.g. `tools/run_tests.sh -m "not slow"` for the fast subset.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/tools/setup_env.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest "$@"
