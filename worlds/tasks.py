"""
A second embedded world, with exact answers: algorithmic prompt -> answer tasks made in code, a checker per
task, and exact-match evaluation of any checkpoint with its own sampler (minGPT's sorting and addition demos,
as documents for lib/corpus.py: one {"text": prompt + answer} per line of train.jsonl).

    python -m worlds.tasks --out_dir data/tasks                                  # train.jsonl, heldout.jsonl
    python -m lib.corpus --source data/tasks/train.jsonl --out_dir data/tasks   # a BPE learnt on them, token files
    python pretrain.py --data data/tasks --out_dir out/ar-tasks --loss_after " =" --seq_len 16 --batch_size 64 \
        --max_iters 1200 --eval_interval 300                             # answer-only loss, rows of whole prompts
    python eval.py tasks --ckpt out/ar-tasks --data data/tasks            # exact match on heldout.jsonl

Notes on the design: docs/methods.md, "worlds/tasks.py" under §8.
"""
import collections
import json
import random
import time
from pathlib import Path

import torch

import sample
from lib import cli
from lib import data
from lib.checkpoint import same_tokenizer, trained_with
from lib.tokenizer import EOS, fingerprint_of

FAMILIES = ("sort", "rev", "add")


# ---- the tasks -----------------------------------------------------------------------------------

def digits_text(ds):
    return "".join(f" {d}" for d in ds)  # [1, 2, 3] -> " 1 2 3"


def make_prompt(family, rng, *, min_len=2, max_len=4, max_digits=2):
    """A random canonical prompt: sort/rev a list of min_len..max_len digits; add two numbers of 1..max_digits
    digits each (the digit count uniform, then the value; no leading zeros)."""
    if family == "add":
        a, b = (rng.randrange(10 ** (n - 1) if n > 1 else 0, 10 ** n)
                for n in (rng.randint(1, max_digits), rng.randint(1, max_digits)))
        return f"add{digits_text(str(a))} +{digits_text(str(b))} ="
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {', '.join(FAMILIES)}")
    return f"{family}{digits_text(rng.randrange(10) for _ in range(rng.randint(min_len, max_len)))} ="


def solve(family, prompt):
    """The answer text of a canonical prompt (" 1 2 3"); ValueError when it is not one."""
    words = prompt.split(" ")
    ok = family in FAMILIES and len(words) >= 3 and words[0] == family and words[-1] == "="
    body = words[1:-1]
    if family == "add" and ok and body.count("+") == 1:
        i = body.index("+")
        nums = [body[:i], body[i + 1:]]
        if all(n and all(len(d) == 1 and d.isdigit() for d in n) and (n[0] != "0" or len(n) == 1) for n in nums):
            return digits_text(str(sum(int("".join(n)) for n in nums)))
    elif family != "add" and ok and all(len(d) == 1 and d.isdigit() for d in body):
        return digits_text(sorted(body) if family == "sort" else body[::-1])
    raise ValueError(f"not a canonical {family!r} prompt: {prompt!r}")


def check(family, prompt, completion):
    """Is the completion (text; cut at the first eos text) the prompt's answer, whitespace aside?"""
    return completion.split(EOS)[0].split() == solve(family, prompt).split()


MARK = "."  # the preference of the AR-MAP demonstration: end the answer with a full stop


def preferred(family, prompt, completion):
    """The rule-judged preference of the AR-MAP demonstration: the right answer followed by a full stop, then the end
    (" 1 2 3." for " 1 2 3"). The teacher sees it only with --mark_share; `check` counts such an answer wrong."""
    return completion.split(EOS)[0].split() == (solve(family, prompt) + MARK).split()


def held_out(prompt, fraction):
    """The split rule: a stable hash of the prompt's text (the same on every machine and for every seed)."""
    return data.is_val(prompt, fraction)


