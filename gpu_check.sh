#!/usr/bin/env bash
# One GPU check (docs/scale.md, "One GPU check"): what only a GPU can measure, in one markdown table printed a row
# at a time, at most 8 minutes on one H200: no check starts after 6 minutes (its row says skipped), and the limit
# below ends the run at 8 (the rows printed so far stay). Extra flags go to benchmarks/bench.py, e.g. on a CPU (tiny shapes,
# seconds; the CUDA-only rows say "skipped (CPU)"):
#   bash gpu_check.sh --device cpu --tiny
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
# bash gpu_check.sh --fidelity [--device cpu --tiny]: the fidelity run instead (fidelity.sh, docs/scale.md)
if [ "${1:-}" = --fidelity ]; then shift; exec bash fidelity.sh "$@"; fi
exec timeout 480 "$PYTHON" -m benchmarks.bench --what gpu_check "$@"
