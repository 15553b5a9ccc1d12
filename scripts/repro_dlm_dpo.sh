#!/usr/bin/env bash
# AR-MAP against the DLM-only baseline, on run.sh's checkpoints, in both worlds and for each seed in SEEDS. Two
# routes to a preference-aligned DLM from the same pairs, the same steps and the same DPO settings:
#   AR-MAP    dpo.py on the AR teacher, then merge.py merge into the REPR-ALIGN DLM (γ chosen on training pairs)
#   DLM-only  dpo.py --dlm on the REPR-ALIGN DLM itself (DPO on its ELBO, one draw (t, M) shared per pair)
# Each route's wall-clock seconds are measured here, stage by stage, one process at a time. Prints markdown tables
# (also saved to $OUT/table.md).
#   bash run.sh && bash run.sh stdlib && bash scripts/repro_dlm_dpo.sh   # OUT=out/repro_dlm_dpo, SEEDS="1337 1338"
#   SMOKE=1 bash scripts/repro_dlm_dpo.sh                                 # a short check of the chain
#   PART=protocol bash scripts/repro_dlm_dpo.sh   # the standard library's two routes under the protocol (docs/
#     results.md, "The verdict protocol"; the exact-answer world's: PART=protocol bash scripts/repro_mark.sh): each
#     route's DPO rate from SWEEP_LRS at the first seed, judged by its win rate against the REPR-ALIGN DLM on the
#     first half of the held-out pairs' prompts (the highest; a tie: the lower rate); then SEEDS (default 1337 1338
#     1339) at the chosen rates, DPO on the DLM also for AR-MAP's seconds; the tests on the other half: each
#     completion's rule score and each validation sequence's -ELBO, paired over (seed, item). Writes
#     $OUT/protocol/protocol.md
set -euo pipefail
cd "$(dirname "$0")/.."  # the project root
PYTHON=${PYTHON:-python3}
PART=${PART:-all}
SEEDS=${SEEDS:-$([ "$PART" = protocol ] && echo "1337 1338 1339 1340 1341" || echo "1337 1338")}
SWEEP_LRS=${SWEEP_LRS:-"6e-4 2e-4 6e-5"}
if [ "${SMOKE:-0}" = 1 ]; then
  OUT=${OUT:-out/repro_dlm_dpo_smoke}; TASK_DPO="--max_iters 4 --eval_interval 2"; STD_DPO="--max_iters 2"
  NP=10; SAMPLES=4
else
  OUT=${OUT:-out/repro_dlm_dpo}; TASK_DPO="--max_iters 100 --eval_interval 50"; STD_DPO=""; NP=100; SAMPLES=32
fi
for f in out/tasks/align/config.json out/tasks/ar/config.json out/align/config.json out/ar-tiny/config.json \
         data/pairs/heldout.jsonl; do
  [ -e $f ] || { echo "scripts/repro_dlm_dpo.sh: no $f: run 'bash run.sh' and 'bash run.sh stdlib' first" >&2; exit 1; }
done
mkdir -p "$OUT"
T0=$SECONDS STAGE_LOG=$OUT/seconds.tsv  # each stage's seconds, read by report.py
source scripts/stage.sh  # stage NAME DONE_FILE COMMAND...
if [ "$PART" = protocol ]; then
  P=$OUT/protocol STAGE_LOG=$OUT/protocol/seconds.tsv s0=${SEEDS%% *}
  mkdir -p $P/eval
  head -n 32 data/pairs/heldout.jsonl > $P/pairs_val.jsonl  # the sweep's prompts
  tail -n +33 data/pairs/heldout.jsonl > $P/pairs_test.jsonl  # the test's
  PAIRS=(--pairs data/pairs/train.jsonl --heldout data/pairs/heldout.jsonl)
  routes() {  # routes RATE_AR RATE_DLM SEED: AR-MAP (DPO on the teacher, merged) and DPO on the DLM
    stage "ar-dpo $1 $3" $P/ar-dpo-$1-s$3/results.json "$PYTHON" dpo.py --ar out/ar-tiny "${PAIRS[@]}" $STD_DPO \
      $(lr $1) --seed $3 --out_dir $P/ar-dpo-$1-s$3
    stage "merge $1 $3" $P/ar-map-$1-s$3/merge.json "$PYTHON" merge.py merge --ar out/ar-tiny --ar_aligned \
      $P/ar-dpo-$1-s$3 --dlm out/align "${PAIRS[@]}" --gammas 0,1,2,4,8 --n_masks 2 --samples 0 --seed $3 \
      --out_dir $P/ar-map-$1-s$3
    stage "dlm-dpo $2 $3" $P/dlm-dpo-$2-s$3/results.json "$PYTHON" dpo.py --dlm --ar out/align "${PAIRS[@]}" \
      $STD_DPO $(lr $2) --seed $3 --out_dir $P/dlm-dpo-$2-s$3
  }
  sweep_run() {  # both routes at one rate, and their validation win rates
    routes $1 $1 $s0
    stage "winrate val $1" $P/eval/val-$1.json "$PYTHON" eval.py winrate --ckpt $P/ar-map-$1-s$s0 $P/dlm-dpo-$1-s$s0 \
      --ref out/align --pairs $P/pairs_val.jsonl --samples 32 --seed $s0 --out $P/eval/val-$1.json
  }
  rates=$SWEEP_LRS  # goes on past a route's chosen edge
  sweep rates sweep_run "$PYTHON -m scripts.report winrate_sweep --extend $P"
  ra=$("$PYTHON" -m scripts.report winrate_sweep $P 0 $rates)  # AR-MAP: the first --ckpt
  rd=$("$PYTHON" -m scripts.report winrate_sweep $P 1 $rates)
  k=$("$PYTHON" -m scripts.report dlm_dpo_steps $P $ra $rd 30 $s0)  # DLM-only's steps in AR-MAP's seconds (dpo.py: 30)
  for s in $SEEDS; do
    routes $ra $rd $s
    ms="$P/ar-map-$ra-s$s $P/dlm-dpo-$rd-s$s"
    if [ "$k" != 30 ]; then
      stage "dlm-dpo-time $rd $s" $P/dlm-dpo-time-$rd-s$s/results.json "$PYTHON" dpo.py --dlm --ar out/align \
        "${PAIRS[@]}" $STD_DPO $(lr $rd) --max_iters $k --seed $s --out_dir $P/dlm-dpo-time-$rd-s$s
      ms="$ms $P/dlm-dpo-time-$rd-s$s"
    fi
    stage "winrate test $s" $P/eval/test-s$s.json "$PYTHON" eval.py winrate --ckpt $ms --ref out/align \
      --pairs $P/pairs_test.jsonl --samples 32 --seed $s --out $P/eval/test-s$s.json
    for m in $ms; do
      stage "likelihood $(basename $m)" $P/eval/lik-$(basename $m).json "$PYTHON" eval.py likelihood --ckpt $m \
        --data data/stdlib --n_batches 8 --n_draws 4 --half second --out $P/eval/lik-$(basename $m).json
    done
  done
  stage "likelihood align" $P/eval/lik-align.json "$PYTHON" eval.py likelihood --ckpt out/align --data data/stdlib \
    --n_batches 8 --n_draws 4 --half second --out $P/eval/lik-align.json
  "$PYTHON" -m scripts.report stdlib_armap_protocol $P $ra $rd $k "$rates" $SEEDS | tee $P/protocol.md
  exit 0
