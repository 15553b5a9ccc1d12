#!/usr/bin/env bash
# AR-MAP against the DLM-only baseline, on run.sh's checkpoints, in both worlds and for each seed in SEEDS. Two
# routes to a preference-aligned DLM from the same pairs, the same steps and the same DPO settings:
#   AR-MAP    dpo.py on the AR teacher, then merge.py merge into the REPR-ALIGN DLM (γ chosen on training pairs)
#   DLM-only  dpo.py --dlm on the REPR-ALIGN DLM itself (DPO on its ELBO, one draw (t, M) shared per pair)
# Each route's wall-clock seconds are measured here, stage by stage, one process at a time. Prints markdown tables
# (also saved to $OUT/table.md).
#   bash run.sh && bash run.sh stdlib && bash scripts/repro_dlm_dpo.sh   # OUT=out/repro_dlm_dpo, SEEDS="1337 1338"
#   SMOKE=1 bash scripts/repro_dlm_dpo.sh                                 # a short check of the chain
set -euo pipefail
cd "$(dirname "$0")/.."  # the project root
PYTHON=${PYTHON:-python3}
SEEDS=${SEEDS:-1337 1338}
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
"$PYTHON" scripts/report.py repro_dlm_dpo "$OUT" $SEEDS | tee "$OUT/table.md"
echo "scripts/repro_dlm_dpo.sh: done in $((SECONDS - T0)) s"
