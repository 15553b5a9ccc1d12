#!/usr/bin/env bash
# diffu-GRPO against the two preference routes on the same judge (tasks.check) and the same start, the task world's
# REPR-ALIGN DLM (out/tasks/align), at equal wall time on this machine:
#   rl       rl.py: rollouts of the DLM itself, rewarded by the checker
#   dlm-dpo  scripts/judged_pairs.py on the DLM's samples (right over wrong), then dpo.py --dlm on those pairs
#   ar-map   judged_pairs.py on the AR teacher's samples, dpo.py on the teacher, merge.py merge into the DLM
# Every arm gets BUDGET seconds, its pairs and merge included: steps = (BUDGET − those seconds) / its mean step time,
# from a short calibration run of each trainer. Training prompts: data/tasks/prompts.jsonl; validation: worlds/tasks.py's
# validation.jsonl (the test's mix of lengths, none a prompt an arm trains on, none a test prompt).
#   1. sweep, seed 1337: learning rates per arm; the rule named in advance: the highest validation exact match at
#      threshold 0.9 (a tie: the lower rate); a sweep whose choice is its edge goes on past it (stats.beyond_edge), up
#      to three rates more. A DPO arm (which revisits a few hundred fixed pairs for dozens of epochs) keeps its weights
#      at each quarter of its steps and its steps are chosen on validation too (early stopping: the highest, a tie going
#      to fewer steps; AR-MAP merges each quarter); RL (fresh rollouts every batch) runs all of its steps.
#   2. seeds 1338-1341 at the chosen rates (1337: the sweep's run), each DPO run stopped early on validation.
#   3. every model on the 600 held-out prompts at thresholds 0.9 and 1.0; scripts/report.py repro_rl: a paired t over
#      the seeds' means (primary), McNemar over (seed, prompt) pairs beside it, Holm across the row's five tests, and
#      RL's reward curve. $OUT/table.md.
# About 80 minutes on 2 cores at BUDGET=120 (the sweep alone 34 on an AVX2 VM); finished stages are reused.
#   bash run.sh && bash scripts/repro_rl.sh        # OUT=out/repro_rl BUDGET=120 SEEDS="1337 1338 1339 1340 1341"
#   SMOKE=1 bash scripts/repro_rl.sh                # the chain at a toy size (out/repro_rl_smoke)
set -euo pipefail
cd "$(dirname "$0")/.."  # the project root
source scripts/python_env.sh
python_env requirements.txt scripts/repro_rl.sh
if [ "${SMOKE:-0}" = 1 ]; then
  OUT=${OUT:-out/repro_rl_smoke} BUDGET=${BUDGET:-6} CAL=4 NUM=(--num_prompts 8) GROUP=4 HELD=2 FIRST=(--num_prompts 64)
else
  OUT=${OUT:-out/repro_rl} BUDGET=${BUDGET:-120} CAL=16 NUM=() GROUP=8 HELD=32 FIRST=()
fi
SEEDS=${SEEDS:-"1337 1338 1339 1340 1341"}
RL_LRS=${RL_LRS:-"3e-4 1e-4 3e-5"} DPO_LRS=${DPO_LRS:-"1e-3 3e-4 1e-4"} AR_LRS=${AR_LRS:-"3e-4 1e-4 3e-5"}
D=data/tasks O=out/tasks START=out/tasks/align AR=out/tasks/ar
P=$D/prompts.jsonl VAL=$D/validation.jsonl
for f in $START/config.json $AR/config.json $P $VAL; do
  [ -e $f ] || { echo "scripts/repro_rl.sh: no $f: run 'bash run.sh' first" >&2; exit 1; }
done
mkdir -p $OUT/eval
T0=$SECONDS STAGE_LOG=$OUT/seconds.tsv
source scripts/stage.sh  # stage NAME DONE_FILE COMMAND...
seconds() { awk -F'\t' -v n="$1" '$1 == n { s = $2 } END { print s + 0 }' $STAGE_LOG; }  # a stage's last seconds
steps() {  # steps BUDGET USED RUN: the steps of RUN's trainer that fill BUDGET − USED seconds (at least 2)
  "$PYTHON" -c 'import json, sys; b, u = map(float, sys.argv[1:3]); s = json.load(open(sys.argv[3] + "/results.json"))
print(max(2, int((b - u) / s["step_seconds"])))' "$@"
}
# the pairs, per seed: samples of the DLM (dlm-dpo) and of the teacher (ar-map), 8 per prompt, judged by tasks.check
PAIRS=(--prompts $P --group $GROUP --threshold 0.9 --max_new_tokens 6 --heldout $HELD "${FIRST[@]}")
for s in $SEEDS; do
  stage "pairs dlm $s" $OUT/$s/pairs-dlm.jsonl "$PYTHON" -m scripts.judged_pairs --ckpt $START "${PAIRS[@]}" \
    --seed $s --out $OUT/$s/pairs-dlm.jsonl
  stage "pairs ar $s" $OUT/$s/pairs-ar.jsonl "$PYTHON" -m scripts.judged_pairs --ckpt $AR "${PAIRS[@]}" --seed $s \
    --out $OUT/$s/pairs-ar.jsonl
done
pairs() { echo --pairs $OUT/$1/pairs-$2.jsonl --heldout $OUT/$1/pairs-$2.heldout.jsonl; }
RL=(--init $START --prompts $P --max_new_tokens 6 --group $GROUP --weights_only)
DPO=(--batch_size 16 --sft_weight 1 --weights_only)  # run.sh's DPO settings in the task world
MERGE=(--ar $AR --dlm $START --gammas 0,0.25,0.5,0.75,1 --n_masks 2 --samples 0)

