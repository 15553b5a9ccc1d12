#!/usr/bin/env bash
# The small-scale AR-MAP reproduction. DPO teaches the tiny AR teacher out/ar-tiny to prefer single-quoted strings
# (synthetic pairs cut from the corpus, worlds.stdlib); the preference task vector τ_pref = W_AR_aligned − W_AR is
# merged into the REPR-ALIGN DLM out/repro/lambda10 (made by scripts/repro_align.sh) by linear, TIES and DARE merging. γ is
# chosen on a sample of the training pairs and reported on the held-out pairs, every run on the same γ grid with the
# same mask draws (same --seed):
#   merged-{linear,ties,dare}   shared masks, the paper's rule (the best training-pair reward accuracy); the linear
#                               run also samples at every γ (the win rate per γ) and records the γ of --select dpo
#   merged-linear-independent   the merged models' masks drawn apart from the reference DLM's
# Finished stages are reused. Prints markdown tables (also saved to $OUT/table.md).
#   bash scripts/repro_merge.sh           # OUT=out/repro_merge, GAMMAS=0,0.5,1,2,3,4,6,8, DLM=out/repro/lambda10
#   SMOKE=1 bash scripts/repro_merge.sh   # a minute-long check of the whole chain (OUT=out/repro_merge_smoke)
set -euo pipefail
cd "$(dirname "$0")/.."  # the project root
PYTHON=${PYTHON:-python3}
if [ "${SMOKE:-0}" = 1 ]; then
  OUT=${OUT:-out/repro_merge_smoke}; GAMMAS=${GAMMAS:-0,1,4}
  PAIRS="--n_train 32 --n_heldout 16"; DPO="--max_iters 3 --eval_interval 2"
  MERGE="--n_select 16 --n_masks 1 --samples 2"
else
  OUT=${OUT:-out/repro_merge}; GAMMAS=${GAMMAS:-0,0.5,1,2,3,4,6,8}
  PAIRS=""; DPO=""; MERGE=""
fi
DLM=${DLM:-out/repro/lambda10}
for f in data/stdlib/meta.json out/ar-tiny/config.json; do
  [ -e $f ] || { echo "scripts/repro_merge.sh: run 'bash run.sh stdlib' first (it makes $(dirname $f))" >&2; exit 1; }
done
if [ ! -e "$DLM/config.json" ]; then
  echo "scripts/repro_merge.sh: no $DLM ('bash scripts/repro_align.sh' makes it); using the unaligned conversion out/dlm-tiny" \
       "instead, whose τ_diff is zero (no shadowing to measure)" >&2
  DLM=out/dlm-tiny
  [ -e $DLM/config.json ] || { echo "scripts/repro_merge.sh: no $DLM either: run 'bash run.sh stdlib' first" >&2; exit 1; }
fi

T0=$SECONDS
source scripts/stage.sh  # stage NAME DONE_FILE COMMAND...
P=$OUT/pairs
stage pairs "$P/heldout.jsonl" "$PYTHON" -m worlds.stdlib --data data/stdlib --out_dir "$P" $PAIRS
resume=$([ -e "$OUT/ar-dpo/train_state.pt" ] && echo --resume || true)  # an interrupted run continues
stage dpo "$OUT/ar-dpo/results.json" "$PYTHON" dpo.py --ar out/ar-tiny --pairs "$P/train.jsonl" \
  --heldout "$P/heldout.jsonl" --out_dir "$OUT/ar-dpo" $DPO $resume
stage spectrum "$OUT/spectrum.json" "$PYTHON" merge.py spectrum --ar out/ar-tiny --ar_aligned "$OUT/ar-dpo" \
  --dlm "$DLM" --out "$OUT/spectrum.json"
merge() {  # merge NAME [merge.py flags...]
  local name=$1; shift
  stage "merge $name" "$OUT/merged-$name/merge.json" "$PYTHON" merge.py merge --ar out/ar-tiny \
    --ar_aligned "$OUT/ar-dpo" --dlm "$DLM" --pairs "$P/train.jsonl" --heldout "$P/heldout.jsonl" \
    --out_dir "$OUT/merged-$name" --gammas "$GAMMAS" $MERGE "$@"
}
merge linear --win_rate_at all
merge ties --method ties
merge dare --method dare
merge linear-independent --masks independent

"$PYTHON" -m scripts.report repro_merge "$OUT" | tee "$OUT/table.md"
echo "scripts/repro_merge.sh: done in $((SECONDS - T0)) s"
