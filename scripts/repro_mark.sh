#!/usr/bin/env bash
# AR-MAP with a preference the teacher already produces: a teacher trained on the exact-answer world with a share
# MARK_SHARE of its answers ending in the full stop (worlds/tasks.py --mark_share), so the preferred form is one it has
# written, in slots its training reached. Then as run.sh: the REPR-ALIGN DLM, DPO on the teacher toward the full
# stop, and the merge at every γ of GAMMAS (each merged DLM evaluated: how often it ends an answer with the full
# stop, and exact match), with DPO on the DLM itself (dpo.py --dlm) beside it. Finished stages are reused.
#   bash scripts/repro_mark.sh            # OUT=out/repro_mark, MARK_SHARE=0.2, GAMMAS="0 0.25 0.5 1 2 4"
#   SMOKE=1 bash scripts/repro_mark.sh    # a short check of the chain
#   PART=protocol bash scripts/repro_mark.sh   # instead of the γ grid, AR-MAP against DPO on the DLM under the
#     protocol (docs/results.md, "The verdict protocol"): each route's DPO rate from SWEEP_LRS at seed 1, judged by
#     the share of validation.jsonl's prompts answered right and with the full stop at threshold 0.9 (AR-MAP: the
#     merged DLM, γ by merge.py's rule over 0, 0.25, 0.5, 1); then seeds SEEDS at the chosen rates on the test
#     prompts, DPO on the DLM also for AR-MAP's seconds when it is the cheaper route. Writes $OUT/protocol/protocol.md
set -euo pipefail
cd "$(dirname "$0")/.."  # the project root
PYTHON=${PYTHON:-python3}
MARK_SHARE=${MARK_SHARE:-0.2}
PART=${PART:-all}
SWEEP_LRS=${SWEEP_LRS:-"3e-3 1e-3 3e-4 1e-4"}
SEEDS=${SEEDS:-"1 2 3 4 5"}
if [ "${SMOKE:-0}" = 1 ]; then
  OUT=${OUT:-out/repro_mark_smoke}; GAMMAS=${GAMMAS:-0 1}; TASKS=(--n_train 2000 --n_heldout 10)
  PRE=(--max_iters 20 --eval_interval 10); STEPS=(--max_iters 4 --eval_interval 2); NP=5
else
  OUT=${OUT:-out/repro_mark}; GAMMAS=${GAMMAS:-0 0.25 0.5 1 2 4}; TASKS=()
  PRE=(--max_iters 1200 --eval_interval 300); STEPS=(); NP=100
fi
D=$OUT/data
T0=$SECONDS
source scripts/stage.sh  # stage NAME DONE_FILE COMMAND...
stage tasks    $D/heldout.jsonl       "$PYTHON" -m worlds.tasks --out_dir $D --mark_share $MARK_SHARE "${TASKS[@]}"
stage corpus   $D/meta.json           "$PYTHON" -m lib.corpus --source $D/train.jsonl --out_dir $D
stage pretrain $OUT/ar/results.json   "$PYTHON" pretrain.py --data $D --out_dir $OUT/ar --loss_after " =" --seq_len 16 \
                                        --batch_size 64 "${PRE[@]}"
stage convert  $OUT/dlm/config.json   "$PYTHON" convert.py --ar $OUT/ar --out_dir $OUT/dlm --attn bidirectional
# run.sh's REPR-ALIGN and DPO settings
stage align    $OUT/align/results.json "$PYTHON" align.py --init $OUT/dlm --data $D --loss_after " =" --seq_len 16 \
                 --batch_size 64 --max_iters 200 --eval_interval 100 --ckpt_interval 200 --eval_batches 4 --samples 0 \
                 "${STEPS[@]}" --out_dir $OUT/align
DPO=(--pairs $D/pairs_train.jsonl --heldout $D/pairs_heldout.jsonl --max_iters 100 --lr 1e-3 --batch_size 16
     --eval_interval 50 --sft_weight 1 "${STEPS[@]}")
