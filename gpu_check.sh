#!/usr/bin/env bash
# One GPU check (docs/scale.md, "One GPU check"): what only a GPU can measure, in one markdown table, at most
# 8 minutes on one H200; a row that has not started by then is printed as skipped, and the hard limit below ends
# the run (the rows printed so far stay). Extra flags go to bench.py, e.g. on a CPU (seconds, tiny shapes):
#   bash gpu_check.sh --device cpu --tiny
set -euo pipefail
cd "$(dirname "$0")"
exec timeout 480 python bench.py --what gpu_check "$@"
