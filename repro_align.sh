#!/usr/bin/env bash
# The small-scale REPR-ALIGN reproduction (issue: align.py). Every run starts from the same converted
# tiny DLM (out/dlm-tiny, made by run.sh) with the same steps, batch, data order and masks (same --seed);
# only the method differs. Finished runs are reused. Prints a markdown table (also saved to $OUT/table.md).
#   bash repro_align.sh                 # ITERS=200 by default; OUT=out/repro
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
ITERS=${ITERS:-200}
OUT=${OUT:-out/repro}
[ -e out/dlm-tiny/config.json ] || { echo "repro_align.sh: run 'bash run.sh' first (it makes out/dlm-tiny)" >&2; exit 1; }

run() {  # run NAME [align.py flags...]
  local name=$1; shift
  if [ -e "$OUT/$name/results.json" ]; then echo "== $name: reusing $OUT/$name"; return; fi
  rm -rf "$OUT/$name"
  echo "== $name: align.py $*"
  "$PYTHON" align.py --init out/dlm-tiny --data data/stdlib --out_dir "$OUT/$name" --max_iters "$ITERS" --samples 0 "$@"
}
run lambda10                                  # REPR-ALIGN, λ = 10, cosine, all hidden states
run lambda0      --lambda_align 0             # "AR fine-tuning": the same conversion without alignment
run scratch      --lambda_align 0 --scratch   # a DLM from random weights
run l2           --align_metric l2            # metric ablation
run mid          --align_layers mid           # layer-subset ablation: the middle third of the hidden states
run lambda1      --lambda_align 1
run lambda30     --lambda_align 30
run freeze       --freeze embed,mlp           # the paper: about twice the throughput, same quality

"$PYTHON" - "$OUT" <<'PY' | tee "$OUT/table.md"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = ["lambda10", "lambda0", "scratch", "l2", "mid", "lambda1", "lambda30", "freeze"]
logs = {r: [json.loads(l) for l in (out / r / "log.jsonl").read_text().splitlines()] for r in runs}
evals = {r: [x for x in logs[r] if "val_acc@0.5" in x] for r in runs}
steps = [x["step"] for x in evals["lambda10"]]
base = json.loads((out / "lambda10" / "results.json").read_text())["step_seconds_median"]
print("| run | " + " | ".join(f"acc@0.5, step {s}" for s in steps) + " | loss@0.5 | acc@0.15 | acc@0.9 | -ELBO (nats/tok) | step time vs λ=10 |")
print("|---" * (len(steps) + 6) + "|")
for r in runs:
    res = json.loads((out / r / "results.json").read_text())
    accs = " | ".join(f"{x['val_acc@0.5']:.3f}" for x in evals[r])
    print(f"| {r} | {accs} | {res['val_loss@0.5']:.3f} | {res['val_acc@0.15']:.3f} | {res['val_acc@0.9']:.3f} | "
          f"{res['val_nelbo']:.3f} | {res['step_seconds_median'] / base:.2f}x |")
PY
