#!/usr/bin/env bash
# The small-scale OPDLM reproduction: on-policy vs off-policy states, compared fairly. Every student is a block-4
# conversion of the frozen AR teacher out/ar-tiny, made here; all runs share the prompts, batch, lr and
# curriculum (rollouts 16 -> 64 tokens over 40 steps, threshold 0.9, temperature 1.0).
#   shifted student (convert.py --shift true: the AR head keeps its meaning, training starts from the teacher's
#   conditionals), ITERS steps each, training seeds 1337 and 2:
#     on    OPDLM: states of the student's own rollouts (the rounds of its sampler's trajectory)
#     off   the published ablation: the same kind of rollouts, masked at random (same content, other states)
#     data  random masks of data windows (other content, other states)
#   unshifted student (convert.py's default for block, as the published student: its head starts one position
#   off, so it first relearns to predict its own position): on-policy, ITERS_UNSHIFTED steps, the same seeds.
# Every model (the untrained conversions too) is scored on:
#   KL real text   distill.py's val_kl_data: forward KL from the teacher, teacher-forced on fixed random block
#                  masks of the real continuations of 32 held-out prompts: the same states for every model, the
#                  number to compare them by
#   KL own         distill.py's val_kl: the same KL on the model's own rollouts (64 tokens, T = 1) from those
#                  prompts: the states it is sampled in, but each model is scored on its own text
#   -ELBO          eval.py likelihood: the BD3-LM bound, bits/token (each block given the clean blocks before it)
#   generation     eval.py generate (up to 32 validation documents from their first def: 29 on the stdlib corpus;
#                  64 new tokens, threshold 0.9) at temperature 1 and greedy: generative perplexity under the
#                  teacher (greedy decoding rewards loops: read it with the entropy and the repetition rate),
#                  unigram entropy (bits), the share of repeated 4-grams; and tokens per forward per row at T = 1,
#                  thresholds 0.9 and 0.7.
# Trained rows give the mean of the seeds, then each seed. Finished runs and evaluations are reused. The table is
# printed and written to $OUT/table.md. About 11 minutes of one core's CPU time (measured piecewise: a 60-step run
# 45 s, one model's evaluations 20 s), most of it the 8 training runs.
#   bash scripts/repro_distill.sh           # ITERS=60, ITERS_UNSHIFTED=120, BATCH=8, SEEDS="1337 2"; OUT=out/repro_distill
#   SMOKE=1 bash scripts/repro_distill.sh   # the script end to end in 1-3 minutes (2 steps, tiny evaluations),
#                                   # OUT=out/repro_distill_smoke: its numbers mean nothing
#   PART=protocol bash scripts/repro_distill.sh   # on against off policy under the protocol (docs/results.md, "The
#     verdict protocol"), shifted student (run.sh's out/dlm-block), ITERS steps: each policy's rate from SWEEP_LRS
#     at the first seed, judged by the BD3-LM -ELBO on the first half of the validation split (the lowest; a tie:
#     the lower rate); then SEEDS (default 1337 1338 1339) at the chosen rates; the test: each sequence's -ELBO on
#     the other half, paired t over (seed, sequence). Writes $OUT/protocol/protocol.md
set -euo pipefail
cd "$(dirname "$0")/.."  # the project root
source scripts/stage.sh  # stage NAME DONE_FILE COMMAND...; lr RATE
PYTHON=${PYTHON:-python3}
if [ -n "${SMOKE:-}" ]; then
  ITERS=${ITERS:-2}; ITERS_UNSHIFTED=${ITERS_UNSHIFTED:-2}; BATCH=${BATCH:-2}; OUT=${OUT:-out/repro_distill_smoke}
  DISTILL_ARGS=${DISTILL_ARGS:-"--rollout_min 8 --rollout_max 16 --curriculum_steps 2 --eval_batches 1"}
  LIK_ARGS=${LIK_ARGS:-"--n_batches 1 --n_draws 2 --seq_len 32 --batch_size 2"}
  GEN_ARGS=${GEN_ARGS:-"--num_prompts 2 --max_new_tokens 8 --batch_size 2"}
