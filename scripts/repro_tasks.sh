#!/usr/bin/env bash
# The exact-answer world's comparisons over several training seeds, after `bash run.sh` (it reuses out/tasks/{ar,dlm,
# block,ar-dpo,align}): REPR-ALIGN against λ = 0 and OPDLM against its off-policy ablation, each trained with seeds
# 1..N (run.sh's settings), scored on 200 held-out prompts per family at five thresholds, with paired tests; OPDLM's
# rollout settings (temperature 0; threshold 0.5, on- and off-policy) with EXTRA_SEEDS; and AR-MAP's merge at each γ
# of a grid, scored at threshold 0.9 (the share of answers with the full stop against the accuracy kept).
# Writes out/tasks/repro/results.md and curves.png (with matplotlib). About 40 minutes on 2 cores with N = 5.
#   PART=protocol: only OPDLM on against off under the protocol (docs/results.md, "The verdict protocol"): each
#   policy's rate from SWEEP_LRS at seed 1, judged by exact match on worlds/tasks.py's validation.jsonl at threshold 0.9 (the
#   highest; a tie: the lower rate; a choice at the sweep's edge goes on past it, three rates at most); then seeds SEEDS at the chosen rates, each final checkpoint on the 600 test
#   prompts at five thresholds; off-policy also for on-policy's time when its step is more than 5% cheaper. Writes
#   out/tasks/repro/protocol/protocol.md; about 10 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."  # the project root
source scripts/stage.sh  # stage NAME DONE_FILE COMMAND...; lr RATE; sweep GRID_VAR TRAIN CHOOSE
PYTHON=${PYTHON:-python3}
PART=${PART:-all}
SWEEP_LRS=${SWEEP_LRS:-"1e-2 3e-3 1e-3 3e-4"}
SEEDS=${SEEDS:-"1 2 3 4 5"}
EXTRA_SEEDS=${EXTRA_SEEDS:-"1 2"}  # the rollout-setting runs (a subset of SEEDS: they share its on- and off-policy runs)
THRESHOLDS=0.5,0.7,0.9,0.95,1
D=data/tasks O=out/tasks R=out/tasks/repro
for need in $O/align/results.json $O/ar-dpo/results.json $O/block/config.json; do
  [ -e $need ] || { echo "scripts/repro_tasks.sh: $need is missing; run 'bash run.sh' first" >&2; exit 1; }
done
TASKS=(--tasks $D/heldout.jsonl --tasks_n 50)
ALIGN=(--init $O/dlm --data $D --loss_after " =" --seq_len 16 --batch_size 64 --max_iters 200 --eval_interval 20
       --ckpt_interval 1000 --eval_batches 4 --samples 0 --weights_only "${TASKS[@]}")
DISTILL=(--init $O/block --teacher $O/ar --prompts $D/prompts.jsonl --seq_len 16 --rollout_min 8 --rollout_max 8
         --curriculum_steps 0 --train_eos --batch_size 32 --max_iters 200 --eval_interval 20 --weights_only "${TASKS[@]}")
run() {  # run OUT_DIR COMMAND...: skipped when OUT_DIR/results.json exists
  local out=$1; shift
  [ -e "$out/results.json" ] && { echo "== reusing $out"; return; }
  echo "== $out"; "$@" --out_dir "$out" > "$out.log" 2>&1 || { echo "failed: $* (see $out.log)" >&2; exit 1; }
}
mkdir -p $R
if [ "$PART" = protocol ]; then
  P=$R/protocol VAL=(--tasks $D/validation.jsonl --tasks_n 100 --eval_interval 100)  # evaluations: validation only
  mkdir -p $P/eval
  sweep_run() { run $P/$1-$2-s1 "$PYTHON" distill.py "${DISTILL[@]}" "${VAL[@]}" --policy $1 $(lr $2) --seed 1; }
  on_rates=$SWEEP_LRS off_rates=$SWEEP_LRS  # each goes on past a chosen edge
  sweep on_rates "sweep_run on" "$PYTHON -m scripts.report val_sweep --extend $P on"
  sweep off_rates "sweep_run off" "$PYTHON -m scripts.report val_sweep --extend $P off"
  ron=$("$PYTHON" -m scripts.report val_sweep $P on $on_rates)
  roff=$("$PYTHON" -m scripts.report val_sweep $P off $off_rates)
  k=$("$PYTHON" -m scripts.report time_steps $P/on-$ron-s1 $P/off-$roff-s1 200)  # off's steps in on's time
  for s in $SEEDS; do
    run $P/on-$ron-s$s "$PYTHON" distill.py "${DISTILL[@]}" "${VAL[@]}" $(lr $ron) --seed $s
    run $P/off-$roff-s$s "$PYTHON" distill.py "${DISTILL[@]}" "${VAL[@]}" --policy off $(lr $roff) --seed $s
    ms="on-$ron off-$roff"
    if [ "$k" != 200 ]; then
      run $P/offtime-$roff-s$s "$PYTHON" distill.py "${DISTILL[@]}" "${VAL[@]}" --policy off $(lr $roff) --seed $s \
        --max_iters $k
      ms="$ms offtime-$roff"
    fi
    for m in $ms; do
      [ -e $P/eval/$m-s$s.json ] || "$PYTHON" eval.py tasks --ckpt $P/$m-s$s --data $D --thresholds $THRESHOLDS \
        --out $P/eval/$m-s$s.json > /dev/null
    done
  done
  "$PYTHON" -m scripts.report opdlm_protocol $P $ron $roff $k "$on_rates $off_rates" $SEEDS | tee $P/protocol.md
  exit 0