# calibration: each trainer's mean step time (and the merge's seconds) from a short run
C=$OUT/calib
stage "calib rl" $C/rl/results.json "$PYTHON" rl.py "${RL[@]}" --max_iters $CAL --eval_interval $CAL --out_dir $C/rl
stage "calib dlm-dpo" $C/dlm-dpo/results.json "$PYTHON" dpo.py --dlm --ar $START $(pairs 1337 dlm) "${DPO[@]}" \
  --max_iters $CAL --eval_interval $CAL --out_dir $C/dlm-dpo
stage "calib ar-dpo" $C/ar-dpo/results.json "$PYTHON" dpo.py --ar $AR $(pairs 1337 ar) "${DPO[@]}" --max_iters $CAL \
  --eval_interval $CAL --out_dir $C/ar-dpo
stage "calib merge" $C/merged/merge.json "$PYTHON" merge.py merge "${MERGE[@]}" --ar_aligned $C/ar-dpo \
  $(pairs 1337 ar) --out_dir $C/merged
MERGE_S=$(seconds "calib merge")

quarters() {  # quarters K: the steps at a quarter, a half and three quarters of K (distinct, between 0 and K)
  "$PYTHON" -c 'import sys; k = int(sys.argv[1]); print(",".join(map(str, sorted({k * j // 4 for j in (1, 2, 3)} - {0, k}))))' $1
}
snapshots() { local q; q=$(quarters $1); [ -z "$q" ] || echo --snapshots $q; }
train() {  # train ARM SEED RATE: one arm's run in $OUT/SEED/ARM-RATE, at the budget's steps; then each of its kept
  # weights on the validation prompts (eval/ARM-SEED-RATE-STEPS.val.json: early stopping's scores)
  local arm=$1 s=$2 r=$3 R=$OUT/$2/$1-$3 k q
  case $arm in
    rl) k=$(steps $BUDGET 0 $C/rl); k=$(( k < 8 ? 4 : k / 4 * 4 ))  # whole batches of rollouts (μ = 4)
        stage "rl $s $r" $R/results.json "$PYTHON" rl.py "${RL[@]}" $(lr $r) --max_iters $k --eval_interval $k \
          --seed $s --out_dir $R ;;
    dlm-dpo) k=$(steps $BUDGET "$(seconds "pairs dlm $s")" $C/dlm-dpo)
        stage "dlm-dpo $s $r" $R/results.json "$PYTHON" dpo.py --dlm --ar $START $(pairs $s dlm) "${DPO[@]}" \
          $(lr $r) --max_iters $k --eval_interval $k $(snapshots $k) --seed $s --out_dir $R ;;
    ar-map) k=$(steps $BUDGET "$(( $(seconds "pairs ar $s") + MERGE_S ))" $C/ar-dpo)
        stage "ar-dpo $s $r" $R/ar-dpo/results.json "$PYTHON" dpo.py --ar $AR $(pairs $s ar) "${DPO[@]}" $(lr $r) \
          --max_iters $k --eval_interval $k $(snapshots $k) --seed $s --out_dir $R/ar-dpo
        stage "merge $s $r" $R/merge.json "$PYTHON" merge.py merge "${MERGE[@]}" --ar_aligned $R/ar-dpo \
          $(pairs $s ar) --seed $s --out_dir $R
        for q in $(quarters $k | tr , ' '); do  # early stopping's candidates (their merges not counted as training)
          stage "merge $s $r @$q" $R/step-$q/merge.json "$PYTHON" merge.py merge "${MERGE[@]}" \
            --ar_aligned $R/ar-dpo/step-$q $(pairs $s ar) --seed $s --out_dir $R/step-$q
        done ;;
  esac
  evaluate $arm-$s-$r-$k $R val 0.9
  if [ $arm != rl ]; then
    for q in $(quarters $k | tr , ' '); do evaluate $arm-$s-$r-$q $R/step-$q val 0.9; done
  fi
}
picked() {  # picked ARM SEED RATE: the run's weights early stopping chose (RL: its last)
  local R=$OUT/$2/$1-$3 k; k=$("$PYTHON" -m scripts.report rl_pick $OUT "$@")
  [ -e $R/step-$k/config.json ] && echo $R/step-$k || echo $R
}
rates() { case $1 in rl) echo "$RL_LRS" ;; dlm-dpo) echo "$DPO_LRS" ;; ar-map) echo "$AR_LRS" ;; esac; }
evaluate() {  # evaluate NAME CKPT SPLIT THRESHOLDS
  stage "eval $1 $3" $OUT/eval/$1.$3.json "$PYTHON" eval.py tasks --ckpt $2 --data $([ $3 = val ] && echo $VAL || echo $D) \
    --thresholds $4 "${NUM[@]}" --out $OUT/eval/$1.$3.json
}

# 1. the sweep at seed 1337, judged on the validation split; an edge's choice extends the sweep (three rates at most)
evaluate start $START val 0.9
declare -A SWEPT
for arm in rl dlm-dpo ar-map; do
  grid=$(rates $arm)
  sweep grid "train $arm 1337" "$PYTHON -m scripts.report rl_sweep --extend $OUT $arm"
  SWEPT[$arm]=$grid
done
# 2. the other seeds at the chosen rates; 3. every model on the held-out prompts
evaluate start $START test 0.9,1
for arm in rl dlm-dpo ar-map; do
  r=$("$PYTHON" -m scripts.report rl_sweep $OUT $arm ${SWEPT[$arm]})
  for s in $SEEDS; do
    train $arm $s $r
    evaluate $arm-$s $(picked $arm $s $r) test 0.9,1
  done
done
"$PYTHON" -m scripts.report repro_rl $OUT $SEEDS | tee $OUT/table.md
echo "scripts/repro_rl.sh: done in $((SECONDS - T0)) s; the tables are in $OUT/table.md"