if [ "$PART" = protocol ]; then
  P=$OUT/protocol STAGE_LOG=$OUT/protocol/seconds.tsv  # each stage's seconds: the routes' costs
  mkdir -p $P/eval
  routes() {  # routes RATE_AR RATE_DLM SEED: AR-MAP (DPO on the teacher, merged) and DPO on the DLM, at the rates
    stage "ar-dpo $1 $3" $P/ar-dpo-$1-s$3/results.json "$PYTHON" dpo.py --ar $OUT/ar "${DPO[@]}" $(lr $1) --seed $3 \
      --out_dir $P/ar-dpo-$1-s$3
    stage "merge $1 $3" $P/ar-map-$1-s$3/merge.json "$PYTHON" merge.py merge --ar $OUT/ar --ar_aligned \
      $P/ar-dpo-$1-s$3 --dlm $OUT/align --pairs $D/pairs_train.jsonl --heldout $D/pairs_heldout.jsonl \
      --gammas 0,0.25,0.5,1 --n_masks 2 --samples 0 --seed $3 --out_dir $P/ar-map-$1-s$3
    stage "dlm-dpo $2 $3" $P/dlm-dpo-$2-s$3/results.json "$PYTHON" dpo.py --dlm --ar $OUT/align "${DPO[@]}" \
      $(lr $2) --seed $3 --out_dir $P/dlm-dpo-$2-s$3
  }
  score() {  # score RUN DATA OUT: eval.py tasks at threshold 0.9
    stage "eval $3" $P/eval/$3.json "$PYTHON" eval.py tasks --ckpt $1 --data $2 --thresholds 0.9 --out $P/eval/$3.json
  }
  sweep_run() {  # both routes at one rate, and their validation scores
    routes $1 $1 1
    score $P/ar-map-$1-s1 $D/validation.jsonl val-ar-map-$1
    score $P/dlm-dpo-$1-s1 $D/validation.jsonl val-dlm-dpo-$1
  }
  rates=$SWEEP_LRS  # goes on past a route's chosen edge
  sweep rates sweep_run "$PYTHON -m scripts.report mark_sweep --extend $P"
  ra=$("$PYTHON" -m scripts.report mark_sweep $P ar-map $rates)
  rd=$("$PYTHON" -m scripts.report mark_sweep $P dlm-dpo $rates)
  k=$("$PYTHON" -m scripts.report dlm_dpo_steps $P $ra $rd 100 1)  # DLM-only's steps in AR-MAP's seconds (seed 1)
  score $OUT/align $D align-s0
  for s in $SEEDS; do
    routes $ra $rd $s
    score $P/ar-map-$ra-s$s $D ar-map-$ra-s$s
    score $P/dlm-dpo-$rd-s$s $D dlm-dpo-$rd-s$s
    if [ "$k" != 100 ]; then
      stage "dlm-dpo-time $rd $s" $P/dlm-dpo-time-$rd-s$s/results.json "$PYTHON" dpo.py --dlm --ar $OUT/align \
        "${DPO[@]}" $(lr $rd) --max_iters $k --seed $s --out_dir $P/dlm-dpo-time-$rd-s$s
      score $P/dlm-dpo-time-$rd-s$s $D dlm-dpo-time-$rd-s$s
    fi
  done
  "$PYTHON" -m scripts.report mark_protocol $P $ra $rd $k "$rates" $SEEDS | tee $P/protocol.md
  echo "scripts/repro_mark.sh: done in $((SECONDS - T0)) s"
  exit 0
fi
stage dpo      $OUT/ar-dpo/results.json "$PYTHON" dpo.py --ar $OUT/ar "${DPO[@]}" --out_dir $OUT/ar-dpo
stage dlm-dpo  $OUT/dlm-dpo/results.json "$PYTHON" dpo.py --dlm --ar $OUT/align "${DPO[@]}" --out_dir $OUT/dlm-dpo
for g in $GAMMAS; do  # one merge per γ: its DLM saved and evaluated
  stage "merge γ=$g" $OUT/merged-$g/merge.json "$PYTHON" merge.py merge --ar $OUT/ar --ar_aligned $OUT/ar-dpo \
    --dlm $OUT/align --pairs $D/pairs_train.jsonl --heldout $D/pairs_heldout.jsonl --out_dir $OUT/merged-$g \
    --gammas $g --n_masks 2 --samples 0
done
MODELS="ar ar-dpo align dlm-dpo $(for g in $GAMMAS; do printf 'merged-%s ' $g; done)"
for m in $MODELS; do
  stage "eval $m" $OUT/eval/$m.json "$PYTHON" eval.py tasks --ckpt $OUT/$m --data $D --num_prompts $NP \
    --thresholds 0.9 --out $OUT/eval/$m.json
done
"$PYTHON" -m scripts.report repro_mark "$OUT" $MODELS | tee "$OUT/table.md"
echo "scripts/repro_mark.sh: done in $((SECONDS - T0)) s"
