"""
--what sample: the samplers of sample.py on --preset's random weights (`--preset mid`: hidden 512, 8 layers,
26M parameters, a CPU's mid-size shape) or --ckpt DIR's trained ones, 16-token prompts (random ids, or with
--data the start of validation documents), runs interleaved, median of --iters (default 3 here) after 1
warmup. Five tables: (1) AR greedy with the static KV cache against recomputing the whole sequence for every
token, at --seq_len/4, /2 and --seq_len new tokens (the cache's advantage grows with the length); (2) our
ar_generate, eager and (--compile) compiled, against transformers' generate(do_sample=False) on the same
weights, batch 1 and --batch_size (ragged, left-padded prompts), --seq_len/2 new tokens, with whether the
tokens agree; (3) masked diffusion (block length 32, one token per step or threshold 0.9, no stop at eos)
without a cache and with Fast-dLLM's prefix and dual caches, at --seq_len/2 and --seq_len new tokens, batch
1: tokens/s, forwards, and the share of tokens equal to the uncached sampler's (with --ckpt, also over a
batch of all 8 prompts); no warmup there (these runs are long and need no compiling); (4) block diffusion
(block 4 unless the checkpoint has one; shift and mask token from the checkpoint, else shifted, the last
embedding row) with and without its KV cache, and compiled, at several thresholds, --seq_len/2 tokens; (5)
the same sampler on a batch of --batch_size ragged prompts that stops at the checkpoint's eos: tokens per
forward counted per row (each row's tokens up to its eos over the forwards it needed: what it would get
decoded alone) against the batch's figure (N new tokens over the batched forwards, which wait for the
slowest row and count tokens after eos), and tokens/s up to each row's eos against raw (every slot of the
batch). Random weights give near-uniform predictions, so every threshold commits one token per round there
and the caches' agreement is that of a model without preferences: use --ckpt for meaningful tokens per
forward and agreement. On a machine shared with other jobs, run with OMP_NUM_THREADS=1 (two threads that
wait on each other under load can be 20x slower) and compare within a table, not across runs.

--what cache: Fast-dLLM's approximate caches on a TRAINED masked-diffusion DLM of the exact-answer world (--ckpt,
--data: worlds/tasks.py's output): every held-out prompt decoded by tasks.exact_match with cache none / prefix / dual,
interleaved, for one block and for blocks of 4, at threshold 0.9 and 1: exact match per family, the share of
answers identical to the uncached sampler's, tokens per forward, tokens/s. What the caches cost in answers, where
random weights (--what sample) can only show what they gain in speed.
Example: python -m benchmarks.bench --what cache --ckpt out/tasks/align --data data/tasks --batch_size 64

Examples: python -m benchmarks.bench --what sample --ckpt out/ar-tiny
          python -m benchmarks.bench --what sample --preset mid --compile --iters 1
          python -m benchmarks.bench --what sample --ckpt out/align --data data/stdlib --no_hf   # the caches' agreement
"""
import statistics
from types import SimpleNamespace

import torch

from model import Qwen3
from benchmarks.common import build_hf, build_ours, machine
from benchmarks.common import race as common_race


def sample_model(args, device, dtype):
    """--ckpt's trained weights, or --preset's random ones (seed 0), for inference."""
    if args.ckpt:
        return Qwen3.from_pretrained(args.ckpt, device=device, dtype=dtype).eval()
    return build_ours(args.preset, device, dtype).eval()


def hf_generator(model, device, dtype):
    """-> generate(prompts, n): transformers' greedy generate(do_sample=False) of n tokens on a Qwen3ForCausalLM
    holding model's weights, the prompts left-padded as ar_generate pads them (the padding is made here, outside
    what a timing of the returned function measures); no end-of-sequence stop, so it runs the full length."""
    from sample import ar_generate
    hf = build_hf(model, device, dtype).eval()
    hf.generation_config.eos_token_id = None
    inputs = {}

    def generate(prompts, n):
        key = tuple(map(tuple, prompts))
        if key not in inputs:  # the left-padded prompts and their attention mask, as ar_generate lays them out
            pad = ar_generate(model, prompts, 1)
            inputs[key] = pad.tokens[:, :pad.start], (torch.arange(pad.start, device=device) >=
                                                      (pad.start - pad.prompt_lens)[:, None]).long()
        x, real = inputs[key]
        out = hf.generate(input_ids=x, attention_mask=real, max_new_tokens=n, do_sample=False, pad_token_id=0,
                          repetition_penalty=1.0)  # plain greedy, whatever a generation_config.json says
        return SimpleNamespace(generated=out[:, x.shape[1]:])
    return generate


