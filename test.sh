#!/usr/bin/env bash
# Installs the test requirements into the current Python and runs the test suite (CPU only).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
"$PYTHON" -m pip install -q --disable-pip-version-check -r requirements-dev.txt
"$PYTHON" -m ruff check .   # style first: one line-length limit, no undefined or unused names
"$PYTHON" -m pytest -q "$@"
