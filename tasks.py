"""
A second embedded world, with exact answers: algorithmic prompt -> answer tasks made in code, a checker per
task, and exact-match evaluation of any checkpoint with its own sampler (minGPT's sorting and addition demos,
as documents for data.py: one {"text": prompt + answer} per line of train.jsonl).

    python tasks.py --out_dir data/tasks                                  # train.jsonl, heldout.jsonl
    python data.py --source data/tasks/train.jsonl --out_dir data/tasks   # a BPE learnt on them, token files
    python pretrain.py --data data/tasks --out_dir out/ar-tasks --loss_after " =" --seq_len 16 --batch_size 64 \
        --max_iters 1200 --eval_interval 300                             # answer-only loss, rows of whole prompts
    python tasks.py --out_dir data/tasks --ckpt out/ar-tasks              # exact match on heldout.jsonl

The families (digits are space-separated, so the learnt BPE gives each digit one token and the byte tokenizer
two; the answer ends where the document does, at eos). Default sizes: lists of 2-4 digits, operands of 1-2.

    sort 3 1 2 =        ->   1 2 3      every answer digit is fixed by the prompt alone: a DLM may commit
    rev 3 1 2 =         ->   2 1 3      the whole answer in one forward
    add 4 5 7 + 8 9 =   ->   5 4 6      most significant digit first: each digit waits on the carries from
                                        its right, so a parallel decoder should struggle

What is notable here:
- The split is by construction: a prompt is held out when a stable hash of its text says so (data.is_val, the
  rule data.py splits documents with), so no held-out prompt can occur in train.jsonl, whatever the seed or
  the sizes. Train and held-out prompts come from separately seeded streams: --n_train leaves heldout.jsonl
  as it is, and --n_heldout train.jsonl.
- check(family, prompt, completion) solves the prompt itself (solve) and compares whitespace-normalised
  digit strings up to the first eos text: exact, and independent of any stored answer.
- exact_match scores a checkpoint with the sampler its config.attn picks (causal: AR, bidirectional: masked
  diffusion, block: block diffusion) and counts each row's model forwards up to its eos as if it had been
  decoded alone: AR, one per token; block, Σ over its blocks of their rounds (block_generate's `rounds`);
  masked diffusion, the forwards in which its current block still held a mask (threshold decoding) or the
  schedule's steps per block (LLaDA). Tokens per forward = the row's tokens up to and including eos / those
  forwards.
"""
import argparse
import json
import random
from pathlib import Path

import torch

import data
import sample
from tokenizer import EOS

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


def held_out(prompt, fraction):
    """The split rule: a stable hash of the prompt's text (the same on every machine and for every seed)."""
    return data.is_val(prompt, fraction)


def build(*, seed=1337, n_train=100_000, n_heldout=200, families=FAMILIES, heldout_fraction=0.05, **sizes):
    """-> (training documents: prompt + answer texts, held-out items: n_heldout distinct held-out prompts per
    family with their answers). sizes: make_prompt's min_len, max_len, max_digits."""
    rng = random.Random(f"train-{seed}")  # a str seed hashes the same on every machine
    train = []
    while len(train) < n_train:
        family = rng.choice(families)
        prompt = make_prompt(family, rng, **sizes)
        if not held_out(prompt, heldout_fraction):
            train.append(prompt + solve(family, prompt))
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


def write(out_dir, train, items):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.jsonl").write_text("".join(json.dumps(dict(text=t)) + "\n" for t in train))
    (out / "heldout.jsonl").write_text("".join(json.dumps(it) + "\n" for it in items))


# ---- evaluation ----------------------------------------------------------------------------------