def random_prompts(vocab_size):
    """8 prompts of random ids below min(256, vocab_size), ragged (16, 9, 12, 16, 5, 16, 11, 3 tokens: left-padded
    in a batch)."""
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, min(256, vocab_size), (n,), generator=g).tolist() for n in (16, 9, 12, 16, 5, 16, 11, 3)]


def bench_sample(args, device, dtype):
    from sample import ar_generate, block_generate, diffusion_generate
    from worlds.tasks import throughput
    model = sample_model(args, device, dtype)
    c, iters = model.config, args.iters or 3
    if args.data:  # real prompts: the first 16 tokens of validation documents, from their first function
        from lib import data
        from lib import training
        tok = training.load_tokenizer(args.ckpt, c)
        prompts = data.code_prompts(data.load_split(args.data, "val"), tok, 8, 16)
    else:
        prompts = random_prompts(c.vocab_size)

    def race(runs, warmup=1):
        return common_race(runs, iters, warmup)

    def same(a, b):  # the share of generated tokens two runs agree on
        return (a.generated == b.generated).double().mean().item()

    src = args.ckpt or f"preset {args.preset} ({model.num_params() / 1e6:.1f}M params), random weights"
    print(f"{machine(device)}; dtype {str(dtype).removeprefix('torch.')}; {src}; "
          f"{'validation' if args.data else 'random'} prompts; median of {iters} after 1 warmup, interleaved\n")
    print("AR greedy, batch 1, 16-token prompt: static KV cache vs recomputing the whole sequence per token\n")
    print("| new tokens | cached tokens/s | recompute tokens/s | cached speed-up | tokens per forward | same tokens |")
    print("|---|---|---|---|---|---|")
    for n in (args.seq_len // 4, args.seq_len // 2, args.seq_len):
        r = race({c_: (lambda c_=c_: ar_generate(model, prompts[:1], n, use_cache=c_)) for c_ in (True, False)})
        (tc, cached), (tr, recomputed) = r[True], r[False]
        print(f"| {n} | {n / tc:,.0f} | {n / tr:,.0f} | {tr / tc:.2f}x | {cached.tokens_per_forward.mean():.2f} | "
              f"{'yes' if torch.equal(cached.tokens, recomputed.tokens) else 'NO'} |")

    n = args.seq_len // 2
    runs = {"ours": lambda B: ar_generate(model, prompts[:B], n)}
    if args.compile:
        runs["ours compiled"] = lambda B: ar_generate(model, prompts[:B], n, compile=True)
    if not args.no_hf:
        hf_generate = hf_generator(model, device, dtype)
        runs["transformers"] = lambda B: hf_generate(prompts[:B], n)
    against = ", vs transformers generate(do_sample=False) on the same weights" * (not args.no_hf)
    print(f"\nAR greedy, {n} new tokens: ours (static cache), eager{' and compiled' * args.compile}{against}; "
          "batch > 1: ragged prompts, left-padded; a compiled run's first (warmup) call compiles\n")
    names = list(runs)
    head = "| batch | " + " | ".join(f"{k} tokens/s" for k in names) + " |"
    if "ours compiled" in runs:
        head += " compiled / eager |"
    if "transformers" in runs:
        head += " " + " | ".join(f"{k} / HF" for k in names[:-1]) + " |"
    print(head + " same tokens as eager |\n" + "|---" * (head.count("|")) + "|")
    for B in sorted({1, args.batch_size}):
        r = race({k: (lambda fn=fn: fn(B)) for k, fn in runs.items()})
        t = {k: v[0] for k, v in r.items()}
        line = f"| {B} | " + " | ".join(f"{B * n / t[k]:,.0f}" for k in names) + " |"
        if "ours compiled" in runs:
            line += f" {t['ours'] / t['ours compiled']:.2f}x |"
        if "transformers" in runs:
            line += " " + " | ".join(f"{t['transformers'] / t[k]:.2f}x" for k in names[:-1]) + " |"
        agree = [f"{k} {int((r[k][1].generated == r['ours'][1].generated).all(1).sum())}/{B}" for k in names[1:]]
        print(line + (f" {', '.join(agree)} rows |" if agree else " - |"))

    mask = c.mask_token_id if c.mask_token_id is not None else c.vocab_size - 1
    shift = c.shift if c.shift is not None else True
    bl = 32
    B = len(prompts)
    print(f"\nMasked diffusion (LLaDA), batch 1, block length {bl}, shift {shift}: Fast-dLLM's approximate KV cache "
          "(refreshed at each block's first step) against none; one token per step (steps = new tokens) or "
          "threshold 0.9; no stop at eos; the forwards are the same for all three; same tokens: the share of "
          "generated tokens equal to none's"
          + f", and (--ckpt) over a batch of all {B} prompts" * bool(args.ckpt) + "\n")
    head = "| new tokens | decoding | cache | tokens/s | forwards | speed-up vs none | same tokens as none |"
    head += f" same tokens, {B} prompts |" * bool(args.ckpt)
    print(head + "\n" + "|---" * (head.count("|") - 1) + "|")
    for n in (args.seq_len // 2, args.seq_len):
        for thr in (None, 0.9):
            kw = dict(threshold=thr, mask_token_id=mask, shift=shift)
            runs = {k: (lambda p, k=k: diffusion_generate(model, p, n, min(bl, n), n, cache=k, **kw))
                    for k in ("none", "prefix", "dual")}
            r = race({k: (lambda fn=fn: fn(prompts[:1])) for k, fn in runs.items()}, warmup=0)
            batch = {k: fn(prompts) for k, fn in runs.items()} if args.ckpt else {}
            for k, (t, g) in r.items():
                line = (f"| {n} | {'1 token/step' if thr is None else f'threshold {thr}'} | {k} | {n / t:,.0f} | "
                        f"{g.nfe} | {r['none'][0] / t:.2f}x | {same(g, r['none'][1]):.1%} |")
                print(line + (f" {same(batch[k], batch['none']):.1%} |" if batch else ""))

    bs, n = c.block_size or 4, args.seq_len // 2
    runs = {"cached": dict(), "recompute": dict(use_cache=False)}
    if args.compile:
        runs["cached, compiled"] = dict(compile=True)
    print(f"\nBlock diffusion, batch 1, {n} tokens, block {bs}, shift {shift}: KV cache vs recomputing everything "
          f"each round{', eager and compiled' * args.compile}\n")
    head = "| threshold | " + " | ".join(f"{k} tokens/s" for k in runs) + " | cached speed-up |"
    head += " compiled / eager |" * args.compile
    print(head + " tokens per forward | same tokens |\n" + "|---" * (head.count("|") + 1) + "|")
    for thr in (0.5, 0.7, 0.9, 1.01):
        kw = dict(block_size=bs, threshold=thr, mask_token_id=mask, shift=shift)
        r = race({k: (lambda v=v: block_generate(model, prompts[:1], n, **v, **kw)) for k, v in runs.items()})
        t, g = {k: v[0] for k, v in r.items()}, r["cached"][1]
        line = f"| {thr} | " + " | ".join(f"{n / t[k]:,.0f}" for k in runs)
        line += f" | {t['recompute'] / t['cached']:.2f}x |"
        if args.compile:
            line += f" {t['cached'] / t['cached, compiled']:.2f}x |"
        agree = all(torch.equal(g.tokens, v[1].tokens) for v in r.values())
        print(line + f" {g.tokens_per_forward.mean():.2f} | {'yes' if agree else 'NO'} |")

    B = min(args.batch_size, B)
    print(f"\nBlock diffusion, batch {B} (ragged prompts, left-padded), {n} tokens, block {bs}, stopping at eos "
          f"{c.eos_token_id}, with the KV cache: tokens per forward per row (each row's tokens up to its eos / the "
          "forwards it needed) and per batch (N / batched forwards); tokens/s up to each row's eos and raw\n")
    print("| threshold | per-row tokens per forward: mean (min-max) | batch tokens per forward | forwards a row "
          "| batched forwards | tokens/s up to eos | raw tokens/s |")
    print("|---|---|---|---|---|---|---|")
    for thr in (0.5, 0.7, 0.9):
        kw = dict(block_size=bs, threshold=thr, mask_token_id=mask, shift=shift, eos_id=c.eos_token_id)
        t, g = race({"batch": lambda: block_generate(model, prompts[:B], n, **kw)})["batch"]
        s = throughput([g], t)
        print(f"| {thr} | {s['tokens_per_forward']:.2f} ({s['tokens_per_forward_min']:.2f}-"
              f"{s['tokens_per_forward_max']:.2f}) | {n / g.nfe:.2f} | {s['forwards_per_row']:.1f} | {g.nfe} | "
              f"{s['tokens_per_s']:,.0f} | {s['raw_tokens_per_s']:,.0f} |")


def bench_cache(args, device, dtype):
    """Fast-dLLM's approximate caches on a trained masked-diffusion DLM of the exact-answer world: what they cost in
    answers, next to what they gain in speed. Every held-out prompt of --data (worlds/tasks.py's heldout.jsonl) decoded
    greedily by tasks.exact_match with cache none / prefix / dual, run interleaved --iters times (tokens/s: the
    median; it includes exact_match's tokenizing and checking, the same for every cache), for one block holding the
    whole answer (prefix and dual coincide: nothing follows it) and blocks of 4, at threshold 0.9 and 1 (beyond the
    most confident token only those of probability 1.0 commit: in practice one token a forward). 'same answers':
    the share of the last run's completions identical to the first uncached run's (for none: the sampler is
    deterministic)."""
    from worlds import tasks
    from lib import training
    if not (args.ckpt and args.data):
        raise SystemExit("bench: --what cache needs --ckpt (a masked-diffusion DLM) and --data (worlds.tasks' output)")
    model = Qwen3.from_pretrained(args.ckpt, device=device, dtype=dtype).eval()
    if model.config.attn != "bidirectional":
        raise SystemExit(f"bench: {args.ckpt} is a {model.config.attn} model; the caches are masked diffusion's")
    tok = training.load_tokenizer(args.ckpt, model.config)
    items, iters = tasks.heldout_items(args.data, model.config, args.ckpt, "bench"), args.iters or 3
    print(f"{machine(device)}; {args.ckpt}; {len(items)} held-out prompts, batches of {args.batch_size}; tokens/s: "
          f"median of {iters}, interleaved\n")
    fams = list(dict.fromkeys(it["family"] for it in items))
    head = ("| block length | threshold | cache | " + " | ".join(fams) + " | exact match | same answers as none | "
            "tokens per forward | forwards a row | tokens/s | speed-up vs none |")
    print(head + "\n" + "|---" * (head.count("|") - 1) + "|")
    for bl in (None, 4):
        for thr in (0.9, 1.0):
            speed, res = {k: [] for k in ("none", "prefix", "dual")}, {}
            for i in range(iters):
                for k in speed:
                    res[k] = tasks.exact_match(model, tok, items, batch_size=args.batch_size, threshold=thr,
                                               block_length=bl, cache=k)
                    speed[k].append(res[k]["tokens_per_s"])
                if i == 0:
                    first_none = res["none"]["rows"]
            for k, r in res.items():
                same = statistics.mean(a["completion"] == b["completion"] for a, b in zip(r["rows"], first_none))
                med = statistics.median(speed[k])
                print(f"| {bl or 'the answer (one block)'} | {thr:g} | {k} | "
                      + " | ".join(f"{r['families'][f]['accuracy']:.3f}" for f in fams)
                      + f" | {r['accuracy']:.3f} | {same:.1%} | {r['tokens_per_forward']:.2f} | "
                      f"{r['forwards_per_row']:.2f} | {med:,.0f} | {med / statistics.median(speed['none']):.2f}x |")
