#!/usr/bin/env bash
# REPR-ALIGN in the exact-answer world, after `bash run.sh` (it reuses out/tasks/dlm and its teacher): which part of the
# alignment does the work, and cosine against L2. Each run is run.sh's align.py settings for 80 steps (the cosine
# schedule over 80), exact match on 50 held-out prompts per family at thresholds 0.9 and 1.0 every 20 steps.
#   parts, seeds SEEDS: λ = 0; λ = 10 on every hidden state; λ = 10 without the final norm's output (hidden states
#     0 .. n-2); λ = 10 on the final norm's output alone; λ = 0 and λ = 10 at lr 3e-4 (run.sh: 1e-3)
#   metric, seeds L2_SEEDS: L2 at λ in {0.3, 1, 3, 10} against cosine at λ in {1, 10} (and λ = 0)
#   protocol (docs/results.md, "The verdict protocol"): each arm's rate from SWEEP_LRS at seed 1, judged by exact
#     match on worlds/tasks.py's validation.jsonl at threshold 0.9 (the highest; a tie: the lower rate; a choice at the
#     sweep's edge goes on past it, three rates at most); then seeds SEEDS at
#     the chosen rates: λ = 0 and λ = 10 for 80 steps, and λ = 0 for as many steps as λ = 10's 80 take (their
#     median step times in the sweep); each final checkpoint on the 600 test prompts (eval.py tasks, 0.9 and 1.0);
#     and cosine against L2: L2's λ and rate from L2_LAMBDAS × SWEEP_LRS by the same rule (λ = 0 is λ = 0's own
#     runs, the bound of the grid: with it in the grid only the top λ goes on), seeds SEEDS, against the cosine
#     λ = 10 above
# Writes out/tasks/repro-align/results.md. About 30 minutes on 2 cores with the defaults (PART=protocol: about 10,
# PART=parts: the rest).
set -euo pipefail
cd "$(dirname "$0")/.."  # the project root
source scripts/stage.sh  # stage NAME DONE_FILE COMMAND...; lr RATE; sweep, sweep2: sweeps past an edge
source scripts/python_env.sh
python_env requirements.txt scripts/repro_align_tasks.sh
PART=${PART:-all}
SWEEP_LRS=${SWEEP_LRS:-"1e-2 3e-3 1e-3 3e-4"}
L2_LAMBDAS=${L2_LAMBDAS:-"0 0.01 0.03 0.1 0.3 1 3 10"}  # 0: λ = 0's own runs, the grid's bound (0.01-0.1: where the
                                                       # sweep from 0.3 went on before 0 joined it)
SEEDS=${SEEDS:-"1 2 3 4 5"}
L2_SEEDS=${L2_SEEDS:-"1 2"}
D=data/tasks O=out/tasks R=out/tasks/repro-align
[ -e $O/align/results.json ] || { echo "scripts/repro_align_tasks.sh: run 'bash run.sh' first" >&2; exit 1; }
n=$("$PYTHON" -c "import json; print(json.load(open('$O/dlm/config.json'))['num_hidden_layers'] + 1)")  # hidden states
below=$(seq -s, 0 $((n - 2)))  # every hidden state but the last, the final norm's output
ALIGN=(--init $O/dlm --data $D --loss_after " =" --seq_len 16 --batch_size 64 --max_iters 80 --eval_interval 20
       --ckpt_interval 1000 --eval_batches 4 --samples 0 --weights_only --tasks $D/heldout.jsonl --tasks_n 50
       --tasks_also 1)
run() {  # run NAME SEED FLAGS...: skipped when its results.json exists
  local out=$R/$1-s$2 seed=$2; shift 2
  [ -e "$out/results.json" ] && { echo "== reusing $out"; return; }
  echo "== $out"
  "$PYTHON" align.py "${ALIGN[@]}" --seed $seed "$@" --out_dir "$out" > "$out.log" 2>&1 \
    || { echo "failed: align.py $* (see $out.log)" >&2; exit 1; }
}
mkdir -p $R
if [ "$PART" != protocol ]; then
for s in $SEEDS; do
  run lam0 $s --lambda_align 0
  run lam10 $s --lambda_align 10
  run lam10-below-final $s --lambda_align 10 --align_layers "$below"
  run lam10-final $s --lambda_align 10 --align_layers -1
  run lam0-lr3e-4 $s --lambda_align 0 --lr 3e-4
  run lam10-lr3e-4 $s --lambda_align 10 --lr 3e-4
