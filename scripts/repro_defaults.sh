#!/usr/bin/env bash
# What a new user of the defaults gets in the standard-library world, after `bash run.sh stdlib` (its teacher
# out/ar-tiny): code from another project (this repository's own modules, tests aside) as held-out text.
#   OPDLM at its defaults: the published, unshifted block student (convert.py --attn block --block_size 4) distilled
#     for 60 steps with distill.py's defaults; greedy samples at threshold 0.9 on 32 prompts of that code, scored by
#     their perplexity under the teacher, against the untrained conversion's
#   DPO at its defaults: a preference harder than a format, the real 8-line continuation of 8 lines of that code
#     against the same lines shuffled (256 training pairs, 64 held out): dpo.py's held-out reward accuracy
# Writes out/defaults/results.md. About 3 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."  # the project root
PYTHON=${PYTHON:-python3}
O=out/defaults
[ -e out/ar-tiny/config.json ] || { echo "scripts/repro_defaults.sh: run 'bash run.sh stdlib' first" >&2; exit 1; }
mkdir -p $O
"$PYTHON" - $O <<'EOF'
import json, pathlib, random, sys
out, rng, windows = pathlib.Path(sys.argv[1]), random.Random(0), []
for f in sorted(f for d in (".", "lib", "worlds", "benchmarks") for f in pathlib.Path(d).glob("*.py")):
    lines = f.read_text().splitlines()
    for i in range(0, len(lines) - 16, 16):  # 8 lines of prompt, the next 8 its continuation
        prompt, cont = "\n".join(lines[i:i + 8]) + "\n", lines[i + 8:i + 16]
        if len(set(cont)) > 4 and sum(map(len, cont)) > 120:  # enough distinct lines to shuffle
            windows.append((prompt, cont))
rng.shuffle(windows)
(out / "prompts.jsonl").write_text("".join(json.dumps(dict(prompt=p)) + "\n" for p, _ in windows[:32]))
pairs = []
for p, cont in windows[32:352]:
    shuffled = cont[:]
    while shuffled == cont:
        rng.shuffle(shuffled)
    pairs.append(dict(prompt=p, chosen="\n".join(cont) + "\n", rejected="\n".join(shuffled) + "\n"))
for name, part in (("pairs_train", pairs[:256]), ("pairs_heldout", pairs[256:320])):
    (out / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in part))
print(f"{len(windows)} windows of code: 32 prompts, {len(pairs[:256])} + {len(pairs[256:320])} pairs")
EOF
[ -e $O/block/config.json ] || "$PYTHON" convert.py --ar out/ar-tiny --out_dir $O/block --attn block --block_size 4
[ -e $O/distill/results.json ] || "$PYTHON" distill.py --init $O/block --teacher out/ar-tiny --data data/stdlib \
  --out_dir $O/distill --max_iters 60 --weights_only > $O/distill.log 2>&1
for m in block distill; do
  [ -e $O/gen-$m.json ] || "$PYTHON" eval.py generate --ckpt $O/$m --ref out/ar-tiny --prompts $O/prompts.jsonl \
    --num_prompts 32 --prompt_len 64 --max_new_tokens 64 --temperature 0 --threshold 0.9 --show 0 \
    --out $O/gen-$m.json > /dev/null
done
[ -e $O/dpo/results.json ] || "$PYTHON" dpo.py --ar out/ar-tiny --pairs $O/pairs_train.jsonl \
  --heldout $O/pairs_heldout.jsonl --out_dir $O/dpo --weights_only > $O/dpo.log 2>&1
"$PYTHON" - $O <<'EOF' | tee $O/results.md
import json, pathlib, sys
O = pathlib.Path(sys.argv[1])
res = lambda p: json.loads((O / p).read_text())["results"]
print("OPDLM at its defaults (60 steps, unshifted block student), greedy at threshold 0.9 on 32 prompts of other "
      "code:\n\n| student | samples' perplexity under the teacher | sample entropy (bits) | tokens per forward |\n"
      "|---|---|---|---|")
for m, what in (("block", "untrained conversion"), ("distill", "after distill.py, 60 steps")):
    r = res(f"gen-{m}.json")
    print(f"| {what} | {r['gen_perplexity']:.1f} | {r['unigram_entropy_bits']:.2f} | {r['tokens_per_forward']:.2f} |")
d = json.loads((O / "dpo/results.json").read_text())
print(f"\nDPO at its defaults ({d['steps']} steps, β = {d['beta']}) on real against line-shuffled continuations: "
      f"held-out reward accuracy {d['heldout_reward_acc']:.3f} on {d['heldout_pairs']} pairs (the chosen one the "
      f"more likely: {d['heldout_pref_acc_before']:.3f} before, {d['heldout_pref_acc']:.3f} after)")
EOF
