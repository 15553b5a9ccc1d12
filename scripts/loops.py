"""
How often a chat model loops, by sampling setting (docs/results.md, "The chat's sampling defaults"): each checkpoint
answers OPEN_PROMPTS (30 open requests, written before any run) in its chat template under each setting of SETTINGS,
and a reply loops when one 3-word sequence occurs three times or more in it (`loops`). Sampled settings run with
--seeds seeds. --heldout: what a setting costs in accuracy, on the sums and capitals of a held-out file
(worlds/conversion.py's, realworld.check; the first seed), and the rule that chooses the chat's defaults
(`choose`): of the first checkpoint's settings with no looping reply, the one with the best held-out accuracy (a tie:
the earlier in SETTINGS, the simpler). Then the chat's speed: each
checkpoint answers the first 5 prompts one at a time (as the chat does) at --speed_setting, in tokens per second up to
the end token.

    python -m scripts.loops --ckpt out/real/ar out/real/student --heldout data/real/heldout.jsonl \
        --out docs/runs/loops.json
"""
import argparse
import json
import time
from pathlib import Path

import torch

import sample
from lib import cli
from lib import data
from lib import training
from worlds import realworld

OPEN_PROMPTS = [
    "Write a haiku about autumn.", 'Translate "good morning" into French.', "Give me three tips for better sleep.",
    "Explain what a rainbow is to a child.", "Write a short poem about the sea.",
    "What should I pack for a beach trip?", "Describe your ideal weekend.", "Write a limerick about a cat.",
    "How do I make a cup of tea?",
    "List five fruits that are red.", "Tell me a short story about a brave mouse.", "Why is exercise good for you?",
    "Write a thank-you note to a teacher.", "What are the four seasons?", "Give me a recipe for a simple salad.",
    "Explain how plants grow.", "Write two sentences about the moon.", "What is a good name for a puppy?",
    "Describe a busy city street.", "How can I save money each month?", "Write a birthday message for a friend.",
    "What do bees do?", "Suggest three hobbies for a rainy day.", "Explain what a computer does.",
    "Write a motto for a school.", "How do you ride a bicycle?", "Describe the taste of chocolate.",
    "What makes a good friend?", "Write a short weather report for a sunny day.", "Why do leaves change color?",
]
SETTINGS = {  # name -> sample.generate's sampling arguments
    "greedy": {},
    "greedy, repetition_penalty 1.1": dict(repetition_penalty=1.1),
    "greedy, repetition_penalty 1.2": dict(repetition_penalty=1.2),
    "temperature 0.2, top_p 0.9": dict(temperature=0.2, top_p=0.9),
    "temperature 0.2, top_p 0.9, repetition_penalty 1.1": dict(temperature=0.2, top_p=0.9, repetition_penalty=1.1),
    "temperature 0.7, top_p 0.9, min_p 0.05, repetition_penalty 1.1": dict(temperature=0.7, top_p=0.9, min_p=0.05,
                                                                            repetition_penalty=1.1),
}


def loops(text, n=3, times=3):
    """True when some n-word sequence (words split on whitespace) occurs `times` times or more in text."""
    words = text.split()
    counts = {}
    for i in range(len(words) - n + 1):
        key = tuple(words[i:i + n])
        counts[key] = counts.get(key, 0) + 1
    return any(c >= times for c in counts.values())


def speed(model, tok, prompts, max_new_tokens, settings):
    """The chat's tokens per second: each prompt alone, tokens up to and including the end token over seconds."""
    ends, n, secs = tok.end_ids(model.config, turn=True), 0, 0.0
    for p in prompts:
        t0 = time.perf_counter()
        gen = sample.generate(model, [tok.apply_chat_template([{"role": "user", "content": p}])], max_new_tokens,
                              eos_id=ends, vocab_limit=tok.vocab_size, generator=torch.Generator().manual_seed(0),
                              **settings)
        secs += time.perf_counter() - t0
        n += int(gen.row_tokens[0])
    return n / secs


