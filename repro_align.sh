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
#   bash repro_align.sh                      # ITERS=61 (evaluations after steps 0, 5, ..., 60), OUT=out/repro
#   ONLY=claim bash repro_align.sh           # the four convergence runs alone
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
ITERS=${ITERS:-61}
EVERY=${EVERY:-5}
ABL_EVERY=${ABL_EVERY:-20}
OUT=${OUT:-out/repro}
INIT=${INIT:-out/dlm-tiny}
DATA=${DATA:-data/stdlib}
ONLY=${ONLY:-all}      # all | claim
EXTRA=${EXTRA:-}       # more align.py flags for every run (a smoke test: --batch_size 2 --seq_len 32 ...)
[ -e "$INIT/config.json" ] || { echo "repro_align.sh: no $INIT; run 'bash run.sh stdlib' first (it makes it)" >&2; exit 1; }
case $ONLY in all|claim) ;; *) echo "repro_align.sh: ONLY=$ONLY; use all or claim" >&2; exit 1 ;; esac

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

"$PYTHON" - "$OUT" "${RUNS[@]}" <<'PY' | tee "$OUT/table.md"
import csv, json, sys
from pathlib import Path
out, runs = Path(sys.argv[1]), sys.argv[2:]
cols = ["val_acc@0.15", "val_acc@0.5", "val_acc@0.9", "val_loss@0.5", "val_nelbo"]
curves, results = {}, {}
for r in runs:
    recs = [json.loads(line) for line in (out / r / "log.jsonl").read_text().splitlines()]
    curves[r] = [x for x in recs if "val_acc@0.5" in x]
    results[r] = json.loads((out / r / "results.json").read_text())
n_cos = max((len(x.get("val_cos", [])) for r in runs for x in curves[r]), default=0)
with open(out / "curves.csv", "w", newline="") as f:  # one row per run x evaluation
    w = csv.writer(f)
    w.writerow(["run", "lambda_align", "freeze", "scratch", "step", *cols, "cos_mean",
                *(f"cos_{l}" for l in range(n_cos))])
    for r in runs:
        res = results[r]
        for x in curves[r]:
            cos = x.get("val_cos", [])
            w.writerow([r, res["lambda_align"], "+".join(res["freeze"]), int(res["scratch"]), x["step"],
                        *(f"{x[c]:.5f}" for c in cols), f"{sum(cos) / len(cos):.5f}" if cos else "",
                        *(f"{v:.5f}" for v in cos)])
claim = [r for r in ("lambda0", "lambda10", "lambda0-frozen", "lambda10-frozen") if r in runs]
print(f"Convergence (lr 3e-4 constant after warmup; step s = after s+1 updates): acc@0.5 (higher is better) | "
      f"-ELBO in nats/token (lower is better)\n")
print("| step | " + " | ".join(f"acc@0.5 {r}" for r in claim) + " | " + " | ".join(f"-ELBO {r}" for r in claim) + " |")
print("|---" * (1 + 2 * len(claim)) + "|")
for i, x in enumerate(curves[claim[0]]):
    row = [curves[r][i] for r in claim]
    print(f"| {x['step']} | " + " | ".join(f"{y['val_acc@0.5']:.3f}" for y in row) + " | "
          + " | ".join(f"{y['val_nelbo']:.3f}" for y in row) + " |")
print(f"\nMean cosine to the teacher over all hidden states (at the aligned rows of a fixed 0.5-ratio corruption)\n")
print("| step | " + " | ".join(claim) + " |\n" + "|---" * (1 + len(claim)) + "|")
for i, x in enumerate(curves[claim[0]]):
    cos = [curves[r][i].get("val_cos") for r in claim]
    print(f"| {x['step']} | " + " | ".join(f"{sum(c) / len(c):.3f}" if c else "-" for c in cos) + " |")
base = results["lambda10"]["step_seconds_median"]
print(f"\nAll runs after step {curves[runs[0]][-1]['step']}: the cosine per hidden state (embeddings ... final norm)\n")
print("| run | acc@0.15 | acc@0.5 | acc@0.9 | loss@0.5 | -ELBO | cosine per hidden state | step time vs lambda10 |")
print("|---" * 8 + "|")
for r in runs:
    res = results[r]
    cos = " ".join(f"{v:.2f}" for v in res.get("val_cos", [])) or "-"
    print(f"| {r} | {res['val_acc@0.15']:.3f} | {res['val_acc@0.5']:.3f} | {res['val_acc@0.9']:.3f} | "
          f"{res['val_loss@0.5']:.3f} | {res['val_nelbo']:.3f} | {cos} | {res['step_seconds_median'] / base:.2f}x |")
print(f"\n(curves: {out / 'curves.csv'}; step times are each run's own median and move by ±10% on a shared machine)")
PY
# The figure next to the table (plot.py needs matplotlib, an optional extra): the four convergence runs.
"$PYTHON" plot.py "$OUT/lambda0" "$OUT/lambda10" "$OUT/lambda0-frozen" "$OUT/lambda10-frozen" \
  --keys val_acc@0.5 val_nelbo "val_cos*" --out "$OUT/curves.png" || echo "repro_align.sh: no figure (pip install matplotlib)"
