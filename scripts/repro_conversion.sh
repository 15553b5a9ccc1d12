#!/usr/bin/env bash
# The conversion's curves on SmolLM2-135M-Instruct (docs/results.md, "Converting SmolLM2"), one arm per call (a part
# of at most about 100 minutes on 2 cores), after `bash run.sh real` (its import, data and conversions are reused):
# the arm trained for STEPS steps with the weights kept at SNAPS (align.py --snapshots: about 5, 10, 20, 40 and 60
# minutes of training at the step time measured on a 2-core VM), then each snapshot scored on run.sh real's 300
# held-out prompts at threshold 0.9 (accuracy on sums and capitals, F1 with the teacher, −ELBO of its replies, answer
# tokens per forward), the last one also at thresholds 0.5-1 (the frontier), then the arm's curve table.
#   ARM=block0 bash scripts/repro_conversion.sh     # λ = 0 on the block conversion (blocks of 4, shifted)
#   ARM=masked0 bash scripts/repro_conversion.sh    # λ = 0 on the bidirectional conversion
#   ARM=align bash scripts/repro_conversion.sh      # REPR-ALIGN, λ = 10, on the bidirectional conversion
#   ARM=opdlm bash scripts/repro_conversion.sh      # OPDLM on the block conversion, on-policy (opdlm_off: off-policy),
#                                                   # rolled out on the training prompts (prompts.jsonl), N = 32
# LR (default 1e-4), SEED (1337), STEPS and SNAPS (the arm's defaults below) set a run; out/conversion/ARM-LR-sSEED
# (NAME: another name there). MINUTES=M: train for M minutes of wall time instead (align.py --time_budget; STEPS caps
# it, SNAPS as given, default none), the budget's last step the curve's last point. COMPILE=0: the align.py arms
# eager (with MINUTES, ARM=block0 COMPILE=0 is run.sh real's λ = 0 student at another SEED). END_PAD=N (the align.py
# arms): each answer followed by end tokens up to N, trained (align.py --end_pad; the held-out canvas is 32).
# FRONTIER: the last snapshot's thresholds (default 0.5-1). AUTOCAST (default fast: bf16 where the CPU has bf16
# instructions, else fp32): none keeps fp32 everywhere, to repeat a run made on a CPU without them.
# TRAIN_ONLY=1: the training alone, no snapshots, no held-out scores (a rate sweep: scripts/sweep_conversion.sh,
# which scores each run by its validation −ELBO instead).
set -euo pipefail
cd "$(dirname "$0")/.."  # the project root
source scripts/python_env.sh
python_env requirements.txt scripts/repro_conversion.sh
D=data/real O=out/real
[ -e $O/eval/ar.json ] && [ -e $O/block/config.json ] || { echo "scripts/repro_conversion.sh: run 'bash run.sh real' first" >&2; exit 1; }
ARM=${ARM:?set ARM=block0, masked0 or align} LR=${LR:-1e-4} SEED=${SEED:-1337}
[ -e $O/dlm/config.json ] || "$PYTHON" convert.py --ar $O/ar --out_dir $O/dlm --attn bidirectional
case $ARM in  # 60 minutes at the seconds a step measured on a 2-core VM (block 5.0, masked 2.1, REPR-ALIGN 2.8; the
  # last two from benchmarks/bench.py --what pack; OPDLM about 5), the snapshots at about 5, 10, 20 and 40 minutes
  block0)  SCRIPT=align.py INIT=$O/block FLAGS=(--lambda_align 0) DEF_STEPS=720 DEF_SNAPS=60,120,240,480 ;;
  masked0) SCRIPT=align.py INIT=$O/dlm FLAGS=(--lambda_align 0) DEF_STEPS=1700 DEF_SNAPS=140,285,570,1140 ;;
  align)   SCRIPT=align.py INIT=$O/dlm FLAGS=(--lambda_align 10) DEF_STEPS=1280 DEF_SNAPS=105,215,430,860 ;;
  opdlm|opdlm_off) SCRIPT=distill.py INIT=$O/block DEF_STEPS=720 DEF_SNAPS=60,120,240,480
    FLAGS=(--teacher $O/ar --prompts $D/prompts.jsonl --policy $([ $ARM = opdlm ] && echo on || echo off)) ;;
  *) echo "scripts/repro_conversion.sh: ARM=$ARM: choose block0, masked0, align, opdlm or opdlm_off" >&2; exit 2 ;;
esac
STEPS=${STEPS:-$DEF_STEPS} SNAPS=${SNAPS-$([ -n "${MINUTES:-}" ] || echo $DEF_SNAPS)}
R=out/conversion/${NAME:-$ARM-$LR-s$SEED}
SNAPSHOTS=(--snapshots ${SNAPS:+$SNAPS,}$STEPS) BUDGET=(${MINUTES:+--time_budget $MINUTES})
[ "${TRAIN_ONLY:-0}" = 1 ] && SNAPSHOTS=()  # the last step's weights only (the run's own checkpoint)
mkdir -p $R
T0=$SECONDS
source scripts/stage.sh
if [ $SCRIPT = distill.py ]; then  # rollouts of the answer's length on the training prompts (written by the data stage)
  [ -e $D/prompts.jsonl ] || "$PYTHON" -m worlds.conversion --ckpt $O/ar --out_dir $D --chats 5000 \
    --per_family 100 --max_new_tokens 32 --seed 1337  # run.sh real's: its cache answers, nothing is generated
  FLAGS+=(--batch_size 8 --rollout_min 32 --rollout_max 32 --curriculum_steps 0)
else  # packed rows of whole conversations
  FLAGS+=(--assistant_only --batch_size 3 --samples 0 --end_pad ${END_PAD:-0})
  [ "${COMPILE:-1}" = 0 ] || FLAGS+=(--compile)
fi
stage "train $ARM" $R/results.json "$PYTHON" $SCRIPT --init $INIT --data $D/chat "${FLAGS[@]}" --seq_len 256 \
  --max_iters $STEPS $(lr $LR) --warmup 20 --autocast ${AUTOCAST:-fast} --eval_interval $STEPS --eval_batches 2 \
  --weights_only --seed $SEED "${SNAPSHOTS[@]}" "${BUDGET[@]}" --out_dir $R
[ "${TRAIN_ONLY:-0}" = 1 ] && { echo "scripts/repro_conversion.sh: trained $R"; exit 0; }
EVAL=(--prompts $D/heldout.jsonl --max_new_tokens 32 --teacher $O/eval/ar.json)
SNAPPED=$(ls -d $R/step-* | sed 's/.*step-//' | sort -n)  # SNAPS and STEPS, or the budget's last step
LAST=$(echo "$SNAPPED" | tail -1)
for s in $SNAPPED; do
  thr=$([ "$s" = "$LAST" ] && echo ${FRONTIER:-0.5,0.7,0.9,0.95,1} || echo 0.9)
  stage "eval $ARM step $s" $R/eval/step-$s.json "$PYTHON" -m worlds.realworld --ckpt $R/step-$s "${EVAL[@]}" \
    --thresholds $thr --out $R/eval/step-$s.json
done
"$PYTHON" -m scripts.report conversion_curve $R | tee $R/curve.md
echo "scripts/repro_conversion.sh: done in $((SECONDS - T0)) s; $R/curve.md"
