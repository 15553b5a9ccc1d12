#!/usr/bin/env bash
# The small-scale OPDLM reproduction (issue: distill.py). Both runs start from the same converted block-4
# student (out/dlm-block, made by run.sh) with the frozen AR teacher out/ar-tiny, the same steps, batch,
# prompts and seed; only the states differ: on-policy (the student's own rollouts) against --policy off
# (random masks of data windows). Then every trained student and the untrained out/dlm-block are scored:
# eval.py generate (greedy and at temperature 1, generative perplexity under the teacher, unigram entropy, tokens per forward)
# at several thresholds, and eval.py likelihood (masked-token accuracy, negative ELBO). Finished runs and
# evaluations are reused. Prints a markdown table (also saved to $OUT/table.md).
#   bash repro_distill.sh        # ITERS=150, BATCH=8 by default; OUT=out/repro_distill
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
ITERS=${ITERS:-150}
BATCH=${BATCH:-8}
OUT=${OUT:-out/repro_distill}
THRESHOLDS=${THRESHOLDS:-"0.7 0.8 0.9 0.95"}
TEMPS=${TEMPS:-"0 1.0"}  # eval.py generate: 0 greedy (its default); 1.0 as in the rollouts
for d in out/dlm-block out/ar-tiny; do
  [ -e $d/config.json ] || { echo "repro_distill.sh: run 'bash run.sh' first (it makes $d)" >&2; exit 1; }
done

run() {  # run NAME [distill.py flags...]
  local name=$1; shift
  if [ -e "$OUT/$name/results.json" ]; then echo "== $name: reusing $OUT/$name"; return; fi
  rm -rf "$OUT/$name"
  echo "== $name: distill.py $*"
  "$PYTHON" distill.py --init out/dlm-block --teacher out/ar-tiny --data data/stdlib --out_dir "$OUT/$name" \
    --max_iters "$ITERS" --batch_size "$BATCH" --eval_interval 50 "$@"
}
run on                  # OPDLM: the student's own rollouts, fkl, rollout 16 -> 64 over 100 steps
run off --policy off    # the ablation: the same loss on random masks of data

evaluate() {  # evaluate NAME CKPT: generate at every temperature x threshold, likelihood
  local name=$1 ckpt=$2 temp thr
  for temp in $TEMPS; do for thr in $THRESHOLDS; do
    [ -e "$OUT/eval/$name-gen-T$temp-$thr.json" ] || "$PYTHON" eval.py generate --ckpt "$ckpt" --ref out/ar-tiny \
      --temperature "$temp" --threshold "$thr" --show 0 --out "$OUT/eval/$name-gen-T$temp-$thr.json" > /dev/null
  done; done
  [ -e "$OUT/eval/$name-lik.json" ] || "$PYTHON" eval.py likelihood --ckpt "$ckpt" --n_batches 4 --n_draws 4 \
    --out "$OUT/eval/$name-lik.json" > /dev/null
  echo "== $name: evaluated"
}
evaluate untrained out/dlm-block
evaluate on "$OUT/on"
evaluate off "$OUT/off"
for temp in $TEMPS; do  # the teacher's own samples, for scale (AR: no threshold, one token per forward)
  [ -e "$OUT/eval/teacher-gen-T$temp.json" ] || "$PYTHON" eval.py generate --ckpt out/ar-tiny --ref out/ar-tiny \
    --temperature "$temp" --show 0 --out "$OUT/eval/teacher-gen-T$temp.json" > /dev/null
done

"$PYTHON" - "$OUT" "$THRESHOLDS" "$TEMPS" <<'PY' | tee "$OUT/table.md"
import json, sys
from pathlib import Path
out, thr, temps = Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3].split()
ev = lambda f: json.loads((out / "eval" / f"{f}.json").read_text())["results"]
print("| student | on-policy KL (distill eval) | acc@0.15 | acc@0.5 | -ELBO bits/tok | threshold | "
      + " | ".join(f"T={t}: gen. ppl / entropy / tok per fwd" for t in temps) + " |")
print("|---" * (6 + len(temps)) + "|")
for name in ("untrained", "on", "off"):
    kl = json.loads((out / name / "results.json").read_text())["val_kl"] if name != "untrained" else None
    lik = ev(f"{name}-lik")
    for k, t in enumerate(thr):
        head = (f"| {name} | {'—' if kl is None else f'{kl:.3f}'} | {lik['acc@0.15']:.3f} | {lik['acc@0.5']:.3f} | "
                f"{lik['nelbo_bits_per_token']:.2f} ± {lik['stderr']:.2f}") if k == 0 else "| | | | |"
        cells = [ev(f"{name}-gen-T{T}-{t}") for T in temps]
        print(f"{head} | {t} | " + " | ".join(f"{g['gen_perplexity']:.2f} / {g['unigram_entropy_bits']:.2f} / "
                                              f"{g['tokens_per_forward']:.2f}" for g in cells) + " |")
cells = [ev(f"teacher-gen-T{T}") for T in temps]
print("| teacher (AR) | | | | | — | " + " | ".join(f"{g['gen_perplexity']:.2f} / {g['unigram_entropy_bits']:.2f} / "
                                                   f"{g['tokens_per_forward']:.2f}" for g in cells) + " |")
PY