def round_up(n, k):
    return -(-n // k) * k


@torch.no_grad()
def exact_match(model, tok, items, *, batch_size=64, max_new_tokens=None, temperature=0.0, threshold=None,
                block_length=None, steps=None, block_size=None, generator=None):
    """Score items ({"prompt", "answer", "family"}) with the checkpoint's own sampler -> dict(accuracy,
    families={family: dict(n, accuracy, tokens_per_forward)}, rows=[dict(family, prompt, completion, correct,
    tokens, forwards)]). max_new_tokens: default the longest answer + eos, rounded up to the block size (block)
    or block_length (masked diffusion; default one block of that length); steps: LLaDA's, default one token a
    step; threshold: Fast-dLLM parallel decoding (block: default 0.9). Rows are scored by `check`."""
    c, dev = model.config, model.model.embed_tokens.weight.device
    N = max_new_tokens or max(len(tok.encode(it["answer"])) for it in items) + 1
    if c.attn == "block":
        bs = block_size or c.block_size
        N, unit, threshold = round_up(N, bs), bs, 0.9 if threshold is None else threshold
    elif c.attn == "bidirectional":
        unit = block_length or N
        N = round_up(N, unit)
        steps = steps or N
    if generator is None:
        generator = torch.Generator(dev).manual_seed(1337)
    kw = dict(temperature=temperature, eos_id=tok.eos_id, vocab_limit=tok.vocab_size, generator=generator)
    rows = []
    for i in range(0, len(items), batch_size):
        batch = items[i:i + batch_size]
        prompts = [tok.encode(it["prompt"]) for it in batch]
        if c.attn == "causal":
            gen = sample.ar_generate(model, prompts, N, **kw)
        elif c.attn == "block":
            gen = sample.block_generate(model, prompts, N, bs, threshold, record=True, **kw)
        else:
            masks = []  # threshold decoding: (B, L) "still masked" at the input of every forward
            hook = model.register_forward_pre_hook(lambda m, args: masks.append(args[0] == c.mask_token_id))
            try:
                gen = sample.diffusion_generate(model, prompts, N, unit, steps, threshold=threshold, **kw)
            finally:
                hook.remove()
        out = gen.generated  # (B, N)
        is_eos = out == tok.eos_id
        first = torch.where(is_eos.any(1), is_eos.long().argmax(1), N)  # (B,) index of the first eos, N if none
        tokens = (first + 1).clamp(max=N)  # the row's tokens up to and including eos
        if c.attn == "causal":
            forwards = tokens  # one forward per token
        else:
            B, nb = len(batch), N // unit
            if c.attn == "block":  # a block's forwards = its rounds = its last round + 1
                per_block = gen.rounds.view(B, nb, unit).amax(-1) + 1  # (B, nb); 0 for blocks never reached
            elif threshold is None:  # LLaDA: the schedule's steps on every block
                per_block = torch.full((B, nb), steps // nb, device=out.device)
            else:  # the batch works on its lowest block with a mask; a row counts the forward if it has one there
                m = torch.stack(masks)[:, :, gen.start:].view(len(masks), B, nb, unit).any(-1)  # (K, B, nb)
                cur = m.any(1).long().argmax(-1)  # (K,) the current block of each forward
                per_block = torch.zeros(B, nb, dtype=torch.long, device=out.device)
                per_block.scatter_add_(1, cur[None].expand(B, -1), m[torch.arange(len(masks)), :, cur].T.long())
            upto = torch.arange(nb, device=out.device) <= ((tokens - 1) // unit)[:, None]  # (B, nb) blocks to eos
            forwards = (per_block * upto).sum(1)
        for b, it in enumerate(batch):
            text = tok.decode(out[b, :first[b]].tolist())
            rows.append(dict(family=it["family"], prompt=it["prompt"], completion=text,
                             correct=check(it["family"], it["prompt"], text), tokens=int(tokens[b]),
                             forwards=int(forwards[b])))
    families = {}
    for f in dict.fromkeys(r["family"] for r in rows):  # in order of first appearance
        rs = [r for r in rows if r["family"] == f]
        families[f] = dict(n=len(rs), accuracy=sum(r["correct"] for r in rs) / len(rs),
                           tokens_per_forward=sum(r["tokens"] / r["forwards"] for r in rs) / len(rs))
    return dict(accuracy=sum(r["correct"] for r in rows) / len(rows), families=families, rows=rows)


# ---- CLI -----------------------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out_dir", default="data/tasks", help="where train.jsonl and heldout.jsonl are written (read)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--families", default=",".join(FAMILIES), help="comma-separated, from " + ", ".join(FAMILIES))
    p.add_argument("--n_train", type=int, default=100_000, help="training documents")
    p.add_argument("--n_heldout", type=int, default=200, help="held-out prompts per family")
    p.add_argument("--heldout_fraction", type=float, default=0.05, help="share of the prompt space held out")
    p.add_argument("--min_len", type=int, default=2, help="sort, rev: the shortest list")
    p.add_argument("--max_len", type=int, default=4, help="sort, rev: the longest list")
    p.add_argument("--max_digits", type=int, default=2, help="add: the longest operand")
    p.add_argument("--ckpt", default=None, help="instead: score this checkpoint on --out_dir/heldout.jsonl")
    p.add_argument("--batch_size", type=int, default=64, help="with --ckpt: prompts per sampler call")
    p.add_argument("--threshold", type=float, default=None, help="with --ckpt, DLMs: parallel decoding threshold")
    p.add_argument("--block_length", type=int, default=None, help="with --ckpt, masked diffusion: semi-AR block")
    p.add_argument("--steps", type=int, default=None, help="with --ckpt, masked diffusion: LLaDA steps")
    p.add_argument("--device", default="auto")
    args = p.parse_args()
    if args.ckpt is None:
        families = tuple(args.families.split(","))
        if set(families) - set(FAMILIES) or not 1 <= args.min_len <= args.max_len or args.max_digits < 1:
            p.error(f"--families must be from {', '.join(FAMILIES)}; 1 <= --min_len <= --max_len; --max_digits >= 1")
        if not 0 < args.heldout_fraction < 1:
            p.error("--heldout_fraction must be in (0, 1)")
        train, items = build(seed=args.seed, n_train=args.n_train, n_heldout=args.n_heldout, families=families,
                             heldout_fraction=args.heldout_fraction, min_len=args.min_len, max_len=args.max_len,
                             max_digits=args.max_digits)
        write(args.out_dir, train, items)
        print(f"wrote {args.out_dir}/train.jsonl ({len(train):,} documents) and heldout.jsonl ({len(items)} prompts)")
        return
    import eval as evaluation  # after argument parsing: loading a checkpoint needs torch and the model
    path = Path(args.out_dir) / "heldout.jsonl"
    if not path.is_file():
        raise SystemExit(f"tasks: no {path}; write one with: python tasks.py --out_dir {args.out_dir}")
    items = data.read_jsonl(path, ("prompt", "answer", "family"))
    model, tok, _, _ = evaluation.load(args.ckpt, args.device, args.seed)
    res = exact_match(model, tok, items, batch_size=args.batch_size, threshold=args.threshold,
                      block_length=args.block_length, steps=args.steps)
    print(f"{'family':8} {'n':>5} {'exact match':>12} {'tokens/forward':>15}   ({model.config.attn}, {args.ckpt})")
    for f, r in res["families"].items():
        print(f"{f:8} {r['n']:5d} {r['accuracy']:12.3f} {r['tokens_per_forward']:15.2f}")
    print(f"{'all':8} {len(res['rows']):5d} {res['accuracy']:12.3f}")
    for r in res["rows"][:6]:
        print(f"--- {r['prompt']!r} -> {r['completion']!r} ({'right' if r['correct'] else 'wrong'})")


if __name__ == "__main__":
    main()
