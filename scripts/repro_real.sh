#!/usr/bin/env bash
# The real world's verdicts under the protocol (docs/results.md, "The verdict protocol"), after `bash scripts/real_arms.sh`
# (its prompts, chat data, conversions and teacher are reused; each of its runs, seed 1337, stands for the sweep's
# point at the rate it ran at):
#   1. sweep, seed 1337 (out/real-sweep): each arm's peak learning rate from three, judged on the 38 validation prompts
#      (worlds/realworld.py --split validation: training prompts no chat data reaches) by the rule named in advance:
#      λ = 0, REPR-ALIGN (λ = 10), OPDLM on and off: the lowest −ELBO of the teacher's validation replies;
#      DPO on the teacher and DPO on the DLM: the highest full-stop share among the rates whose −ELBO stays within
#      0.5 bits per token of the model they start from (none: the lowest −ELBO). A choice at the sweep's edge
#      goes on past it (scripts/stage.sh's sweep: three rates more at most). DPO on the DLM starts from λ = 10 at
#      its chosen rate.
#   2. seeds SEEDS: scripts/real_arms.sh at the chosen rates in out/real-s<seed> (seed 1337 reuses the sweep's runs).
#   3. the paired tests over the seeds: scripts/report.py real_verdicts, out/real-seeds.md.
# About 120 minutes on 2 cores (the sweep ~60, each further seed ~45); finished stages are reused.
#   bash scripts/repro_real.sh                 # SEEDS="1337 1338"
#   ONLY=sweep bash scripts/repro_real.sh       # the sweep alone
#   ARMS="ar-dpo" ONLY=sweep bash scripts/repro_real.sh   # some arms' sweeps alone (of align0 align distill
#                                                         # distill-off ar-dpo dlm-dpo; dlm-dpo needs align's)
set -euo pipefail
cd "$(dirname "$0")/.."  # the project root
source scripts/python_env.sh
python_env requirements.txt scripts/repro_real.sh
SEEDS=${SEEDS:-"1337 1338"} ONLY=${ONLY:-all} ALL_ARMS="align0 align distill distill-off ar-dpo dlm-dpo"
ARMS=${ARMS:-$ALL_ARMS}
[ "$ARMS" = "$ALL_ARMS" ] || [ "$ONLY" = sweep ] || {
  echo "scripts/repro_real.sh: ARMS=\"$ARMS\" runs part of the sweep: add ONLY=sweep (the seeds need every arm's" \
       "rate)" >&2; exit 1; }
LRS=${LRS:-"1e-3 3e-4 1e-4"} DPO_LRS=${DPO_LRS:-"2e-4 2e-5 2e-6 2e-7"}  # DPO: 2e-7 is where the first sweep went on past 2e-6
D=data/real-arms O=out/real-arms S=out/real-sweep
[ -e $O/eval/ar.json ] || { echo "scripts/repro_real.sh: run 'bash scripts/real_arms.sh' first" >&2; exit 1; }
T0=$SECONDS
source scripts/stage.sh
PROMPTS=(--families sum,capital --per_family 20 --max_new_tokens 16)  # real_arms.sh's
VAL=("${PROMPTS[@]}" --split validation --thresholds 0.9 --cache dual --teacher $S/eval/ar.json)
LOOP=(--seq_len 96 --batch_size 8 --eval_interval 20 --eval_batches 2 --weights_only --seed 1337)
ALIGN=(--init $O/dlm --data $D/chat --assistant_only "${LOOP[@]}" --samples 0 --ckpt_interval 1000 --max_iters 50)
DISTILL=(--init $O/block --teacher $O/ar --data $D/chat "${LOOP[@]}" --rollout_min 16 --rollout_max 16
         --curriculum_steps 0 --max_iters 30)
DPO=(--pairs $D/pairs_train.jsonl --heldout $D/pairs_heldout.jsonl --seq_len 96 --batch_size 8 --max_iters 30
     --eval_interval 20 --weights_only --seed 1337)
