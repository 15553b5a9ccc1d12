"""
Right-over-wrong preference pairs from a checkpoint's own samples, judged by rl.py's reward: the pairs of the two
baselines that meet diffu-GRPO on the same judge (DPO on the DLM: `dpo.py --dlm`; AR-MAP: `dpo.py` on the AR
teacher's pairs, then `merge.py merge`).

    python -m scripts.judged_pairs --ckpt out/tasks/align0 --prompts data/tasks/prompts.jsonl --out pairs.jsonl

Each prompt gets --group samples (temperature 1; a DLM at --threshold), each judged; a prompt with a right and a
wrong sample gives one pair, its first right sample over its first wrong one. Records {prompt, chosen, rejected}, each
response closed by the end text, as dpo.py reads them; --heldout N writes the last N pairs to a second file.
"""
import json
import time
from pathlib import Path

import torch

import rl
import sample
from lib import cli
from lib import data
from lib import training


def judged_pairs(model, tok, records, reward, *, group, threshold, batch_size, seed, max_new_tokens):
    """-> (pairs, stats): a pair per record whose samples hold a right (reward > 0) and a wrong (reward <= 0) one."""
    ends, dlm = tok.end_ids(model.config, turn=True), model.config.attn != "causal"
    g = torch.Generator(model.lm_head.weight.device).manual_seed(seed)
    pairs, n_right, n, end = [], 0, 0, tok.decode([tok.eos_id])  # each response closed by the end text
    for s in range(0, len(records), batch_size):
        recs = records[s:s + batch_size]
        rows = [tok.encode(r["prompt"]) for r in recs for _ in range(group)]
        gen = sample.generate(model, rows, max_new_tokens, temperature=1.0, eos_id=ends, generator=g,
                              vocab_limit=tok.vocab_size, **(dict(threshold=threshold) if dlm else {}))
        texts = [tok.decode(sample.until_end(gen.generated[b].tolist(), ends)) for b in range(len(rows))]
        for k, r in enumerate(recs):
            mine = texts[k * group:(k + 1) * group]
            scores = [rl.checked_reward(reward, r, t, "a sample") for t in mine]
            n_right, n = n_right + sum(x > 0 for x in scores), n + group
            right = [t for t, x in zip(mine, scores) if x > 0]
            wrong = [t for t, x in zip(mine, scores) if x <= 0]
            if right and wrong:
                pairs.append(dict(prompt=r["prompt"], chosen=right[0] + end, rejected=wrong[0] + end))
    return pairs, dict(samples=n, right=n_right / max(1, n), pairs=len(pairs))


def main():
    p = cli.parser(__doc__)
    p.add_argument("--ckpt", required=True, help="the model whose samples are judged (AR or DLM)")
    p.add_argument("--prompts", required=True, help="JSONL of the records the reward reads (rl.py --prompts)")
    p.add_argument("--reward", default="tasks", help="as rl.py --reward")
    p.add_argument("--out", required=True, help="the pairs' JSONL")
    p.add_argument("--heldout", type=int, default=0, help="the last N pairs go to OUT with .heldout before .jsonl")
    p.add_argument("--group", type=int, default=8, help="samples per prompt")
    p.add_argument("--threshold", type=float, default=0.9, help="DLMs: the sampler's confidence threshold")
    p.add_argument("--max_new_tokens", type=int, default=8, help="the samples' length (a DLM's canvas)")
    p.add_argument("--num_prompts", type=int, default=None, help="the first N records only")
    p.add_argument("--batch_size", type=int, default=8, help="prompts per sampler call")
    p.add_argument("--seed", type=int, default=1337, help="the samples' generator")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    args = p.parse_args()
    device, _ = cli.setup(args.device, args.seed)
    model = training.load_model(args.ckpt, device, "judged_pairs: --ckpt").eval()
    tok = training.load_tokenizer(args.ckpt, model.config)
    reward, _ = rl.load_reward(args.reward)
    records = data.read_prompts(args.prompts)[:args.num_prompts]
    t0 = time.perf_counter()
    with torch.no_grad():
        pairs, stats = judged_pairs(model, tok, records, reward, group=args.group, threshold=args.threshold,
                                    batch_size=args.batch_size, seed=args.seed, max_new_tokens=args.max_new_tokens)
    split = len(pairs) - args.heldout
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(x) + "\n" for x in pairs[:split]))
    if args.heldout:
        out.with_suffix(".heldout.jsonl").write_text("".join(json.dumps(x) + "\n" for x in pairs[split:]))
    stats.update(seconds=time.perf_counter() - t0)
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