def choose(runs):
    """runs: {setting: dict(loop_share, heldout_accuracy)} of one checkpoint, in SETTINGS' order -> the chosen
    setting's name (the module's docstring), or None when every setting loops somewhere."""
    ok = [name for name in runs if runs[name]["loop_share"] == 0]
    return max(ok, key=lambda name: (runs[name]["heldout_accuracy"], -list(runs).index(name)), default=None)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=cli.HelpFormatter)
    p.add_argument("--ckpt", nargs="+", required=True, help="chat checkpoints (AR or DLM)")
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS), metavar="NAME",
                   help=f"which of SETTINGS: {'; '.join(SETTINGS)}")
    p.add_argument("--seeds", type=int, default=3, help="seeds per sampled setting (greedy: one run)")
    p.add_argument("--max_new_tokens", type=int, default=128, help="reply length: at most (AR), the canvas (DLMs)")
    p.add_argument("--heldout", default=None, help="also each setting's accuracy on this file's sum and capital "
                   "prompts (worlds/conversion.py's heldout.jsonl)")
    p.add_argument("--speed_setting", default=None, choices=list(SETTINGS), metavar="NAME",
                   help="the setting the chat's speed is measured at (default: the last of --settings)")
    p.add_argument("--out", default=None, help="write the results here (JSON, with every reply)")
    args = p.parse_args()
    held = [] if args.heldout is None else [it for it in data.read_jsonl(args.heldout, ("family", "prompt"))
                                            if it["family"] in ("sum", "capital")]
    out = dict(prompts=OPEN_PROMPTS, max_new_tokens=args.max_new_tokens, runs={}, tokens_per_second={})
    for ckpt in args.ckpt:
        model = training.load_model(ckpt, torch.device("cpu"), "loops: --ckpt").eval()
        tok = training.load_tokenizer(ckpt, model.config)
        for name in args.settings:
            kw = SETTINGS[name]
            seeds = range(args.seeds if kw.get("temperature") else 1)
            texts = [realworld.replies(model, tok, [dict(prompt=p) for p in OPEN_PROMPTS], batch_size=30,
                                       max_new_tokens=args.max_new_tokens, seed=s, **kw) for s in seeds]
            share = sum(loops(t) for ts in texts for t in ts) / sum(len(ts) for ts in texts)
            rec = dict(ckpt=ckpt, setting=name, seeds=len(texts), loop_share=share, replies=texts)
            if held:  # the answers are short: the canvas of the held-out scoring (32)
                answers = realworld.replies(model, tok, held, batch_size=50, max_new_tokens=32, **kw)
                rec["heldout_accuracy"] = sum(realworld.check(it, r) for it, r in zip(held, answers)) / len(held)
            out["runs"][f"{ckpt} | {name}"] = rec
            print(f"{ckpt} | {name}: {share:.2f} of the replies loop ({len(texts)} seed(s))"
                  + (f", held-out accuracy {rec['heldout_accuracy']:.2f}" if held else ""), flush=True)
        name = args.speed_setting or args.settings[-1]
        out["tokens_per_second"][ckpt] = dict(setting=name, value=speed(model, tok, OPEN_PROMPTS[:5],
                                                                        args.max_new_tokens, SETTINGS[name]))
    rows = [[r["setting"], r["ckpt"], r["seeds"], f"{r['loop_share']:.2f}",
             f"{r['heldout_accuracy']:.2f}" if held else "—"] for r in out["runs"].values()]
    print("\n" + cli.table(["setting", "checkpoint", "seeds", "replies that loop", "held-out sums and capitals"],
                            rows))
    first = {r["setting"]: r for r in out["runs"].values() if r["ckpt"] == args.ckpt[0]}
    if held:
        out["chosen"] = choose(first)
        print(f"\nchosen for the chat (no looping reply, then the best held-out accuracy, {args.ckpt[0]}): "
              f"{out['chosen']}")
    for ckpt, s in out["tokens_per_second"].items():
        print(f"{ckpt}: {s['value']:.1f} tokens/s, one reply at a time ({s['setting']})")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
