#!/usr/bin/env bash
# The small-scale AR-MAP reproduction. DPO teaches the tiny AR teacher out/ar-tiny to prefer single-quoted strings
# (synthetic pairs cut from the corpus, merge.py pairs); the preference task vector τ_pref = W_AR_aligned − W_AR is
# merged into the REPR-ALIGN DLM out/repro/lambda10 (made by repro_align.sh) by linear, TIES and DARE merging. γ is
# chosen on a sample of the training pairs and reported on the held-out pairs, every run on the same γ grid with the
# same mask draws (same --seed):
#   merged-{linear,ties,dare}   shared masks, the paper's rule (the best training-pair reward accuracy); the linear
#                               run also samples at every γ (the win rate per γ) and records the γ of --select dpo
#   merged-linear-independent   the merged models' masks drawn apart from the reference DLM's
# Finished stages are reused. Prints markdown tables (also saved to $OUT/table.md).
#   bash repro_merge.sh           # OUT=out/repro_merge, GAMMAS=0,0.5,1,2,3,4,6,8, DLM=out/repro/lambda10
#   SMOKE=1 bash repro_merge.sh   # a minute-long check of the whole chain (OUT=out/repro_merge_smoke)
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
if [ "${SMOKE:-0}" = 1 ]; then
  OUT=${OUT:-out/repro_merge_smoke}; GAMMAS=${GAMMAS:-0,1,4}
  PAIRS="--n_train 32 --n_heldout 16"; DPO="--max_iters 3 --eval_interval 2"
  MERGE="--n_select 16 --n_masks 1 --samples 2"
else
  OUT=${OUT:-out/repro_merge}; GAMMAS=${GAMMAS:-0,0.5,1,2,3,4,6,8}
  PAIRS=""; DPO=""; MERGE=""
fi
DLM=${DLM:-out/repro/lambda10}
for f in data/stdlib/meta.json out/ar-tiny/config.json; do
  [ -e $f ] || { echo "repro_merge.sh: run 'bash run.sh stdlib' first (it makes $(dirname $f))" >&2; exit 1; }
done
if [ ! -e "$DLM/config.json" ]; then
  echo "repro_merge.sh: no $DLM ('bash repro_align.sh' makes it); using the unaligned conversion out/dlm-tiny" \
       "instead, whose τ_diff is zero (no shadowing to measure)" >&2
  DLM=out/dlm-tiny
  [ -e $DLM/config.json ] || { echo "repro_merge.sh: no $DLM either: run 'bash run.sh stdlib' first" >&2; exit 1; }
fi

T0=$SECONDS
stage() {  # stage NAME DONE_FILE COMMAND...
  local name=$1 done_file=$2 t=$SECONDS; shift 2
  if [ -e "$done_file" ]; then echo "== $name: reusing $done_file"; return; fi
  echo "== $name: $*"
  "$@" || { echo "repro_merge.sh: stage '$name' failed" >&2; exit 1; }
  echo "== $name: done in $((SECONDS - t)) s"
}
P=$OUT/pairs
stage pairs "$P/heldout.jsonl" "$PYTHON" merge.py pairs --data data/stdlib --out_dir "$P" $PAIRS
resume=$([ -e "$OUT/ar-dpo/train_state.pt" ] && echo --resume || true)  # an interrupted run continues
stage dpo "$OUT/ar-dpo/results.json" "$PYTHON" merge.py dpo --ar out/ar-tiny --pairs "$P/train.jsonl" \
  --heldout "$P/heldout.jsonl" --out_dir "$OUT/ar-dpo" $DPO $resume
stage spectrum "$OUT/spectrum.json" "$PYTHON" merge.py spectrum --ar out/ar-tiny --ar_aligned "$OUT/ar-dpo" \
  --dlm "$DLM" --out "$OUT/spectrum.json"
merge() {  # merge NAME [merge.py flags...]
  local name=$1; shift
  stage "merge $name" "$OUT/merged-$name/merge.json" "$PYTHON" merge.py merge --ar out/ar-tiny \
    --ar_aligned "$OUT/ar-dpo" --dlm "$DLM" --pairs "$P/train.jsonl" --heldout "$P/heldout.jsonl" \
    --out_dir "$OUT/merged-$name" --gammas "$GAMMAS" $MERGE "$@"
}
merge linear --win_rate_at all
merge ties --method ties
merge dare --method dare
merge linear-independent --masks independent