fi
ITERS=${ITERS:-60}
ITERS_UNSHIFTED=${ITERS_UNSHIFTED:-120}
BATCH=${BATCH:-8}
PART=${PART:-all}
SEEDS=${SEEDS:-$([ "$PART" = protocol ] && echo "1337 1338 1339 1340 1341" || echo "1337 2")}
SWEEP_LRS=${SWEEP_LRS:-"3e-3 1e-3 3e-4"}
OUT=${OUT:-out/repro_distill}
DISTILL_ARGS=${DISTILL_ARGS:-"--curriculum_steps 40 --eval_batches 4"}  # extra distill.py flags, every run
LIK_ARGS=${LIK_ARGS:-"--n_batches 4 --n_draws 4"}
GEN_ARGS=${GEN_ARGS:-"--num_prompts 32 --max_new_tokens 64"}
for f in out/ar-tiny/config.json data/stdlib/meta.json; do
  [ -e $f ] || { echo "scripts/repro_distill.sh: run 'bash run.sh stdlib' first (it makes $(dirname $f))" >&2; exit 1; }
done
T0=$SECONDS
mkdir -p "$OUT/eval"
quiet() {  # quiet LOG COMMAND...: the command's output goes to LOG; if it fails, LOG's tail is shown and we stop
  local log=$1; shift
  "$@" > "$log" 2>&1 || { tail -5 "$log" >&2; echo "scripts/repro_distill.sh: failed ($log): $*" >&2; exit 1; }
}
if [ "$PART" != protocol ]; then  # (the protocol's student is run.sh's out/dlm-block)
for s in shift noshift; do  # the two students, converted here
  [ -e "$OUT/init-$s/config.json" ] || quiet "$OUT/init-$s.log" "$PYTHON" convert.py --ar out/ar-tiny \
    --out_dir "$OUT/init-$s" --attn block --block_size 4 --shift "$([ $s = shift ] && echo true || echo false)"
done

# distill.py's evaluation of an untrained conversion (no step): the same prompts, seeds and flags as the runs'
for s in shift noshift; do
  [ -e "$OUT/$s-untrained/results.json" ] && continue
  mkdir -p "$OUT/$s-untrained"
  # shellcheck disable=SC2086
  "$PYTHON" -m scripts.report distill_untrained "$OUT/$s-untrained/results.json" --init "$OUT/init-$s" \
    --teacher out/ar-tiny --data data/stdlib \
    --batch_size "$BATCH" $DISTILL_ARGS
  echo "== $s-untrained: evaluated by distill.evaluate ($((SECONDS - T0)) s)"
done
fi

run() {  # run NAME INIT STEPS SEED [distill.py flags...]
  local name=$1 init=$2 steps=$3 seed=$4; shift 4
  if [ -e "$OUT/$name/results.json" ]; then echo "== $name: reusing $OUT/$name"; return; fi
  rm -rf "${OUT:?}/$name"
  echo "== $name: distill.py --init $init --max_iters $steps --seed $seed $*"
  # shellcheck disable=SC2086
  quiet "$OUT/$name.log" "$PYTHON" distill.py --init "$init" --teacher out/ar-tiny --data data/stdlib \
    --out_dir "$OUT/$name" --max_iters "$steps" --batch_size "$BATCH" --eval_interval "$steps" --seed "$seed" \
    $DISTILL_ARGS "$@"
  echo "== $name: $(grep 'final eval' "$OUT/$name.log") ($((SECONDS - T0)) s)"
}
if [ "$PART" = protocol ]; then
  P=$OUT/protocol s0=${SEEDS%% *}
  mkdir -p $P/eval
  lik() {  # lik RUN HALF NAME: eval.py likelihood (the BD3-LM bound) on one half of the validation split
    # shellcheck disable=SC2086
    [ -e $P/eval/$3.json ] || quiet $P/eval/$3.log "$PYTHON" eval.py likelihood --ckpt $OUT/protocol/$1 \
      --data data/stdlib $LIK_ARGS --n_batches 8 --half $2 --out $P/eval/$3.json
  }
  sweep_run() { run protocol/$1-$2-s$s0 out/dlm-block "$ITERS" $s0 --policy $1 $(lr $2); lik $1-$2-s$s0 first val-$1-$2; }
  on_rates=$SWEEP_LRS off_rates=$SWEEP_LRS  # each goes on past a chosen edge
  sweep on_rates "sweep_run on" "$PYTHON -m scripts.report nelbo_sweep --extend $P val-on"
  sweep off_rates "sweep_run off" "$PYTHON -m scripts.report nelbo_sweep --extend $P val-off"
  ron=$("$PYTHON" -m scripts.report nelbo_sweep $P val-on $on_rates)
  roff=$("$PYTHON" -m scripts.report nelbo_sweep $P val-off $off_rates)
  k=$("$PYTHON" -m scripts.report time_steps $P/on-$ron-s$s0 $P/off-$roff-s$s0 "$ITERS")  # off's steps in on's time
  for s in $SEEDS; do
    run protocol/on-$ron-s$s out/dlm-block "$ITERS" $s --policy on $(lr $ron)
    run protocol/off-$roff-s$s out/dlm-block "$ITERS" $s --policy off $(lr $roff)
    [ "$k" = "$ITERS" ] || run protocol/offtime-$roff-s$s out/dlm-block "$k" $s --policy off $(lr $roff)
    for m in on-$ron off-$roff $([ "$k" = "$ITERS" ] || echo offtime-$roff); do lik $m-s$s second $m-s$s; done
  done
  "$PYTHON" -m scripts.report stdlib_opdlm_protocol $P $ron $roff $k "$ITERS" "$on_rates $off_rates" $SEEDS \
    | tee $P/protocol.md
  exit 0