fi
D=data/tasks O=out/tasks
for s in $SEEDS; do
  R=$OUT/tasks/$s
  # run.sh's DPO settings in the task world, for both routes
  DPO=(--pairs $D/pairs_train.jsonl --heldout $D/pairs_heldout.jsonl --lr 1e-3 --batch_size 16 --sft_weight 1
       --seed $s $TASK_DPO)
  stage "tasks $s ar-dpo" $R/ar-dpo/results.json "$PYTHON" dpo.py --ar $O/ar "${DPO[@]}" --out_dir $R/ar-dpo
  stage "tasks $s merge" $R/merged/merge.json "$PYTHON" merge.py merge --ar $O/ar --ar_aligned $R/ar-dpo \
    --dlm $O/align --pairs $D/pairs_train.jsonl --heldout $D/pairs_heldout.jsonl --out_dir $R/merged \
    --gammas 0,0.25,0.5,0.75,1 --n_masks 2 --samples 0 --seed $s
  stage "tasks $s dlm-dpo" $R/dlm-dpo/results.json "$PYTHON" dpo.py --dlm --ar $O/align "${DPO[@]}" \
    --out_dir $R/dlm-dpo
  for m in merged dlm-dpo; do
    stage "tasks $s eval $m" $R/eval/$m.json "$PYTHON" eval.py tasks --ckpt $R/$m --data $D --num_prompts $NP \
      --thresholds 0.9 --out $R/eval/$m.json
  done
done
for s in $SEEDS; do
  R=$OUT/stdlib/$s
  PAIRS=(--pairs data/pairs/train.jsonl --heldout data/pairs/heldout.jsonl)
  stage "stdlib $s ar-dpo" $R/ar-dpo/results.json "$PYTHON" dpo.py --ar out/ar-tiny "${PAIRS[@]}" --seed $s \
    $STD_DPO --out_dir $R/ar-dpo
  stage "stdlib $s merge" $R/merged/merge.json "$PYTHON" merge.py merge --ar out/ar-tiny --ar_aligned $R/ar-dpo \
    --dlm out/align "${PAIRS[@]}" --out_dir $R/merged --gammas 0,1,2,4,8 --n_masks 2 --samples 0 --seed $s
  stage "stdlib $s dlm-dpo" $R/dlm-dpo/results.json "$PYTHON" dpo.py --dlm --ar out/align "${PAIRS[@]}" --seed $s \
    $STD_DPO --out_dir $R/dlm-dpo
  stage "stdlib $s winrate" $R/winrate.json "$PYTHON" eval.py winrate --ckpt $R/merged $R/dlm-dpo --ref out/align \
    --pairs data/pairs/heldout.jsonl --samples $SAMPLES --seed $s --out $R/winrate.json
  for m in merged dlm-dpo; do
    stage "stdlib $s likelihood $m" $R/$m.likelihood.json "$PYTHON" eval.py likelihood --ckpt $R/$m \
      --data data/stdlib --n_batches 4 --n_draws 4 --out $R/$m.likelihood.json
  done
done
"$PYTHON" -m scripts.report repro_dlm_dpo "$OUT" $SEEDS | tee "$OUT/table.md"
echo "scripts/repro_dlm_dpo.sh: done in $((SECONDS - T0)) s"