peak() { "$PYTHON" -c 'import json, sys; print(max(json.loads(l).get("lr", 0) for l in open(sys.argv[1])))' "$1/log.jsonl"; }
same() { awk "BEGIN { exit !($1 > 0.999 * $2 && $1 < 1.001 * $2) }"; }
real_sweep() {  # real_sweep ARM START "RATES" SCRIPT FLAGS...: a run per rate, each scored on the validation prompts
  local arm=$1 start=$2; ARM_RATES=$3; shift 3  # (real_arms.sh's own, $O/ARM, stands for the rate it ran at unless
  in_arms $arm || { echo "== $arm: not in ARMS, skipped"; return; }
  SWEEP_CMD=("$@")                               # REUSE=no); a choice at the sweep's edge goes on past it
  sweep ARM_RATES "train_swept $arm" "chosen --extend $arm $start"
  echo "$ARM_RATES" > $S/$arm.rates
}
train_swept() { train_rate "$1" "$2" "${SWEEP_CMD[@]}"; }  # train_swept ARM RATE: the sweep's command at RATE
train_rate() {  # train_rate ARM RATE SCRIPT FLAGS...
  local arm=$1 r=$2; shift 2
  if [ "${REUSE:-yes}" = yes ] && [ ! -e $S/$arm-$r ] && [ -e $O/$arm/log.jsonl ] && same "$(peak $O/$arm)" $r; then
    ln -s "$PWD/$O/$arm" $S/$arm-$r
  fi
  stage "$arm $r" $S/$arm-$r/results.json "$PYTHON" "$@" $(lr $r) --out_dir $S/$arm-$r
  stage "validate $arm $r" $S/eval/$arm-$r.json "$PYTHON" -m worlds.realworld --ckpt $S/$arm-$r "${VAL[@]}" \
    --out $S/eval/$arm-$r.json
}
chosen() {  # chosen [--extend] ARM START ["RATES"]: the rate, printed (--extend: the rate past an edge, or nothing)
  local extend=(); [ "$1" = --extend ] && { extend=(--extend); shift; }
  "$PYTHON" -m scripts.report real_sweep "${extend[@]}" $S "$@"
}
rates() { cat $S/$1.rates; }
in_arms() { [[ " $ARMS " == *" $1 "* ]]; }

mkdir -p $S/eval
stage "validate ar" $S/eval/ar.json "$PYTHON" -m worlds.realworld --ckpt $O/ar "${PROMPTS[@]}" --split validation \
  --out $S/eval/ar.json
# the teacher's own replies under itself: the start for DPO's −ELBO rule
stage "validate ar (nelbo)" $S/eval/ar-self.json "$PYTHON" -m worlds.realworld --ckpt $O/ar "${VAL[@]}" --out $S/eval/ar-self.json
real_sweep align0 - "$LRS" align.py "${ALIGN[@]}" --lambda_align 0
real_sweep align - "$LRS" align.py "${ALIGN[@]}"
real_sweep distill - "$LRS" distill.py "${DISTILL[@]}"
real_sweep distill-off - "$LRS" distill.py "${DISTILL[@]}" --policy off
real_sweep ar-dpo ar-self "$DPO_LRS" dpo.py --ar $O/ar "${DPO[@]}"
if in_arms dlm-dpo; then
  LR_ALIGN=$(chosen align - "$(rates align)")
  stage "validate align $LR_ALIGN (as DPO's start)" $S/eval/dlm-dpo-start.json cp $S/eval/align-$LR_ALIGN.json \
    $S/eval/dlm-dpo-start.json
  same "$(peak $O/align)" "$LR_ALIGN" || REUSE=no  # real_arms.sh's dlm-dpo started from its own λ = 10 run
  real_sweep dlm-dpo dlm-dpo-start "$DPO_LRS" dpo.py --dlm --ar $S/align-$LR_ALIGN "${DPO[@]}"
fi
"$PYTHON" -m scripts.report real_sweep_table $S | tee $S/results.md
[ "$ONLY" = sweep ] && exit 0

RATES=(REAL_LR_SFT="$(chosen align0 - "$(rates align0)")" REAL_LR_ALIGN="$LR_ALIGN"
       REAL_LR_ON="$(chosen distill - "$(rates distill)")" REAL_LR_OFF="$(chosen distill-off - "$(rates distill-off)")"
       REAL_LR_DPO="$(chosen ar-dpo ar-self "$(rates ar-dpo)")"
       REAL_LR_DLM_DPO="$(chosen dlm-dpo dlm-dpo-start "$(rates dlm-dpo)")")
echo "chosen: ${RATES[*]}"
for seed in $SEEDS; do
  R=out/real-s$seed
  mkdir -p $R/eval
  for m in ar dlm block; do [ -e $R/$m ] || ln -s "$PWD/$O/$m" $R/$m; done
  cp -n $O/eval/ar.json $R/eval/ar.json  # the teacher's held-out replies, greedy: the same in every seed
  if [ "$seed" = 1337 ]; then  # the sweep's runs at the chosen rates are this seed's
    for pair in "${RATES[@]}"; do
      var=${pair%%=*} rate=${pair#*=}
      arm=$(case $var in REAL_LR_SFT) echo align0;; REAL_LR_ALIGN) echo align;; REAL_LR_ON) echo distill;;
                         REAL_LR_OFF) echo distill-off;; REAL_LR_DPO) echo ar-dpo;; REAL_LR_DLM_DPO) echo dlm-dpo;; esac)
      [ -e $R/$arm ] || ln -s "$PWD/$S/$arm-$rate" $R/$arm
    done
  fi
  env "${RATES[@]}" REAL_SEED=$seed REAL_AR=$O/ar REAL_OUT=$R bash scripts/real_arms.sh
done
"$PYTHON" -m scripts.report real_verdicts $(for s in $SEEDS; do echo out/real-s$s; done) | tee out/real-seeds.md
echo "scripts/repro_real.sh: done in $((SECONDS - T0)) s; out/real-sweep/results.md, out/real-seeds.md"
