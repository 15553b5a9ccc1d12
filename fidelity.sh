#!/usr/bin/env bash
# One fidelity run (docs/scale.md, "One fidelity run"): a ~50M-parameter teacher pretrained on the standard
# library, converted, REPR-ALIGN at λ 0 / 10 and OPDLM on / off policy, one markdown table at the end, at most
# 6 minutes on one H200 (no stage starts after 5; the limit below ends the run at 6). Extra flags go to
# benchmarks/fidelity.py, e.g. on a CPU (a micro teacher, a few steps, seconds):
#   bash fidelity.sh --device cpu --tiny
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
exec timeout 360 "$PYTHON" -m benchmarks.fidelity "$@"