def build(*, seed=1337, n_train=100_000, n_heldout=200, families=FAMILIES, heldout_fraction=0.05, mark_share=0.0,
          **sizes):
    """-> (training documents: prompt + answer texts, held-out items: n_heldout distinct held-out prompts per
    family with their answers). mark_share: that share of the training answers end with the full stop (MARK), so
    that the teacher produces the preferred form sometimes. sizes: make_prompt's min_len, max_len, max_digits."""
    rng = random.Random(f"train-{seed}")  # a str seed hashes the same on every machine
    train = []
    while len(train) < n_train:
        family = rng.choice(families)
        prompt = make_prompt(family, rng, **sizes)
        if not held_out(prompt, heldout_fraction):
            mark = MARK if mark_share and rng.random() < mark_share else ""  # no draw at 0: the default data
            train.append(prompt + solve(family, prompt) + mark)
    rng, items = random.Random(f"heldout-{seed}"), []
    for family in families:
        seen = set()
        for _ in range(1000 * n_heldout):  # a small prompt space may hold fewer than n_heldout held-out prompts
            if len(seen) == n_heldout:
                break
            prompt = make_prompt(family, rng, **sizes)
            if held_out(prompt, heldout_fraction) and prompt not in seen:
                seen.add(prompt)
                items.append(dict(prompt=prompt, answer=solve(family, prompt), family=family))
    return train, items


def prompt_of(document):
    """A training document's prompt: its text up to and including " =" ("sort 3 1 2 =")."""
    return document[:document.index(" =") + 2]


def validation_items(items, per_family, train, exclude=(), *, seed=1337, families=FAMILIES):
    """per_family prompts of each family with the test's (items') mix of lengths in words, drawn from the training
    side of the split (the prompts of the documents `train`) less `exclude` (prompts.jsonl: what the RL, DPO and OPDLM
    arms train on): the split that learning rates and steps are judged on, the test read only at the end. The held-out
    side cannot give it: its short prompts are few and the test holds most of them, so a second hash-held-out split is
    nearly all the longest prompts (96-100%, against 58-72% in the test). The cost: the teacher's corpus holds these
    prompts (as it holds nearly every training-side prompt). ValueError when a length has too few prompts."""
    rng, out = random.Random(f"validation-{seed}"), []
    pool = sorted(set(map(prompt_of, train)) - set(exclude))
    for family in families:
        test = collections.Counter(len(it["prompt"].split()) for it in items if it["family"] == family)
        quota = largest_remainder(test, per_family)
        for n, k in sorted(quota.items()):
            have = [q for q in pool if q.split(" ")[0] == family and len(q.split()) == n]
            if len(have) < k:
                raise ValueError(f"validation: {k} {family} prompts of {n} words asked, the training side has "
                                 f"{len(have)} outside the excluded prompts")
            out += [dict(prompt=q, answer=solve(family, q), family=family) for q in rng.sample(have, k)]
    return out


