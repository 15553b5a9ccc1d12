#!/usr/bin/env bash
# The small-scale REPR-ALIGN reproduction, built around its claim: aligning the hidden states with the AR
# teacher's (λ = 10) makes the converted DLM converge faster than the same conversion trained without it
# (λ = 0, "AR fine-tuning"), at equal steps. Every run starts from the same converted DLM ($INIT, made by
# run.sh) with the same steps, batch, data order and masks (same --seed) at the published learning rate 3e-4,
# held constant after the warmup (--min_lr = --lr: the first steps of a long run, not a schedule squeezed into
# 60 steps), and is evaluated every $EVERY steps on the same batches with the same masks: masked-token
# accuracy at mask ratios 0.15/0.5/0.9, the negative ELBO, and the cosine to the teacher per hidden state.
#   the claim:   λ 0 / 10, each with and without the published freezing (--freeze embed,lm_head)
#   ablations:   cosine vs L2, the middle third of the hidden states, λ 1 / 30, from scratch, embed+mlp frozen;
#                evaluated every $ABL_EVERY steps only (they are compared at the last step; evaluation dominates
#                the cost on a CPU: 8 batches x 5 forwards against one training step)
# Writes $OUT/curves.csv (one row per run x evaluation, for plotting) and $OUT/table.md; finished runs are reused.
#   bash scripts/repro_align.sh                      # ITERS=61 (evaluations after steps 0, 5, ..., 60), OUT=out/repro
#   ONLY=claim bash scripts/repro_align.sh           # the four convergence runs alone
#   ONLY=protocol bash scripts/repro_align.sh        # the claim under the protocol (docs/results.md, "The verdict
#     protocol"), at run.sh stdlib's settings (100 steps, the cosine schedule): each arm's rate from SWEEP_LRS at
#     seed 1337, judged by the -ELBO on the first half of the validation split (the lowest; a tie: the lower rate;
#     a choice at the sweep's edge goes on past it); then SEEDS (1337-1341) at the chosen rates, λ = 0 also for
#     λ = 10's time; the test: each sequence's -ELBO on the other half, the paired t over the seeds' means (the
#     pooled one over (seed, sequence) beside it), Holm across the two; and cosine (λ = 10) against L2 at its best
#     λ and rate from L2_LAMBDAS × SWEEP_LRS. Writes $OUT/protocol/protocol.md and protocol-l2.md
set -euo pipefail
cd "$(dirname "$0")/.."  # the project root
source scripts/stage.sh  # stage NAME DONE_FILE COMMAND...; lr RATE; sweep, sweep2: sweeps past an edge
PYTHON=${PYTHON:-python3}
ITERS=${ITERS:-61}
EVERY=${EVERY:-5}
ABL_EVERY=${ABL_EVERY:-20}
OUT=${OUT:-out/repro}
INIT=${INIT:-out/dlm-tiny}
DATA=${DATA:-data/stdlib}
ONLY=${ONLY:-all}      # all | claim
EXTRA=${EXTRA:-}       # more align.py flags for every run (a smoke test: --batch_size 2 --seq_len 32 ...)
[ -e "$INIT/config.json" ] || { echo "scripts/repro_align.sh: no $INIT; run 'bash run.sh stdlib' first (it makes it)" >&2; exit 1; }
case $ONLY in all|claim|protocol) ;; *) echo "scripts/repro_align.sh: ONLY=$ONLY; use all, claim or protocol" >&2
                                   exit 1 ;; esac