"$PYTHON" - "$OUT" <<'PY' | tee "$OUT/table.md"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
load = lambda f: json.loads((out / f).read_text())
dpo, spec = load("ar-dpo/results.json"), load("spectrum.json")
names = ["linear", "ties", "dare", "linear-independent"]
runs = {m: load(f"merged-{m}/merge.json") for m in names}
lin, ind = runs["linear"], runs["linear-independent"]
f3 = lambda x: "—" if x is None else f"{x:.3f}"
f4 = lambda x: "—" if x is None else f"{x:.4f}"
print(f"DPO on {spec['ar']} ({dpo['steps']} steps, β = {dpo['beta']}): held-out reward accuracy "
      f"{dpo['heldout_reward_acc']:.3f} on {dpo['heldout_pairs']} pairs; held-out pairs with log π(y_w|x) > "
      f"log π(y_l|x): {dpo['heldout_pref_acc_before']:.3f} before, {dpo['heldout_pref_acc']:.3f} after\n")
print(f"Linear merge into {spec['dlm']}, γ chosen on {lin['train']['n_pairs']} training pairs, reported on "
      f"{lin['heldout']['n_pairs']} held-out pairs, {lin['n_masks']} ELBO draws per pair. Held-out: margin = the mean "
      f"r_γ(y_w) − r_γ(y_l); same sign = the pairs whose margin has its sign at the smallest γ > 0; chosen, rejected = "
      f"the mean r_γ(y_w), r_γ(y_l) (β × the ELBO change). Win rate against the DLM: {lin['samples']} samples per γ "
      f"(the same for both mask settings: sampling draws no masks)\n")
print("| γ | masks | train acc | train DPO loss | held-out acc | margin | margin / γ | same sign | chosen | rejected "
      "| win rate |\n" + "|---" * 11 + "|")
for k, g in enumerate(lin["gammas"]):
    for r in (lin, ind):
        t, h = r["train"], r["heldout"]
        print(f"| {g:g} | {r['masks']} | {f3(t['reward_accuracy'][k])} | {f4(t['dpo_loss'][k])} | "
              f"{f3(h['reward_accuracy'][k])} | {f4(h['margin'][k])} | {f4(h['margin_per_gamma'][k])} | "
              f"{f3(h['same_sign'][k])} | {f4(h['reward_chosen'][k])} | {f4(h['reward_rejected'][k])} | "
              f"{f3(lin['win_rates'][k])} |")
print("\nHeld-out reward accuracy per γ, and the γ each run chose on its training pairs\n")
head = {"linear": "linear", "ties": f"TIES (density {runs['ties']['density']})",
        "dare": f"DARE (drop {runs['dare']['drop']})", "linear-independent": "linear, independent masks"}
print("| γ | " + " | ".join(head.values()) + " |\n" + "|---" * (len(runs) + 1) + "|")
for k, g in enumerate(lin["gammas"]):
    print(f"| {g:g} | " + " | ".join(f"{r['heldout']['reward_accuracy'][k]:.3f}" for r in runs.values()) + " |")
for rule in lin["chosen_by"]:
    print(f"| γ by --select {rule} | " + " | ".join(f"{r['chosen_by'][rule]:g}" for r in runs.values()) + " |")
print("| win rate vs the DLM at the --select accuracy γ | " + " | ".join(f3(r["win_rate"]) for r in runs.values())
      + " |")
print(f"\nSpectral shadowing: ‖τ_diff‖₂ / ‖τ_pref‖₂ per layer type (τ_diff = W_AR − W_DLM)\n")
print("| layer type | count | median ‖τ_diff‖₂ | median ‖τ_pref‖₂ | median ratio | min ratio |\n" + "|---" * 6 + "|")
for t, v in spec["summary"].items():
    print(f"| {t} | {v['count']} | {v['diff']:.4g} | {v['pref']:.4g} | {v['ratio']:.4g} | {v['min_ratio']:.4g} |")
PY
echo "repro_merge.sh: done in $((SECONDS - T0)) s"