fi
for seed in $SEEDS; do
  for policy in on off data; do run "shift-$policy-s$seed" "$OUT/init-shift" "$ITERS" "$seed" --policy $policy; done
  run "noshift-on-s$seed" "$OUT/init-noshift" "$ITERS_UNSHIFTED" "$seed"
done

JOBS=$OUT/eval/jobs.txt
: > "$JOBS"
evaluate() {  # evaluate NAME CKPT [lik]: queue generate at (T, threshold) (1, 0.9), (0, 0.9), (1, 0.7); likelihood
  local name=$1 ckpt=$2 lik=${3:-} setting temp thr flag
  for setting in 1.0:0.9 0:0.9 1.0:0.7; do
    temp=${setting%:*} thr=${setting#*:} flag="--threshold ${setting#*:}"
    [ "$name" = teacher ] && { [ "$thr" = 0.7 ] && continue; thr=ar flag=""; }  # the AR sampler has no threshold
    [ -e "$OUT/eval/$name-gen-T$temp-$thr.json" ] || echo "generate --ckpt $ckpt --ref out/ar-tiny --data data/stdlib" \
      "--temperature $temp $flag --show 0 $GEN_ARGS --out $OUT/eval/$name-gen-T$temp-$thr.json" >> "$JOBS"
  done
  [ -z "$lik" ] || [ -e "$OUT/eval/$name-lik.json" ] || echo "likelihood --ckpt $ckpt --data data/stdlib $LIK_ARGS" \
    "--out $OUT/eval/$name-lik.json" >> "$JOBS"
}
evaluate teacher out/ar-tiny
for s in shift noshift; do evaluate "$s-untrained" "$OUT/init-$s" lik; done
for seed in $SEEDS; do
  for name in shift-on shift-off shift-data noshift-on; do evaluate "$name-s$seed" "$OUT/$name-s$seed" lik; done
done
# The queued evaluations in one process (starting Python and torch for each would cost about as much as the
# evaluations themselves); each one's output goes to its .log next to its .json.
"$PYTHON" -m scripts.report eval_jobs "$JOBS" "$((SECONDS - T0))"

"$PYTHON" -m scripts.report repro_distill "$OUT" "$SEEDS" "$ITERS" "$ITERS_UNSHIFTED" | tee "$OUT/table.md"
# The figure next to the table (lib/plot.py needs matplotlib, an optional extra): the training KL of the first seed's runs.
first=${SEEDS%% *}
"$PYTHON" -m lib.plot "$OUT/shift-on-s$first" "$OUT/shift-off-s$first" "$OUT/shift-data-s$first" "$OUT/noshift-on-s$first" \
  --keys kl max_len --out "$OUT/curves.png" || echo "scripts/repro_distill.sh: no figure (pip install matplotlib)"
echo "scripts/repro_distill.sh: done in $((SECONDS - T0)) s; the table is in $OUT/table.md"
