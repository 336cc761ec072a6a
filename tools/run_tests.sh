#!/usr/bin/env bash
# Set up .venv (tools/setup_env.sh) and run the test suite; extra arguments go to pytest,
# e.g. `tools/run_tests.sh -m "not slow"` for the fast subset, `-n 0` for one process.
#
# pytest-xdist runs it on one worker per core (at most 4), each test file on one worker, so that the training
# runs a file's tests share are made once, handing out the files in the suite's order (the longest files first,
# then the other slow ones: LONGEST_FILES in tests/conftest.py) rather than largest count of tests first
# (docs/dev/testing.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/tools/setup_env.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder "$@"