if [ "$ONLY" = protocol ]; then
  P=$OUT/protocol SWEEP_LRS=${SWEEP_LRS:-"1e-2 3e-3 1e-3 3e-4"} SEEDS=${SEEDS:-"1337 1338 1339 1340 1341"}
  mkdir -p $P/eval
  prun() {  # prun NAME SEED FLAGS...: skipped when its results.json exists
    local out=$P/$1-s$2 seed=$2; shift 2
    [ -e $out/results.json ] && { echo "== reusing $out"; return; }
    echo "== $out"
    # shellcheck disable=SC2086
    "$PYTHON" align.py --init "$INIT" --data "$DATA" --max_iters 100 --eval_interval 100 --samples 0 --weights_only \
      --seed $seed $EXTRA "$@" --out_dir $out > $out.log 2>&1 || { echo "failed: align.py $* (see $out.log)" >&2
                                                                    exit 1; }
  }
  lik() {  # lik RUN HALF NAME: eval.py likelihood on one half of the validation split
    [ -e $P/eval/$3.json ] || "$PYTHON" eval.py likelihood --ckpt $P/$1 --data "$DATA" --n_batches 8 --n_draws 4 \
      --half $2 --out $P/eval/$3.json > /dev/null
  }
  s0=${SEEDS%% *}
  sweep_run() { prun lam$1-$2 $s0 --lambda_align $1 $(lr $2); lik lam$1-$2-s$s0 first val-lam$1-$2; }
  rates0=$SWEEP_LRS rates10=$SWEEP_LRS  # each goes on past a chosen edge
  sweep rates0 "sweep_run 0" "$PYTHON -m scripts.report nelbo_sweep --extend $P val-lam0"
  sweep rates10 "sweep_run 10" "$PYTHON -m scripts.report nelbo_sweep --extend $P val-lam10"
  r0=$("$PYTHON" -m scripts.report nelbo_sweep $P val-lam0 $rates0)
  r10=$("$PYTHON" -m scripts.report nelbo_sweep $P val-lam10 $rates10)
  k=$("$PYTHON" -m scripts.report time_steps $P/lam10-$r10-s$s0 $P/lam0-$r0-s$s0 100)  # λ = 0's in λ = 10's time
  for s in $SEEDS; do
    prun lam0-$r0 $s --lambda_align 0 $(lr $r0)
    prun lam10-$r10 $s --lambda_align 10 $(lr $r10)
    prun lam0time-$r0 $s --lambda_align 0 $(lr $r0) --max_iters $k
    for m in lam0-$r0 lam10-$r10 lam0time-$r0; do lik $m-s$s second $m-s$s; done
  done
  "$PYTHON" -m scripts.report stdlib_align_protocol $P $r0 $r10 $k "$rates0 $rates10" $SEEDS | tee $P/protocol.md
  # cosine against L2, best against best: L2's λ and rate from L2_LAMBDAS × SWEEP_LRS by the same rule (an edge's
  # choice goes on past it, λ first). λ = 0 is the grid's bound: L2's runs there are λ = 0's own (protocol.l2_runs);
  # 0.01-0.1 are where the sweep from 0.3 went on before 0 joined it
  # (at λ = 0 align.py runs no teacher and reads no --align_metric: the same run as λ = 0's)
  l2_runs() { if awk "BEGIN { exit !($1 == 0) }"; then echo lam0; else echo l2-$1; fi; }
  l2_run() { local m; m=$(l2_runs $1)-$2; prun $m $s0 --lambda_align $1 --align_metric l2 $(lr $2)
             lik $m-s$s0 first val-$m; }
  lams=${L2_LAMBDAS:-0 0.01 0.03 0.1 0.3 1 3} l2_rates=$SWEEP_LRS
  sweep2 lams l2_rates l2_run "$PYTHON -m scripts.report nelbo_l2_sweep --extend $P"
  read -r l2 rl2 < <("$PYTHON" -m scripts.report nelbo_l2_sweep $P "$lams" "$l2_rates")
  for s in $SEEDS; do
    m=$(l2_runs $l2)-$rl2
    prun $m $s --lambda_align $l2 --align_metric l2 $(lr $rl2)
    lik $m-s$s second $m-s$s
  done
  "$PYTHON" -m scripts.report stdlib_l2_protocol $P $r10 $l2 $rl2 "$lams" "$l2_rates" $SEEDS \
    | tee $P/protocol-l2.md
  exit 0
fi

RUNS=()
run() {  # run NAME [align.py flags...]
  local name=$1; shift
  RUNS+=("$name")
  if [ -e "$OUT/$name/results.json" ]; then echo "== $name: reusing $OUT/$name"; return; fi
  rm -rf "$OUT/$name"
  echo "== $name: align.py $*"
  # shellcheck disable=SC2086
  "$PYTHON" align.py --init "$INIT" --data "$DATA" --out_dir "$OUT/$name" --max_iters "$ITERS" --lr 3e-4 \
    --min_lr 3e-4 --eval_interval "$EVERY" --ckpt_interval "$ITERS" --samples 0 $EXTRA "$@"
}
run lambda0          --lambda_align 0                             # the claim: λ = 0 against λ = 10,
run lambda10                                                      # REPR-ALIGN: cosine, all hidden states
run lambda0-frozen   --lambda_align 0 --freeze embed,lm_head      # each with the published freezing too
run lambda10-frozen  --freeze embed,lm_head
if [ "$ONLY" = all ]; then
  EVERY=$ABL_EVERY
  run l2             --align_metric l2                            # metric ablation
  run mid            --align_layers mid                           # the middle third of the hidden states
  run lambda1        --lambda_align 1
  run lambda30       --lambda_align 30
  run scratch        --lambda_align 0 --scratch                   # a DLM from random weights
  run frozen-mlp     --freeze embed,mlp                           # the paper's speed claim: step time
fi

"$PYTHON" -m scripts.report repro_align "$OUT" "${RUNS[@]}" | tee "$OUT/table.md"
# The figure next to the table (lib/plot.py needs matplotlib, an optional extra): the four convergence runs.
"$PYTHON" -m lib.plot "$OUT/lambda0" "$OUT/lambda10" "$OUT/lambda0-frozen" "$OUT/lambda10-frozen" \
  --keys val_acc@0.5 val_nelbo "val_cos*" --out "$OUT/curves.png" || echo "scripts/repro_align.sh: no figure (pip install matplotlib)"
