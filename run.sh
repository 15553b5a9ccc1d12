#!/usr/bin/env bash
# The embedded default, end to end on a CPU (about 15 minutes on 2 cores): installs the run-time requirements
# into the current Python, then
#   corpus (this Python's standard library, a BPE learnt on it) -> tiny AR teacher -> conversion (bidirectional
#   and block DLMs) -> REPR-ALIGN (and its λ = 0 baseline) -> OPDLM (the block student) -> DPO on the AR model
#   + AR-MAP merge into the REPR-ALIGN DLM -> evaluation of every model
# and ends with one table (likelihood, generation quality, tokens per forward, reward accuracy), printed and
# written to out/results.md. A stage whose output exists is reused, and says so; an interrupted training run
# is resumed; a failing stage stops the run with its name. Settings are the scripts' defaults except where
# set below (shorter runs, so that the whole chain fits the budget).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
"$PYTHON" -m pip install -q --disable-pip-version-check -r requirements.txt

T0=$SECONDS
stage() {  # stage NAME OUTPUT_FILE COMMAND...
  local name=$1 done_file=$2 t=$SECONDS; shift 2
  if [ -e "$done_file" ]; then
    echo "== $name: reusing $done_file (delete it to redo this stage)"
  else
    echo "== $name: $*"
    "$@" || { echo "run.sh: stage '$name' failed (command: $*)" >&2; exit 1; }
    echo "== $name: done in $((SECONDS - t)) s (total $((SECONDS - T0)) s)"
  fi
}
resume() { [ -e "$1/train_state.pt" ] && echo --resume || true; }  # an interrupted run continues

stage corpus    data/stdlib/meta.json     "$PYTHON" data.py --out_dir data/stdlib
stage pretrain  out/ar-tiny/results.json  "$PYTHON" pretrain.py --data data/stdlib --out_dir out/ar-tiny $(resume out/ar-tiny)
stage convert   out/dlm-tiny/config.json  "$PYTHON" convert.py --ar out/ar-tiny --out_dir out/dlm-tiny --attn bidirectional
# The block student is shifted (its head keeps the AR meaning): the published, unshifted one starts from a head aimed
# one position off and spends its first ~100 steps relearning it (repro_distill.sh measures both).
stage convert   out/dlm-block/config.json "$PYTHON" convert.py --ar out/ar-tiny --out_dir out/dlm-block --attn block \
                                            --block_size 4 --shift true
ALIGN="--init out/dlm-tiny --data data/stdlib --max_iters 100 --eval_interval 50 --samples 0"
stage align     out/align/results.json    "$PYTHON" align.py $ALIGN --out_dir out/align $(resume out/align)
stage align-λ0  out/align0/results.json   "$PYTHON" align.py $ALIGN --out_dir out/align0 --lambda_align 0 $(resume out/align0)
stage distill   out/distill/results.json  "$PYTHON" distill.py --init out/dlm-block --teacher out/ar-tiny --data data/stdlib \
                                            --out_dir out/distill --max_iters 40 --curriculum_steps 30 --eval_interval 20 $(resume out/distill)
stage pairs     data/pairs/heldout.jsonl  "$PYTHON" merge.py pairs --data data/stdlib --out_dir data/pairs --n_heldout 64
stage dpo       out/ar-dpo/results.json   "$PYTHON" merge.py dpo --ar out/ar-tiny --pairs data/pairs/train.jsonl \
                                            --heldout data/pairs/heldout.jsonl --out_dir out/ar-dpo $(resume out/ar-dpo)
stage merge     out/dlm-merged/merge.json "$PYTHON" merge.py merge --ar out/ar-tiny --ar_aligned out/ar-dpo --dlm out/align \
                                            --pairs data/pairs/train.jsonl --heldout data/pairs/heldout.jsonl \
                                            --out_dir out/dlm-merged --gammas 0,1,2,4,8 --n_masks 2 --samples 16

# Every model on the same validation batches and prompts. Sampling: temperature 0.8; the DLMs commit every token
# whose confidence reaches 0.9 (Fast-dLLM / the block sampler's threshold), hence their tokens per forward.
MODELS="ar-tiny ar-dpo dlm-tiny align0 align dlm-block distill dlm-merged"
for m in $MODELS; do
  stage "eval $m" out/eval/$m.likelihood.json "$PYTHON" eval.py likelihood --ckpt out/$m --data data/stdlib \
    --n_batches 4 --n_draws 4 --out out/eval/$m.likelihood.json
  threshold=$([ "$m" = ar-tiny ] || [ "$m" = ar-dpo ] || echo "--threshold 0.9")
  stage "eval $m" out/eval/$m.generate.json "$PYTHON" eval.py generate --ckpt out/$m --ref out/ar-tiny --data data/stdlib \
    --num_prompts 8 --max_new_tokens 64 --temperature 0.8 $threshold --show 1 --out out/eval/$m.generate.json
done

"$PYTHON" - $MODELS <<'PY' | tee out/results.md
import json, sys
from pathlib import Path
what = {"ar-tiny": "AR teacher (pretrain.py)", "ar-dpo": "AR after DPO (merge.py dpo)",
        "dlm-tiny": "converted DLM, untrained (convert.py)", "align0": "masked diffusion, λ = 0 (align.py)",
        "align": "REPR-ALIGN, λ = 10 (align.py)", "dlm-block": "converted block DLM, untrained (convert.py)",
        "distill": "OPDLM block student (distill.py)",
        "dlm-merged": "REPR-ALIGN + AR-MAP (merge.py merge)"}
merge = json.loads(Path("out/dlm-merged/merge.json").read_text())
dpo = json.loads(Path("out/ar-dpo/results.json").read_text())
reward = {"ar-dpo": f"{dpo['heldout_reward_acc']:.3f}",
          "dlm-merged": f"{merge['heldout']['reward_accuracy'][merge['gammas'].index(merge['best_gamma'])]:.3f} "
                        f"(γ = {merge['best_gamma']:g}, chosen on training pairs)"}
print("| model | likelihood: bits/token (AR: exact; DLM: −ELBO ± s.e.) | masked acc @0.5 | gen. perplexity "
      "(under the teacher) | sample entropy (bits) | tokens per forward | held-out reward accuracy |")
print("|---|---|---|---|---|---|---|")
for m in sys.argv[1:]:
    lk = json.loads(Path(f"out/eval/{m}.likelihood.json").read_text())["results"]
    gn = json.loads(Path(f"out/eval/{m}.generate.json").read_text())["results"]
    like = f"{lk['bits_per_token']:.3f}" if lk["kind"] == "AR" else f"{lk['nelbo_bits_per_token']:.3f} ± {lk['stderr']:.3f}"
    acc = f"{lk['acc@0.5']:.3f}" if "acc@0.5" in lk else "—"
    print(f"| {m}: {what[m]} | {like} | {acc} | {gn['gen_perplexity']:.1f} | {gn['unigram_entropy_bits']:.2f} "
          f"| {gn['tokens_per_forward']:.2f} | {reward.get(m, '—')} |")
print(f"\nAR-MAP win rate of out/dlm-merged over out/align under the rule 'prefer single quotes': "
      f"{merge['win_rate']:.3f} ({merge['samples']} samples each)")
PY
echo "run.sh: done in $((SECONDS - T0)) s; the table is in out/results.md. Try: python sample.py --ckpt out/align"