done
for s in $L2_SEEDS; do
  run cos1 $s --lambda_align 1
  for l in 0.3 1 3 10; do run l2-$l $s --lambda_align $l --align_metric l2; done
done
"$PYTHON" -m scripts.report repro_align_tasks $R "$SEEDS" "$L2_SEEDS" | tee $R/results.md
fi
[ "$PART" = parts ] && exit 0
VAL=(--tasks $D/validation.jsonl --tasks_n 100)  # every evaluation during training on the validation split
[ -e $D/validation.jsonl ] || { echo "scripts/repro_align_tasks.sh: no $D/validation.jsonl: run 'bash run.sh'" >&2; exit 1; }
sweep_run() { run p-lam$1-$2 1 --lambda_align $1 $(lr $2) "${VAL[@]}"; }
rates0=$SWEEP_LRS rates10=$SWEEP_LRS  # each goes on past a chosen edge
sweep rates0 "sweep_run 0" "$PYTHON -m scripts.report val_sweep --extend $R p-lam0"
sweep rates10 "sweep_run 10" "$PYTHON -m scripts.report val_sweep --extend $R p-lam10"
r0=$("$PYTHON" -m scripts.report val_sweep $R p-lam0 $rates0)
r10=$("$PYTHON" -m scripts.report val_sweep $R p-lam10 $rates10)
k=$("$PYTHON" -m scripts.report time_steps $R/p-lam10-$r10-s1 $R/p-lam0-$r0-s1 80)  # λ = 0's steps in λ = 10's time
mkdir -p $R/eval
for s in $SEEDS; do
  run p-lam0-$r0 $s --lambda_align 0 $(lr $r0) "${VAL[@]}"
  run p-lam10-$r10 $s --lambda_align 10 $(lr $r10) "${VAL[@]}"
  run p-lam0time-$r0 $s --lambda_align 0 $(lr $r0) "${VAL[@]}" --max_iters $k
  for m in p-lam0-$r0 p-lam10-$r10 p-lam0time-$r0; do
    [ -e $R/eval/$m-s$s.json ] || "$PYTHON" eval.py tasks --ckpt $R/$m-s$s --data $D --thresholds 0.9,1 \
      --out $R/eval/$m-s$s.json > /dev/null
  done
done
"$PYTHON" -m scripts.report align_protocol $R $r0 $r10 $k "$rates0 $rates10" $SEEDS | tee $R/protocol.md
# cosine against L2, best against best: L2's λ and rate from L2_LAMBDAS × SWEEP_LRS (the same rule; a choice at an
# edge of either goes on past it, λ first, three steps at most), then its seeds
# λ = 0: λ = 0's runs (protocol.l2_runs; align.py runs no teacher and reads no --align_metric there)
l2_runs() { if awk "BEGIN { exit !($1 == 0) }"; then echo p-lam0; else echo p-l2-$1; fi; }
l2_run() { run $(l2_runs $1)-$2 1 --lambda_align $1 --align_metric l2 $(lr $2) "${VAL[@]}"; }
lams=$L2_LAMBDAS l2_rates=$SWEEP_LRS
sweep2 lams l2_rates l2_run "$PYTHON -m scripts.report l2_sweep --extend $R"
read -r l2 rl2 < <("$PYTHON" -m scripts.report l2_sweep $R "$lams" "$l2_rates")
for s in $SEEDS; do
  m=$(l2_runs $l2)-$rl2
  run $m $s --lambda_align $l2 --align_metric l2 $(lr $rl2) "${VAL[@]}"
  [ -e $R/eval/$m-s$s.json ] || "$PYTHON" eval.py tasks --ckpt $R/$m-s$s --data $D --thresholds 0.9,1 \
    --out $R/eval/$m-s$s.json > /dev/null
done
"$PYTHON" -m scripts.report l2_protocol $R $r10 $l2 $rl2 "$lams" "$l2_rates" $SEEDS | tee $R/protocol-l2.md