fi
for s in $SEEDS; do
  run $R/align-s$s "$PYTHON" align.py "${ALIGN[@]}" --seed $s
  run $R/align0-s$s "$PYTHON" align.py "${ALIGN[@]}" --seed $s --lambda_align 0
  run $R/distill-s$s "$PYTHON" distill.py "${DISTILL[@]}" --seed $s
  run $R/distill-off-s$s "$PYTHON" distill.py "${DISTILL[@]}" --seed $s --policy off
  ms="align align0 distill distill-off"
  if [[ " $EXTRA_SEEDS " == *" $s "* ]]; then
    run $R/distill-T0-s$s "$PYTHON" distill.py "${DISTILL[@]}" --seed $s --temperature 0
    run $R/distill-t05-s$s "$PYTHON" distill.py "${DISTILL[@]}" --seed $s --threshold 0.5
    run $R/distill-off-t05-s$s "$PYTHON" distill.py "${DISTILL[@]}" --seed $s --threshold 0.5 --policy off
    ms="$ms distill-T0 distill-t05 distill-off-t05"
  fi
  for m in $ms; do
    [ -e $R/eval-$m-s$s.json ] || "$PYTHON" eval.py tasks --ckpt $R/$m-s$s --data $D --num_prompts 200 \
      --thresholds $THRESHOLDS --out $R/eval-$m-s$s.json > /dev/null
  done
done
# plain DPO (no NLL term), as published, beside run.sh's --sft_weight 1 (out/tasks/ar-dpo)
[ -e $R/ar-dpo-plain/results.json ] || "$PYTHON" dpo.py --ar $O/ar --pairs $D/pairs_train.jsonl \
  --heldout $D/pairs_heldout.jsonl --out_dir $R/ar-dpo-plain --max_iters 100 --lr 1e-3 --batch_size 16 \
  --eval_interval 50 --weights_only > $R/ar-dpo-plain.log 2>&1
for m in ar ar-dpo; do
  [ -e $R/eval-$m.json ] || "$PYTHON" eval.py tasks --ckpt $O/$m --data $D --num_prompts 200 --out $R/eval-$m.json > /dev/null
done
[ -e $R/eval-ar-dpo-plain.json ] || "$PYTHON" eval.py tasks --ckpt $R/ar-dpo-plain --data $D --num_prompts 200 \
  --out $R/eval-ar-dpo-plain.json > /dev/null
GAMMAS="0 0.25 0.5 0.75 1 1.5 2 4"
for g in $GAMMAS; do
  [ -e $R/merged-g$g/merge.json ] || "$PYTHON" merge.py merge --ar $O/ar --ar_aligned $O/ar-dpo --dlm $O/align \
    --pairs $D/pairs_train.jsonl --heldout $D/pairs_heldout.jsonl --out_dir $R/merged-g$g --gammas $g --n_masks 1 \
    --samples 0 > /dev/null 2>&1
  [ -e $R/eval-merged-g$g.json ] || "$PYTHON" eval.py tasks --ckpt $R/merged-g$g --data $D --num_prompts 200 \
    --thresholds 0.9 --out $R/eval-merged-g$g.json > /dev/null
done
# the γ search with independent masks (each model its own draws: no tie at γ = 0) over the same grid, and the
# spectrum of τ_diff against τ_pref (shadowing)
[ -e $R/merged-independent/merge.json ] || "$PYTHON" merge.py merge --ar $O/ar --ar_aligned $O/ar-dpo --dlm $O/align \
  --pairs $D/pairs_train.jsonl --heldout $D/pairs_heldout.jsonl --out_dir $R/merged-independent \
  --gammas "${GAMMAS// /,}" --masks independent --n_masks 2 --samples 0 > /dev/null 2>&1
[ -e $R/merged-shared/merge.json ] || "$PYTHON" merge.py merge --ar $O/ar --ar_aligned $O/ar-dpo --dlm $O/align \
  --pairs $D/pairs_train.jsonl --heldout $D/pairs_heldout.jsonl --out_dir $R/merged-shared \
  --gammas "${GAMMAS// /,}" --n_masks 2 --samples 0 > /dev/null 2>&1
[ -e $R/spectrum.json ] || "$PYTHON" merge.py spectrum --ar $O/ar --ar_aligned $O/ar-dpo --dlm $O/align \
  --out $R/spectrum.json > /dev/null

"$PYTHON" -m scripts.report repro_tasks "$SEEDS" "$GAMMAS" "$EXTRA_SEEDS" | tee $R/results.md
if "$PYTHON" -c "import matplotlib" 2>/dev/null; then
  s=${SEEDS%% *}
  "$PYTHON" -m lib.plot $R/align-s$s $R/align0-s$s $R/distill-s$s $R/distill-off-s$s --keys task_acc task_tpf \
    --out $R/curves.png
fi
