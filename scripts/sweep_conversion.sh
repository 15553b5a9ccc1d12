#!/usr/bin/env bash
# The learning-rate sweep of a conversion arm (docs/results.md, "Converting SmolLM2"): the arm trained at each rate
# of RATES for STEPS steps (a short budget: the arm's cosine schedule over those steps), each scored by the −ELBO of
# the conversion corpus's validation conversations at fixed masks (align.py's val_nelbo: no held-out prompt is used),
# then the table with the chosen rate and whether it is an edge of the sweep (then extend RATES past it). The align.py
# arms (block0, masked0, align), after `bash run.sh real`; one arm per call:
#   ARM=block0 RATES="3e-5 1e-4 3e-4" STEPS=125 bash scripts/sweep_conversion.sh   # about 35 min on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."  # the project root
ARM=${ARM:?set ARM=block0, masked0 or align} RATES=${RATES:-3e-5 1e-4 3e-4} STEPS=${STEPS:-125}
SEED=${SEED:-1337}
RUNS=()
for LR in $RATES; do
  NAME=sweep/$ARM-$LR-$STEPS-s$SEED
  ARM=$ARM LR=$LR STEPS=$STEPS SEED=$SEED NAME=$NAME TRAIN_ONLY=1 bash scripts/repro_conversion.sh
  RUNS+=("$LR=out/conversion/$NAME")
done
source scripts/python_env.sh
python_env requirements.txt scripts/sweep_conversion.sh
"$PYTHON" -m scripts.report conversion_sweep "${RUNS[@]}" | tee out/conversion/sweep/$ARM-$STEPS-s$SEED.md