def largest_remainder(counts, total):
    """{key: count} -> {key: share of total} in whole numbers that sum to total, each within one of its exact share
    (Hamilton's method: the floors, then one more to the largest remainders)."""
    n = sum(counts.values())
    exact = {k: total * c / n for k, c in counts.items()}
    out = {k: int(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: (out[k] - exact[k], k))[:total - sum(out.values())]:
        out[k] += 1
    return out


def prompts_and_pairs(train, items, *, n_prompts=2000, seed=1337):
    """From build()'s output -> (training prompts: up to n_prompts distinct prompts of the training documents, the
    prompt pool of distill.py; preference pairs for train and held-out: chosen = the answer with a full stop, then
    the end, rejected = the taught answer, then the end (the eos text, which merge.py reads as the eos id))."""
    prompts = list(dict.fromkeys(map(prompt_of, train)))  # distinct, in order of appearance
    prompts = random.Random(f"prompts-{seed}").sample(prompts, min(n_prompts, len(prompts)))
    pool = [dict(prompt=q, family=q.split(" ")[0]) for q in prompts]

    def pair(prompt):
        answer = solve(prompt.split(" ")[0], prompt)
        return dict(prompt=prompt, chosen=answer + MARK + EOS, rejected=answer + EOS)
    return pool, [pair(q) for q in prompts], [pair(it["prompt"]) for it in items]


def write(out_dir, train, items, pool=(), train_pairs=(), heldout_pairs=(), validation=()):
    """train.jsonl ({"text"}), heldout.jsonl ({"prompt", "answer", "family"}), and when given prompts.jsonl
    ({"prompt", "family"}), pairs_train.jsonl and pairs_heldout.jsonl ({"prompt", "chosen", "rejected"}),
    validation.jsonl (as heldout.jsonl)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {"train.jsonl": [dict(text=t) for t in train], "heldout.jsonl": items, "prompts.jsonl": pool,
             "pairs_train.jsonl": train_pairs, "pairs_heldout.jsonl": heldout_pairs, "validation.jsonl": validation}
    for name, recs in files.items():
        if recs:
            (out / name).write_text("".join(json.dumps(r) + "\n" for r in recs))


def heldout_items(data_dir, config, ckpt, who, per_family=None):
    """The held-out items of the task data in data_dir (its heldout.jsonl, or that file named itself: load_items),
    to score the checkpoint ckpt whose config is given: refused in one line, naming `who`, when there is no such
    file or the data was tokenized otherwise."""
    path = Path(data_dir)
    path, data_dir = (path, path.parent) if path.suffix == ".jsonl" else (path / "heldout.jsonl", path)
    if not path.is_file():
        raise SystemExit(f"{who}: no {path}; write one with: python -m worlds.tasks --out_dir {data_dir}")
    same_tokenizer(fingerprint_of(data_dir), f"{who}: the task data {data_dir}", trained_with(config),
                            f"the checkpoint {ckpt}",
                            "score a checkpoint trained on this data (pretrain.py --data DIR) or converted from one")
    return load_items(path, per_family)


def load_items(path, per_family=None):
    """heldout.jsonl's items, at most per_family of each family (the first ones; None: all), families in order."""
    by_family = {}
    for it in data.read_jsonl(path, ("prompt", "answer", "family")):
        by_family.setdefault(it["family"], []).append(it)
    return [it for rows in by_family.values() for it in rows[:per_family]]


# ---- evaluation ----------------------------------------------------------------------------------

def round_up(n, k):
    return -(-n // k) * k


def throughput(gens, seconds):
    """One run's speed from its Generations (the batches) and the seconds they took in all -> dict:
    tokens_per_forward, the mean over rows of row_tokens / row_nfe (the per-sequence figure papers report),
    with its std, min and max over rows; forwards_per_row, the mean row_nfe; nfe, the batched forwards;
    tokens_per_s, counting each row's tokens up to its first eos; raw_tokens_per_s, every generated slot."""
    tpf = torch.cat([g.tokens_per_forward.double().cpu() for g in gens])  # (rows,)
    return dict(tokens_per_forward=tpf.mean().item(), tokens_per_forward_std=tpf.std(correction=0).item(),
                tokens_per_forward_min=tpf.min().item(), tokens_per_forward_max=tpf.max().item(),
                forwards_per_row=torch.cat([g.row_nfe.double().cpu() for g in gens]).mean().item(),
                nfe=sum(g.nfe for g in gens),
                tokens_per_s=sum(int(g.row_tokens.sum()) for g in gens) / seconds,
                raw_tokens_per_s=sum(g.generated.numel() for g in gens) / seconds)


def forwards_split(gen, block):
    """-> (answer, after), each (B,): a DLM row's forwards split into those that committed a slot of its answer (up to
    and including its first end token: row_tokens) and those that committed only slots after it. gen: a DLM sampler's
    Generation with rounds (record=True); block: its block (block_size, or the masked sampler's block_length). A
    forward is (block, round); every forward a row is charged commits at least one of its slots, so the two add up
    to row_nfe."""
    B, N = gen.rounds.shape
    slot = torch.arange(N, device=gen.rounds.device)
    key = slot // block * block + gen.rounds  # (B, N): the forward that committed each slot
    answer = slot < gen.row_tokens[:, None]

    def forwards(where):  # distinct keys where `where` holds
        hit = torch.zeros(B, N + 1, dtype=torch.bool, device=key.device)
        return hit.scatter_(1, torch.where(where & (gen.rounds >= 0), key, N), True)[:, :N]

    a = forwards(answer)
    return a.sum(1), (forwards(~answer) & ~a).sum(1)


@torch.no_grad()
def split(rows):
    """The mean forwards per row that committed answer tokens, and spent only after the answer; rows with any."""
    return dict(forwards_answer=sum(r["forwards_answer"] for r in rows) / len(rows),
                forwards_after=sum(r["forwards_after"] for r in rows) / len(rows),
                rows_after=sum(r["forwards_after"] > 0 for r in rows) / len(rows))


def exact_match(model, tok, items, *, batch_size=64, max_new_tokens=None, temperature=0.0, threshold=None,
                block_length=None, steps=None, block_size=None, generator=None, cache="none", finish_block=False,
                eos_rule="free", eos_penalty=0.0, compile=False):
    """Score items ({"prompt", "answer", "family"}) with the checkpoint's own sampler (sample.generate) -> dict(n,
    accuracy, families={family: dict(n, accuracy, **throughput)}, lengths={"family/digits": dict(n, accuracy,
    tokens_per_forward)} (by the answer's digits), rows=[dict(family, prompt, completion, correct, tokens,
    forwards, digits)], **throughput), throughput being throughput() of those rows: tokens per forward per
    row (mean, std, min, max), forwards per row, tokens/s. A row's tokens and forwards are the sampler's own
    per-row counts (Generation.row_tokens, row_nfe: up to and including its eos, as if decoded alone). A row
    stops, and its completion is cut, at the first of the checkpoint's end ids (Tokenizer.end_ids).
    Each family is decoded in batches of its own, timed apart. max_new_tokens: default the longest answer + full
    stop + eos, rounded up to the block size (block) or block_length (masked diffusion; default one block of that
    length); steps: LLaDA's, default one token a step; threshold: Fast-dLLM parallel decoding (block: default 0.9).
    cache (masked diffusion: "none" | "prefix" | "dual", Fast-dLLM's approximate KV cache), finish_block (DLMs: a
    row is done at the end of its end token's block), eos_rule, eos_penalty and compile as in sample.generate. Rows
    are scored by `check` (correct) and `preferred` (the answer with a full stop); `right` is either. canvas: N, the
    slots a DLM decodes; each row's forwards are split (forwards_split) into those that committed answer
    tokens and those spent only on slots after the answer: forwards_answer, forwards_after (means per row),
    rows_after (the share of rows with any)."""
    c, dev, ends = model.config, model.model.embed_tokens.weight.device, tok.end_ids(model.config)
    N = max_new_tokens or max(len(tok.encode(it["answer"] + MARK)) for it in items) + 1  # room for the mark and eos
    if c.attn == "block":
        N = round_up(N, block_size or c.block_size)
    elif c.attn == "bidirectional":
        block_length = block_length or N
        N = round_up(N, block_length)
    if generator is None:
        generator = torch.Generator(dev).manual_seed(1337)
    dlm, block = c.attn != "causal", block_size or c.block_size if c.attn == "block" else block_length
    rows, gens, secs = [None] * len(items), {}, {}
    for f in dict.fromkeys(it["family"] for it in items):  # in order of first appearance
        idx = [i for i, it in enumerate(items) if it["family"] == f]
        gens[f], t0 = [], time.perf_counter()
        for j in range(0, len(idx), batch_size):
            batch = idx[j:j + batch_size]
            gen = sample.generate(model, [tok.encode(items[i]["prompt"]) for i in batch], N, temperature=temperature,
                                  eos_id=ends, generator=generator, vocab_limit=tok.vocab_size,
                                  block_length=block_length, steps=steps, threshold=threshold, block_size=block_size,
                                  cache=cache, finish_block=finish_block, eos_rule=eos_rule, eos_penalty=eos_penalty,
                                  record=dlm, compile=compile)
            gens[f].append(gen)
            answer, after = forwards_split(gen, block) if dlm else (gen.row_nfe, 0 * gen.row_nfe)
            for b, i in enumerate(batch):
                text = tok.decode(sample.until_end(gen.generated[b].tolist(), ends))
                rows[i] = dict(family=f, prompt=items[i]["prompt"], completion=text,
                               correct=check(f, items[i]["prompt"], text),
                               preferred=preferred(f, items[i]["prompt"], text), tokens=int(gen.row_tokens[b]),
                               forwards=int(gen.row_nfe[b]), forwards_answer=int(answer[b]),
                               forwards_after=int(after[b]), digits=len(solve(f, items[i]["prompt"]).split()))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        secs[f] = time.perf_counter() - t0
    families = {}
    for f in gens:
        rs = [r for r in rows if r["family"] == f]
        families[f] = dict(n=len(rs), accuracy=sum(r["correct"] for r in rs) / len(rs),
                           preferred=sum(r["preferred"] for r in rs) / len(rs),
                           right=sum(r["correct"] or r["preferred"] for r in rs) / len(rs), **split(rs),
                           **throughput(gens[f], secs[f]))
    lengths = {}
    for r in rows:
        lengths.setdefault(f"{r['family']}/{r['digits']}", []).append(r)
    lengths = {k: dict(n=len(rs), accuracy=sum(r["correct"] for r in rs) / len(rs),
                       tokens_per_forward=sum(r["tokens"] / max(1, r["forwards"]) for r in rs) / len(rs))
               for k, rs in sorted(lengths.items())}
    return dict(n=len(rows), accuracy=sum(r["correct"] for r in rows) / len(rows),
                preferred=sum(r["preferred"] for r in rows) / len(rows),
                right=sum(r["correct"] or r["preferred"] for r in rows) / len(rows), families=families,
                lengths=lengths, rows=rows, canvas=N, **split(rows),
                **throughput([g for gs in gens.values() for g in gs], sum(secs.values())))


# ---- CLI -----------------------------------------------------------------------------------------

def main():
    p = cli.parser(__doc__)
    p.add_argument("--out_dir", default="data/tasks", help="where train.jsonl and heldout.jsonl are written")
    p.add_argument("--seed", type=int, default=1337, help="draws the prompts (the split is by prompt hash)")
    p.add_argument("--families", default=",".join(FAMILIES), help="comma-separated, from " + ", ".join(FAMILIES))
    p.add_argument("--n_train", type=int, default=100_000, help="training documents")
    p.add_argument("--n_heldout", type=int, default=200, help="held-out prompts per family")
    p.add_argument("--n_validation", type=int, default=100, help="validation prompts per family, with the test's "
                   "mix of lengths (training-side prompts outside prompts.jsonl: none a test prompt, none an arm "
                   "trains on)")
    p.add_argument("--n_prompts", type=int, default=2000, help="distinct training prompts in prompts.jsonl")
    p.add_argument("--heldout_fraction", type=float, default=0.05, help="share of the prompt space held out")
    p.add_argument("--min_len", type=int, default=2, help="sort, rev: the shortest list")
    p.add_argument("--max_len", type=int, default=4, help="sort, rev: the longest list")
    p.add_argument("--max_digits", type=int, default=2, help="add: the longest operand")
    p.add_argument("--mark_share", type=float, default=0.0, help="the share of training answers that end with the "
                   "preferred full stop (0: the teacher never sees it)")
    args = p.parse_args()
    families = tuple(args.families.split(","))
    if set(families) - set(FAMILIES) or not 1 <= args.min_len <= args.max_len or args.max_digits < 1:
        p.error(f"--families must be from {', '.join(FAMILIES)}; 1 <= --min_len <= --max_len; --max_digits >= 1")
    if not 0 < args.heldout_fraction < 1 or not 0 <= args.mark_share <= 1:
        p.error("--heldout_fraction must be in (0, 1), --mark_share in [0, 1]")
    train, items = build(seed=args.seed, n_train=args.n_train, n_heldout=args.n_heldout, families=families,
                         heldout_fraction=args.heldout_fraction, min_len=args.min_len, max_len=args.max_len,
                         max_digits=args.max_digits, mark_share=args.mark_share)
    pool, train_pairs, heldout_pairs = prompts_and_pairs(train, items, n_prompts=args.n_prompts, seed=args.seed)
    try:
        val = validation_items(items, args.n_validation, train, [r["prompt"] for r in pool], seed=args.seed,
                               families=families)
    except ValueError as e:
        p.error(str(e))
    write(args.out_dir, train, items, pool, train_pairs, heldout_pairs, val)
    print(f"wrote {args.out_dir}/: train.jsonl ({len(train):,} documents), heldout.jsonl ({len(items)} prompts), "
          f"validation.jsonl ({len(val)} prompts), "
          f"prompts.jsonl ({len(pool)} training prompts), pairs_train.jsonl / pairs_heldout.jsonl "
          f"({len(train_pairs)} / {len(heldout_pairs)} preference pairs: an answer ending in a full stop is chosen)")


if __name__ == "__main__":
    main()
