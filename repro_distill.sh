#!/usr/bin/env bash
# The small-scale OPDLM reproduction. Three runs start from the same converted block-4 student (out/dlm-block,
# made by run.sh) with the frozen AR teacher out/ar-tiny, the same steps, batch, prompts and seed; only the states
# they train on differ:
#   on    OPDLM: states of the student's own rollouts (the rounds of its sampler's trajectory)
#   off   the published ablation: the same kind of rollouts, masked at random (same content, other states)
#   data  random masks of data windows (other content, other states)
# Every trained student and the untrained out/dlm-block are then scored on the states students are trained and
# sampled in: distill.py's evaluation (the on-policy KL on rollouts of the final length --rollout_max, and tokens
# per forward per row there, threshold 0.9, temperature 1; the untrained one through --max_iters 0), eval.py
# likelihood (the BD3-LM bound: each block given the clean blocks before it; masked-token accuracy likewise) and
# eval.py generate at several thresholds (generative perplexity under the teacher, unigram entropy, tokens per
# forward). Finished runs and evaluations are reused. Prints a markdown table (also saved to $OUT/table.md).
#   bash repro_distill.sh           # ITERS=150, BATCH=8, THRESHOLDS="0.7 0.9", TEMPS="0 1.0"; OUT=out/repro_distill
#   SMOKE=1 bash repro_distill.sh   # checks the script end to end in a few minutes (2 steps, tiny evaluations),
#                                   # OUT=out/repro_distill_smoke: its numbers mean nothing
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
if [ -n "${SMOKE:-}" ]; then
  ITERS=${ITERS:-2}; BATCH=${BATCH:-2}; OUT=${OUT:-out/repro_distill_smoke}; TEMPS=${TEMPS:-"1.0"}
  DISTILL_ARGS=${DISTILL_ARGS:-"--rollout_min 8 --rollout_max 16 --curriculum_steps 2 --eval_batches 1"}
  LIK_ARGS=${LIK_ARGS:-"--n_batches 1 --n_draws 2 --seq_len 32 --batch_size 2"}
  GEN_ARGS=${GEN_ARGS:-"--num_prompts 2 --max_new_tokens 8 --batch_size 2"}
fi
ITERS=${ITERS:-150}
BATCH=${BATCH:-8}
OUT=${OUT:-out/repro_distill}
THRESHOLDS=${THRESHOLDS:-"0.7 0.9"}
TEMPS=${TEMPS:-"0 1.0"}  # eval.py generate: 0 greedy (its default); 1.0 as in the rollouts
DISTILL_ARGS=${DISTILL_ARGS:-""}  # extra distill.py flags for every run (defaults: rollout 16 -> 64 over 100 steps)
LIK_ARGS=${LIK_ARGS:-"--n_batches 4 --n_draws 4"}
GEN_ARGS=${GEN_ARGS:-""}
for d in out/dlm-block out/ar-tiny; do
  [ -e $d/config.json ] || { echo "repro_distill.sh: run 'bash run.sh' first (it makes $d)" >&2; exit 1; }
done

run() {  # run NAME [distill.py flags...]
  local name=$1; shift
  if [ -e "$OUT/$name/results.json" ]; then echo "== $name: reusing $OUT/$name"; return; fi
  rm -rf "${OUT:?}/$name"
  echo "== $name: distill.py $*"
  # shellcheck disable=SC2086
  "$PYTHON" distill.py --init out/dlm-block --teacher out/ar-tiny --data data/stdlib --out_dir "$OUT/$name" \
    --max_iters "$ITERS" --batch_size "$BATCH" --eval_interval 50 $DISTILL_ARGS "$@"
}
if [ ! -e "$OUT/untrained/results.json" ]; then  # distill.py's evaluation of out/dlm-block itself, no step
  mkdir -p "$OUT/untrained"
  # shellcheck disable=SC2086
  "$PYTHON" - "$OUT/untrained/results.json" --init out/dlm-block --teacher out/ar-tiny --data data/stdlib \
    --batch_size "$BATCH" $DISTILL_ARGS <<'PY'
