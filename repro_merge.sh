#!/usr/bin/env bash
# The small-scale AR-MAP reproduction (issue: merge.py). DPO teaches the tiny AR teacher out/ar-tiny to prefer
# single-quoted strings (synthetic pairs cut from the corpus, merge.py pairs); the preference task vector
# τ_pref = W_AR_aligned − W_AR is then merged into the REPR-ALIGN DLM out/repro/lambda10 (made by
# repro_align.sh) by linear, TIES and DARE merging, each scored on the same γ grid with the same masks (same
# --seed). Finished stages are reused. Prints markdown tables (also saved to $OUT/table.md).
#   bash repro_merge.sh        # OUT=out/repro_merge, GAMMAS=0,0.5,1,2,3,4,6,8, DLM=out/repro/lambda10
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
OUT=${OUT:-out/repro_merge}
GAMMAS=${GAMMAS:-0,0.5,1,2,3,4,6,8}
DLM=${DLM:-out/repro/lambda10}
for f in data/stdlib/meta.json out/ar-tiny/config.json; do
  [ -e $f ] || { echo "repro_merge.sh: run 'bash run.sh' first (it makes $(dirname $f))" >&2; exit 1; }
done
if [ ! -e "$DLM/config.json" ]; then
  echo "repro_merge.sh: no $DLM ('bash repro_align.sh' makes it); using the unaligned conversion out/dlm-tiny" \
       "instead, whose τ_diff is zero (no shadowing to measure)" >&2
  DLM=out/dlm-tiny
  [ -e $DLM/config.json ] || { echo "repro_merge.sh: no $DLM either: run 'bash run.sh' first" >&2; exit 1; }
fi

stage() {  # stage NAME DONE_FILE COMMAND...
  local name=$1 done_file=$2; shift 2
  if [ -e "$done_file" ]; then echo "== $name: reusing $done_file"; return; fi
  echo "== $name: $*"
  "$@" || { echo "repro_merge.sh: stage '$name' failed" >&2; exit 1; }
}
P=$OUT/pairs
stage pairs "$P/heldout.jsonl" "$PYTHON" merge.py pairs --data data/stdlib --out_dir "$P"
resume=$([ -e "$OUT/ar-dpo/train_state.pt" ] && echo --resume || true)  # an interrupted run continues
stage dpo "$OUT/ar-dpo/results.json" "$PYTHON" merge.py dpo --ar out/ar-tiny --pairs "$P/train.jsonl" \
  --heldout "$P/heldout.jsonl" --out_dir "$OUT/ar-dpo" $resume
stage spectrum "$OUT/spectrum.json" "$PYTHON" merge.py spectrum --ar out/ar-tiny --ar_aligned "$OUT/ar-dpo" \
  --dlm "$DLM" --out "$OUT/spectrum.json"
for m in linear ties dare; do
  stage "merge $m" "$OUT/merged-$m/merge.json" "$PYTHON" merge.py merge --ar out/ar-tiny --ar_aligned "$OUT/ar-dpo" \
    --dlm "$DLM" --pairs "$P/heldout.jsonl" --out_dir "$OUT/merged-$m" --method $m --gammas "$GAMMAS"
done

"$PYTHON" - "$OUT" <<'PY' | tee "$OUT/table.md"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
load = lambda f: json.loads((out / f).read_text())
dpo, spec = load("ar-dpo/results.json"), load("spectrum.json")
runs = {m: load(f"merged-{m}/merge.json") for m in ("linear", "ties", "dare")}
print(f"DPO on {spec['ar']} ({dpo['steps']} steps, β = {dpo['beta']}): held-out reward accuracy "
      f"{dpo['heldout_reward_acc']:.3f}; held-out pairs with log π(y_w|x) > log π(y_l|x): "
      f"{dpo['heldout_pref_acc_before']:.3f} before, {dpo['heldout_pref_acc']:.3f} after\n")
head = {"linear": "linear", "ties": f"TIES (density {runs['ties']['density']})", "dare": f"DARE (drop {runs['dare']['drop']})"}
print(f"Held-out reward accuracy of the merged DLM ({spec['dlm']} + γ·Δ; {runs['linear']['n_pairs']} pairs, "
      f"{runs['linear']['n_masks']} shared mask draws each)\n")
print("| γ | " + " | ".join(head.values()) + " |\n" + "|---" * 4 + "|")
for k, g in enumerate(runs["linear"]["gammas"]):
    print(f"| {g:g} | " + " | ".join(f"{r['reward_accuracy'][k]:.3f}" for r in runs.values()) + " |")
print("| best γ | " + " | ".join(f"{r['best_gamma']:g}" for r in runs.values()) + " |")
print("| win rate vs the DLM | " + " | ".join("—" if r["win_rate"] is None else f"{r['win_rate']:.3f}" for r in runs.values()) + " |")
print(f"\nSpectral shadowing: ‖τ_diff‖₂ / ‖τ_pref‖₂ per layer type (τ_diff = W_AR − W_DLM)\n")
print("| layer type | count | median ‖τ_diff‖₂ | median ‖τ_pref‖₂ | median ratio | min ratio |\n|---|---|---|---|---|---|")
for t, v in spec["summary"].items():
    print(f"| {t} | {v['count']} | {v['diff']:.4g} | {v['pref']:.4g} | {v['ratio']:.4g} | {v['min_ratio']:.4g} |")
PY
