#!/usr/bin/env bash
# The learning-rate sweep of a conversion arm (docs/results.md, "Converting SmolLM2"): the arm trained at each rate
# of RATES for STEPS steps (a short budget: the arm's cosine schedule over those steps), each scored on the validation
# prompts (worlds/conversion.py's validation.jsonl: held out by subject as the test is, none a test prompt) at
# threshold 0.9; the rule, named in advance: the lowest −ELBO of the teacher's replies to them (a tie: the lower
# rate). Then the table with the chosen rate and whether it is an edge of the sweep (then extend RATES past it);
# beside it align.py's −ELBO of the corpus's validation conversations, whose subjects are trained on. The align.py
# arms (block0, masked0, align), after `bash run.sh real`; one arm per call:
#   ARM=block0 RATES="3e-5 1e-4 3e-4" STEPS=125 bash scripts/sweep_conversion.sh   # about 45 min on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."  # the project root
ARM=${ARM:?set ARM=block0, masked0 or align} RATES=${RATES:-3e-5 1e-4 3e-4} STEPS=${STEPS:-125}
SEED=${SEED:-1337} D=data/real O=out/real
source scripts/python_env.sh
python_env requirements.txt scripts/sweep_conversion.sh
[ -e $D/validation.jsonl ] || "$PYTHON" -m worlds.conversion --ckpt $O/ar --out_dir $D --chats 5000 --per_family 100 \
  --max_new_tokens 32 --seed 1337  # run.sh real's data stage, from before validation.jsonl: its cache answers
T0=$SECONDS
source scripts/stage.sh
VAL=(--prompts $D/validation.jsonl --max_new_tokens 32)
stage "eval teacher validation" $O/eval/ar-validation.json "$PYTHON" -m worlds.realworld --ckpt $O/ar "${VAL[@]}" \
  --out $O/eval/ar-validation.json
RUNS=()
for LR in $RATES; do
  NAME=sweep/$ARM-$LR-$STEPS-s$SEED R=out/conversion/sweep/$ARM-$LR-$STEPS-s$SEED
  ARM=$ARM LR=$LR STEPS=$STEPS SEED=$SEED NAME=$NAME TRAIN_ONLY=1 bash scripts/repro_conversion.sh
  stage "eval $ARM $LR validation" $R/eval/validation.json "$PYTHON" -m worlds.realworld --ckpt $R "${VAL[@]}" \
    --teacher $O/eval/ar-validation.json --thresholds 0.9 --out $R/eval/validation.json
  RUNS+=("$LR=$R")
done
"$PYTHON" -m scripts.report conversion_sweep $O/eval/ar-validation.json "${RUNS[@]}" | tee out/conversion/sweep/$ARM-$STEPS-s$SEED.md