import json, sys
import distill, training
args = distill.p.parse_args(sys.argv[2:])
device, ctx = training.setup(args.device, args.seed)
student = training.load_model(args.init, device, "repro_distill: student")
teacher = training.load_model(args.teacher, device, "repro_distill: teacher")
tok = training.load_tokenizer(args.init, student.config)
items = distill.prompt_pool(args, tok, args.rollout_max)[:args.eval_batches * args.batch_size]  # as distill.py
res = distill.evaluate(student, teacher, items, args.rollout_max, batch_size=args.batch_size, eos_id=tok.eos_id,
                       vocab_size=tok.vocab_size, threshold=args.threshold, temperature=args.temperature, ctx=ctx)
open(sys.argv[1], "w").write(json.dumps(dict(**res, eval_len=args.rollout_max, steps=0), indent=2) + "\n")
PY
  echo "== untrained: evaluated by distill.evaluate"
fi
run on                         # OPDLM: the student's own rollouts, fkl, seq reduction
run off --policy off           # the published ablation: its own rollouts, random masks
run data --policy data         # random masks of data windows

evaluate() {  # evaluate NAME CKPT: generate at every temperature x threshold, likelihood
  local name=$1 ckpt=$2 temp thr
  mkdir -p "$OUT/eval"
  for temp in $TEMPS; do for thr in $THRESHOLDS; do
    # shellcheck disable=SC2086
    [ -e "$OUT/eval/$name-gen-T$temp-$thr.json" ] || "$PYTHON" eval.py generate --ckpt "$ckpt" --ref out/ar-tiny \
      --temperature "$temp" --threshold "$thr" --show 0 $GEN_ARGS --out "$OUT/eval/$name-gen-T$temp-$thr.json" \
      > /dev/null
  done; done
  # shellcheck disable=SC2086
  [ -e "$OUT/eval/$name-lik.json" ] || "$PYTHON" eval.py likelihood --ckpt "$ckpt" $LIK_ARGS \
    --out "$OUT/eval/$name-lik.json" > /dev/null
  echo "== $name: evaluated"
}
evaluate untrained out/dlm-block
for name in on off data; do evaluate $name "$OUT/$name"; done
for temp in $TEMPS; do  # the teacher's own samples, for scale (AR: no threshold, one token per forward)
  # shellcheck disable=SC2086
  [ -e "$OUT/eval/teacher-gen-T$temp.json" ] || "$PYTHON" eval.py generate --ckpt out/ar-tiny --ref out/ar-tiny \
    --temperature "$temp" --show 0 $GEN_ARGS --out "$OUT/eval/teacher-gen-T$temp.json" > /dev/null
done

"$PYTHON" - "$OUT" "$THRESHOLDS" "$TEMPS" <<'PY' | tee "$OUT/table.md"
import json, sys
from pathlib import Path
out, thr, temps = Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3].split()
ev = lambda f: json.loads((out / "eval" / f"{f}.json").read_text())["results"]
res = {n: json.loads((out / n / "results.json").read_text()) for n in ("untrained", "on", "off", "data")}
L = res["on"]["eval_len"]
print(f"| student | on-policy KL @ {L} tokens | tok/fwd per row @ {L} (thr 0.9, T=1) | BD3-LM -ELBO bits/tok | "
      "acc@0.15 | acc@0.5 | threshold | " + " | ".join(f"T={t}: gen. ppl / entropy / tok per fwd" for t in temps)
      + " |")
print("|---" * (7 + len(temps)) + "|")
for name in res:
    lik, r = ev(f"{name}-lik"), res[name]
    for k, t in enumerate(thr):
        head = (f"| {name} | {r['val_kl']:.3f} | {r['val_tokens_per_forward']:.2f} | {lik['nelbo_bits_per_token']:.2f} "
                f"± {lik['stderr']:.2f} | {lik['acc@0.15']:.3f} | {lik['acc@0.5']:.3f}") if k == 0 else "| | | | | |"
        cells = [ev(f"{name}-gen-T{T}-{t}") for T in temps]
        print(f"{head} | {t} | " + " | ".join(f"{g['gen_perplexity']:.2f} / {g['unigram_entropy_bits']:.2f} / "
                                              f"{g['tokens_per_forward']:.2f}" for g in cells) + " |")
cells = [ev(f"teacher-gen-T{T}") for T in temps]
print("| teacher (AR) | | | | | | — | " + " | ".join(f"{g['gen_perplexity']:.2f} / {g['unigram_entropy_bits']:.2f} / "
                                                    f"{g['tokens_per_forward']:.2f}" for g in cells) + " |")
PY
