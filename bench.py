"""
Benchmarks, printed as markdown tables. Speed is measured here, never asserted in the tests.

--what model (the default): one training step (forward, cross-entropy against random targets, backward)
of our Qwen3 against transformers' Qwen3ForCausalLM (attn_implementation="sdpa") holding the SAME
weights, at the same (batch, seq_len), causal attention. The two run interleaved (ours, HF, ours, HF, ...)
so that noise from other processes on the machine hits both alike. How to read the table:

- ms/step is the median over --iters steps after --warmup; tokens/s = batch * seq_len / that median;
- "ours / HF (time)" below 1.00x means ours is faster; on a shared CPU, differences under ~10% are noise,
  so run it twice before believing one;
- on CUDA: MFU against the GPU's dense bf16 peak (training.peak_flops), and peak GiB = the model's own
  weights + the most memory a step allocated above what was resident before it (activations, gradients),
  i.e. about what that model alone would need. --grad_checkpoint shows the activation saving, e.g.
  `python bench.py --preset qwen3-0.6b --seq_len 4096 --batch_size 1 --grad_checkpoint` on a GPU.
- --compile adds a row for torch.compile(ours) (its first warmup step includes compilation).

Example: python bench.py --preset tiny --batch_size 8 --seq_len 256

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
--data: tasks.py's output): every held-out prompt decoded by tasks.exact_match with cache none / prefix / dual,
interleaved, for one block and for blocks of 4, at threshold 0.9 and 1: exact match per family, the share of
answers identical to the uncached sampler's, tokens per forward, tokens/s. What the caches cost in answers, where
random weights (--what sample) can only show what they gain in speed.
Example: python bench.py --what cache --ckpt out/tasks/align --data data/tasks --batch_size 64

--what align: one align.py training step for λ = 0 (the "AR fine-tuning" baseline: no teacher), λ = 10, and
λ = 10 with embed+mlp frozen (shared with the teacher), interleaved; step-time ratios against λ = 0 (the
teacher's forward is the overhead) and the throughput gain from freezing. On a GPU:
`python bench.py --what align --preset qwen3-0.6b --seq_len 2048 --batch_size 1` adds MFU and peak memory.

Examples: python bench.py --what sample --ckpt out/ar-tiny
          python bench.py --what sample --preset mid --compile --iters 1
          python bench.py --what sample --ckpt out/align --data data/stdlib --no_hf   # the caches' agreement

--what distill: one distill.py iteration on --preset's random weights (OPDLM's student: block 4, unshifted;
the teacher a second copy), batch --batch_size, 16-token prompts, a --seq_len-token rollout at threshold 0.9,
temperature 1.0, no end-of-sequence token: the time of the rollout, the teacher's forward and the student's
update (forward, backward, AdamW). Then, on one rollout batch, the vectorised student forward over
[prompt, x0, xt] against the one-forward-per-block reference (diffusion.per_block_logits), interleaved, with
their losses (equal up to rounding). Random weights commit one token per round, so the rollout is the slowest
case (seq_len forwards). On a GPU: `python bench.py --what distill --preset qwen3-0.6b --seq_len 512
--batch_size 1` (the Qwen3-0.6B shape, rollout 512).

--what gpu_check (what `bash gpu_check.sh` runs): what only a GPU can measure, at Qwen3-0.6B's shape (random bf16
weights) with fixed settings (GPU_CHECK), in ONE table printed a row at a time: (1) forward + backward, ours
against transformers, with and without gradient checkpointing, and ours compiled: tokens/s, MFU, peak memory;
(2) one align.py step, λ = 0 and λ = 10; (3) one distill.py iteration, eager and compiled (FlexAttention), and
FlexAttention's loss against the dense mask's; (4) greedy AR decoding at batch 1 and 8, transformers' generate, our
ar_generate eager and compiled (CUDA graphs), and the HBM-bandwidth roofline; (5) the block sampler, eager and
compiled. No check starts after 6 minutes (its row says so). `--device cpu --tiny` runs the same code at the micro
preset in seconds; rows that need CUDA print "skipped (CPU)". Exit status 1 if a check failed (its row says FAILED
or NOT EQUAL).
"""
import contextlib
import gc
import os
import statistics
import tempfile
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from model import PRESETS, Qwen3, Qwen3Config
from cli import parser
from training import mfu, peak_flops, setup


# the presets, and a mid-size shape for CPU timing: the tiny teacher's vocabulary, hidden 512, 8 layers (26M params)
SHAPES = {**PRESETS, "mid": dict(PRESETS["tiny"], hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                                 num_attention_heads=8, num_key_value_heads=4, head_dim=64)}


def timeit(fn, warmup, iters):
    """Median seconds of fn() over iters calls after warmup calls, synchronising CUDA around each."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@contextlib.contextmanager
def peak_memory(device):
    """Inside: out = {}; at exit out["peak"] is the most memory allocated inside above what was resident at entry
    (CUDA; None elsewhere)."""
    cuda, out = device.type == "cuda", {}
    if cuda:
        resident = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    try:
        yield out
    finally:
        out["peak"] = torch.cuda.max_memory_allocated(device) - resident if cuda else None


def measure(fn, device, warmup=0, iters=1):
    """-> (median seconds of fn() over iters calls after warmup calls, the most memory the calls allocated above
    what was resident before them: on CUDA, else None)."""
    with peak_memory(device) as mem:
        t = timeit(fn, warmup, iters)
    return t, mem["peak"]


def nbytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())  # a tied matrix once


def machine(device):
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"CPU, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    return f"machine: {where}; torch {torch.__version__}"


# ---- --what model --------------------------------------------------------------------------------

def build_ours(preset, device, dtype):
    """Our model of the preset's shape in `dtype` directly on `device` (no fp32 copy first, so big presets fit),
    random weights (seed 0), in training mode."""
    torch.set_default_dtype(dtype)
    with torch.device(device):
        model = Qwen3(Qwen3Config(**SHAPES[preset]))
    torch.set_default_dtype(torch.float32)
    return model.init_weights(seed=0).train()


def meta_model(preset):
    """The preset's model on the meta device: its shapes, no memory."""
    with torch.device("meta"):
        return Qwen3(Qwen3Config(**SHAPES[preset]))


def build_hf(ours, device, dtype):
    """transformers' Qwen3ForCausalLM holding our weights: saved by us, loaded by it."""
    import transformers
    with tempfile.TemporaryDirectory() as tmp:
        ours.save_pretrained(tmp)
        hf = transformers.Qwen3ForCausalLM.from_pretrained(tmp, attn_implementation="sdpa", dtype=dtype)
    return hf.to(device).train()


def train_step(model, forward, targets):
    """forward() -> logits; cross-entropy (fp32) against targets, backward, gradients dropped."""
    logits = forward()
    F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1)).backward()
    model.zero_grad(set_to_none=True)


def bench_model(args, device, dtype):
    ours = build_ours(args.preset, device, dtype)
    B, T, V = args.batch_size, args.seq_len, ours.config.vocab_size
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, V, (B, T), generator=g).to(device)
    targets = torch.randint(0, V, (B, T), generator=g).to(device)

    rows = {"ours": (ours, lambda: ours(idx, attn="causal"))}
    if args.compile:
        compiled = torch.compile(ours)
        rows["ours (compiled)"] = (ours, lambda: compiled(idx, attn="causal"))
    if not args.no_hf:
        hf = build_hf(ours, device, dtype)
        rows["transformers (sdpa)"] = (hf, lambda: hf(input_ids=idx, use_cache=False).logits)
    if args.grad_checkpoint:
        ours.model.gradient_checkpointing = True
        if not args.no_hf:
            hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    cuda = device.type == "cuda"
    times = {name: [] for name in rows}
    peaks = {name: 0 for name in rows}
    for i in range(args.warmup + args.iters):  # interleaved: every round runs each model once
        for name, (model, forward) in rows.items():
            t, peak = measure(lambda: train_step(model, forward, targets), device)
            if i >= args.warmup:
                times[name].append(t)
                peaks[name] = max(peaks[name], peak or 0)

    print(f"{machine(device)}; dtype {str(dtype).removeprefix('torch.')}")
    print(f"preset {args.preset} ({ours.num_params() / 1e6:.1f}M params), batch {B} x seq_len {T}, "
          f"forward + backward, causal, median of {args.iters} after {args.warmup} warmup, interleaved"
          + (", gradient checkpointing" if args.grad_checkpoint else "") + "\n")
    head = "| model | ms/step | tokens/s |" + (" MFU | peak GiB |" if cuda else "")
    print(head + "\n" + "|---" * (head.count("|") - 1) + "|")
    median = {name: statistics.median(ts) for name, ts in times.items()}
    for name, (model, _) in rows.items():
        tok_s = B * T / median[name]
        line = f"| {name} | {median[name] * 1e3:.1f} | {tok_s:,.0f} |"
        if cuda:
            u = mfu(ours, tok_s, T, device)
            line += f" {'n/a' if u is None else f'{u:.1%}'} | {(nbytes(model) + peaks[name]) / 2**30:.2f} |"
        print(line)
    if "transformers (sdpa)" in median:
        ratio = median["ours"] / median["transformers (sdpa)"]
        print(f"| ours / HF (time) | {ratio:.2f}x |" + " |" * (head.count("|") - 3))


# ---- --what sample -------------------------------------------------------------------------------

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
        out = hf.generate(input_ids=x, attention_mask=real, max_new_tokens=n, do_sample=False, pad_token_id=0)
        return SimpleNamespace(generated=out[:, x.shape[1]:])
    return generate


def random_prompts(vocab_size):
    """8 prompts of random ids below min(256, vocab_size), ragged (16, 9, 12, 16, 5, 16, 11, 3 tokens: left-padded
    in a batch)."""
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, min(256, vocab_size), (n,), generator=g).tolist() for n in (16, 9, 12, 16, 5, 16, 11, 3)]


def bench_sample(args, device, dtype):
    from sample import ar_generate, block_generate, diffusion_generate, throughput
    model = sample_model(args, device, dtype)
    c, iters = model.config, args.iters or 3
    if args.data:  # real prompts: the first 16 tokens of validation documents, from their first function
        import data
        import training
        tok = training.load_tokenizer(args.ckpt, c)
        prompts = data.code_prompts(data.load_split(args.data, "val"), tok, 8, 16)
    else:
        prompts = random_prompts(c.vocab_size)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def race(runs, warmup=1):
        """runs: {name: fn -> Generation}, run interleaved -> {name: (median seconds, last Generation)}."""
        times, out = {k: [] for k in runs}, {}
        for i in range(warmup + iters):
            for k, fn in runs.items():
                sync()
                t0 = time.perf_counter()
                out[k] = fn()
                sync()
                if i >= warmup:
                    times[k].append(time.perf_counter() - t0)
        return {k: (statistics.median(times[k]), out[k]) for k in runs}

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


# ---- --what cache --------------------------------------------------------------------------------

def bench_cache(args, device, dtype):
    """Fast-dLLM's approximate caches on a trained masked-diffusion DLM of the exact-answer world: what they cost in
    answers, next to what they gain in speed. Every held-out prompt of --data (tasks.py's heldout.jsonl) decoded
    greedily by tasks.exact_match with cache none / prefix / dual, run interleaved --iters times (tokens/s: the
    median; it includes exact_match's tokenizing and checking, the same for every cache), for one block holding the
    whole answer (prefix and dual coincide: nothing follows it) and blocks of 4, at threshold 0.9 and 1 (beyond the
    most confident token only those of probability 1.0 commit: in practice one token a forward). 'same answers':
    the share of the last run's completions identical to the first uncached run's (for none: the sampler is
    deterministic)."""
    import tasks
    import training
    if not (args.ckpt and args.data):
        raise SystemExit("bench: --what cache needs --ckpt (a masked-diffusion DLM) and --data (tasks.py's output)")
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


# ---- --what align --------------------------------------------------------------------------------

def align_step(preset, device, dtype, B, T, lam, freeze=()):
    """-> (step, training FLOPs per token): step() runs one REPR-ALIGN training step (corrupt, student forward on
    xt, teacher forward on x0, backward, AdamW) on random x0 (B, T), for a student of the preset's shape (random
    weights) and, for lam > 0, its frozen teacher (an equal copy, as after convert.py; frozen groups shared)."""
    import align
    import diffusion
    from training import configure_optimizer, flops_per_token
    student = build_ours(preset, device, dtype)  # same seed: student and teacher start equal, as after convert.py
    c = student.config
    c.attn, c.mask_token_id, c.shift = "bidirectional", c.vocab_size - 1, True  # the last row: never a token
    student.freeze(list(freeze))
    teacher = None
    if lam:
        teacher = align.share_frozen(student, build_ours(preset, device, dtype).requires_grad_(False).eval())
    opt = configure_optimizer(student, 1e-4, 0.1, device_type=device.type)
    layers = list(range(c.num_hidden_layers + 1))
    g = torch.Generator(device).manual_seed(0)

    def step():
        x0 = torch.randint(0, c.vocab_size - 1, (B, T), device=device, generator=g)
        noise = diffusion.corrupt(x0, c.mask_token_id, c.shift, g, 1 / 500)  # align.py's --eps
        loss, _ = align.loss_step(student, teacher, x0, *noise, layers=layers, lambda_align=lam)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, flops_per_token(student, T, forward_only=teacher)


def bench_align(args, device, dtype):
    """One REPR-ALIGN training step for lambda = 0, lambda = 10, and lambda = 10 with embed+mlp frozen (shared with
    the teacher), interleaved."""
    B, T = args.batch_size, args.seq_len
    variants = {"λ=0 (AR fine-tuning)": (0.0, []), "λ=10": (10.0, []),
                "λ=10, freeze embed,mlp": (10.0, ["embed", "mlp"])}
    steps = {k: align_step(args.preset, device, dtype, B, T, lam, freeze) for k, (lam, freeze) in variants.items()}
    cuda = device.type == "cuda"
    times, peaks = {k: [] for k in steps}, {k: 0 for k in steps}
    for i in range(args.warmup + args.iters):  # interleaved
        for name, (step, _) in steps.items():
            resident = torch.cuda.memory_allocated(device) if cuda else 0
            t, peak = measure(step, device)
            if i >= args.warmup:
                times[name].append(t)
                peaks[name] = max(peaks[name], resident + (peak or 0))
    print(f"{machine(device)}; dtype {str(dtype).removeprefix('torch.')}")
    print(f"preset {args.preset}, batch {B} x seq_len {T}, one align.py training step, median of {args.iters} "
          f"after {args.warmup} warmup, interleaved (all variants' models stay resident on the device)\n")
    head = "| variant | ms/step | tokens/s | step time vs λ=0 |" + (" MFU | peak GiB (all resident) |" if cuda else "")
    print(head + "\n" + "|---" * (head.count("|") - 1) + "|")
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["λ=0 (AR fine-tuning)"]
    for name, (_, fpt) in steps.items():
        line = f"| {name} | {med[name] * 1e3:.1f} | {B * T / med[name]:,.0f} | {med[name] / base:.2f}x |"
        if cuda:
            peak = peak_flops(device)
            util = "n/a" if peak is None else f"{fpt * B * T / med[name] / peak:.1%}"
            line += f" {util} | {peaks[name] / 2**30:.2f} |"
        print(line)
    print(f"\nfreezing embed+mlp: {med['λ=10'] / med['λ=10, freeze embed,mlp']:.2f}x the throughput of λ=10 unfrozen")


# ---- --what distill ------------------------------------------------------------------------------

@contextlib.contextmanager
def student_mask(how):
    """Inside: distill.py's vectorised student forward (diffusion.block_logits) attends through a dense (B, 1, T, T)
    mask (how="dense") or a FlexAttention BlockMask ("flex") on any device; otherwise as distill.py chooses
    (FlexAttention on CUDA, the dense mask elsewhere)."""
    import diffusion
    train_mask = diffusion.train_mask
    if how in ("dense", "flex"):
        diffusion.train_mask = lambda real, N, bs, flex=False: train_mask(real, N, bs, flex=how == "flex")
    try:
        yield
    finally:
        diffusion.train_mask = train_mask


class DistillRun:
    """distill.py's iteration on the preset's random weights: OPDLM's student (block 4, unshifted) and its teacher
    (a second copy), B 16-token prompts, N-token rollouts at distill.py's threshold and temperature, no
    end-of-sequence token (the mask id is never sampled), so every rollout runs the full N tokens. Random weights
    commit one token per round: the rollout is the slowest case (N forwards)."""

    def __init__(self, preset, device, dtype, B, N, bs=4):
        import distill
        from training import configure_optimizer
        self.distill, self.N, self.bs = distill, N, bs
        self.student = build_ours(preset, device, dtype)
        self.teacher = build_ours(preset, device, dtype).requires_grad_(False).eval()
        c = self.student.config
        c.attn, c.block_size, c.mask_token_id, c.shift = "block", bs, c.vocab_size - 1, False  # OPDLM's student
        self.eos_id, self.vocab = c.mask_token_id, c.vocab_size - 1
        self.hp = distill.p.parse_args([])
        self.opt = configure_optimizer(self.student, 1e-4, 0.1, device_type=device.type)
        self.gen = torch.Generator(device).manual_seed(0)
        self.items = [(torch.randint(0, self.vocab, (16,), generator=self.gen, device=device).tolist(), [])
                      for _ in range(B)]

    def rollout(self):
        """-> (x, lens, P, masked): a rollout batch and its on-policy states (distill.make_batch)."""
        self.student.eval()
        batch = self.distill.make_batch(self.student, self.items, self.N, "on", self.gen, eos_id=self.eos_id,
                                        vocab_limit=self.vocab, threshold=self.hp.threshold,
                                        temperature=self.hp.temperature)[:4]
        self.student.train()
        return batch

    def loss(self, batch, how="auto"):
        """distill_loss on a rollout batch. how: "auto" (distill.py's vectorised forward), "dense" or "flex" (the
        vectorised forward with that mask, student_mask), "per-block" (the one-forward-per-block reference)."""
        with student_mask(how):
            return self.distill.distill_loss(self.student, self.teacher, *batch, eos_id=self.eos_id,
                                             vocab_size=self.vocab, vectorised=how != "per-block")[0]

    def update(self, batch, how="auto"):
        """The student's training step on a batch: loss (the teacher's forward included), backward, AdamW. -> loss"""
        loss = self.loss(batch, how)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()


def bench_distill(args, device, dtype):
    """One distill.py iteration (rollout, teacher forward, student forward + backward + AdamW) with its time
    split, then the vectorised student forward against the per-block reference on one batch, interleaved."""
    import distill
    B, N = args.batch_size, args.seq_len
    run = DistillRun(args.preset, device, dtype, B, N)
    t_teach, teacher_logits = [0.0], distill.teacher_logits

    def timed_teacher(*a, out=[]):  # distill_loss calls it by its module-level name
        t_teach[0] += timeit(lambda: out.append(teacher_logits(*a)), 0, 1)
        return out.pop()
    distill.teacher_logits = timed_teacher
    split = {"rollout": [], "teacher forward": [], "student forward + backward + AdamW": []}
    got = {}
    for i in range(args.warmup + args.iters):
        t_roll = timeit(lambda: got.update(batch=run.rollout()), 0, 1)
        t_teach[0] = 0.0
        t_upd = timeit(lambda: run.update(got["batch"]), 0, 1)
        if i >= args.warmup:
            for k, v in zip(split, (t_roll, t_teach[0], t_upd - t_teach[0])):
                split[k].append(v)
    batch, t_vec = run.rollout(), {"auto": [], "per-block": []}
    if device.type == "cuda":  # the vectorised forward uses FlexAttention there; time the dense mask too
        t_vec["dense"] = []
    loss = {v: run.loss(batch, v).item() for v in t_vec}
    for grp in run.opt.param_groups:  # lr 0 (AdamW's decay is scaled by it too): both time the same weights
        grp["lr"] = 0.0
    for i in range(args.warmup + args.iters):  # interleaved
        for v in t_vec:
            t_teach[0] = 0.0
            t = timeit(lambda: run.update(batch, v), 0, 1)
            if i >= args.warmup:
                t_vec[v].append(t - t_teach[0])  # the student's part: the teacher's forward is the same in both
    distill.teacher_logits = teacher_logits
    med = {k: statistics.median(v) for k, v in split.items()}
    total = sum(med.values())
    print(f"{machine(device)}; dtype {str(dtype).removeprefix('torch.')}; preset {args.preset}, random weights")
    print(f"one distill.py iteration: batch {B}, 16-token prompts, rollout {N} tokens (block {run.bs}, threshold "
          f"{run.hp.threshold}, temperature {run.hp.temperature}), median of {args.iters} after {args.warmup} "
          "warmup\n")
    print("| part | ms | share |\n|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v * 1e3:.1f} | {v / total:.0%} |")
    print(f"| iteration | {total * 1e3:.1f} | {B / total:.2f} sequences/s, {1 / total:.2f} iterations/s |")
    m = {k: statistics.median(v) for k, v in t_vec.items()}
    print(f"\nstudent forward + backward + AdamW on one rollout batch ({int(batch[3].sum())} masked positions), "
          "interleaved\n")
    print("| student training | ms | loss |\n|---|---|---|")
    print(f"| vectorised: one forward over [prompt, x0, xt] | {m['auto'] * 1e3:.1f} | {loss['auto']:.6f} |")
    print(f"| per-block reference: {N // run.bs} forwards | {m['per-block'] * 1e3:.1f} | {loss['per-block']:.6f} |")
    if "dense" in m:
        print(f"| vectorised, dense (B, 1, T, T) mask to SDPA | {m['dense'] * 1e3:.1f} | {loss['dense']:.6f} |")
    how = "the dense mask to SDPA (FlexAttention is used on CUDA only: no backward on CPU)"
    if "dense" in m:
        how = "a FlexAttention BlockMask (the dense-mask row: the same forward with SDPA)"
    print("\nvectorised: " + how)
    print(f"vectorised: {m['per-block'] / m['auto']:.2f}x faster than per-block; |loss difference| "
          f"{abs(loss['auto'] - loss['per-block']):.2e}")


# ---- --what gpu_check ----------------------------------------------------------------------------

# HBM bandwidth in bytes/s (the data sheets' figures) for the decoding roofline; other devices: no roofline
HBM_BANDWIDTH = [("H200", 4.8e12), ("H100", 3.35e12), ("A100", 2.0e12)]
# the fixed settings: Qwen3-0.6B's shape on a GPU; --tiny, the micro preset for a CPU (seconds, one step each).
# train: (batch, seq_len) of parts 1 and 2; steps: (warmup, timed) training steps; distill: (batch, rollout tokens)
# and (warmup, timed) iterations; decode: new tokens and (warmup, timed) generations; budget: no check starts later
GPU_CHECK = {
    "gpu": dict(preset="qwen3-0.6b", train=(4, 2048), steps=(2, 5), distill=(4, 128), distill_iters=(1, 1),
                new_tokens=128, decode_iters=(1, 2), budget=360),
    "tiny": dict(preset="micro", train=(2, 32), steps=(0, 1), distill=(2, 8), distill_iters=(0, 1),
                 new_tokens=8, decode_iters=(0, 1), budget=None),
}
SKIPPED_CPU = "skipped (CPU)"


def hbm_bandwidth(device):
    """-> (bytes/s, the GPU's name) for a GPU in HBM_BANDWIDTH, else (None, None)."""
    if device.type != "cuda":
        return None, None
    name = torch.cuda.get_device_name(device)
    return next(((bw, key) for key, bw in HBM_BANDWIDTH if key in name), (None, None))


class CheckTable:
    """gpu_check's one table, printed a row at a time as each is measured, so a run cut short keeps what it
    printed. run() measures a row, or prints it skipped: on a CPU when the check needs CUDA (FlexAttention's
    compiled kernels, CUDA graphs), and after the time budget; a check that raises is printed as failed (its
    traceback on stderr) and the next goes on."""

    COLUMNS = ("part", "check", "tokens/s", "MFU", "peak GiB", "seconds", "result")

    def __init__(self, device, budget):
        self.device, self.budget, self.t0, self.failed = device, budget, time.perf_counter(), []
        print("| " + " | ".join(self.COLUMNS) + " |\n" + "|---" * len(self.COLUMNS) + "|", flush=True)

    def print(self, part, check, tok_s=None, mfu=None, peak=None, seconds=None, result=""):
        cells = [str(part), check, "-" if tok_s is None else f"{tok_s:,.0f}", "-" if mfu is None else f"{mfu:.1%}",
                 "-" if peak is None else f"{peak / 2**30:.2f}", "-" if seconds is None else f"{seconds:.1f}", result]
        print("| " + " | ".join(cells) + " |", flush=True)

    def run(self, part, check, fn, *, cuda_only=False):
        """fn() -> dict(tok_s=, mfu=, peak= (bytes), result=, ok=) (all optional); -> that dict, or None."""
        if cuda_only and self.device.type != "cuda":
            return self.print(part, check, result=SKIPPED_CPU)
        if self.budget is not None and time.perf_counter() - self.t0 > self.budget:
            return self.print(part, check, result=f"skipped (time budget: {self.budget} s)")
        t0 = time.perf_counter()
        try:
            got = fn()
        except Exception as e:  # a check that fails is a row of the table, not the end of the run
            import traceback
            traceback.print_exc()
            self.failed.append(check)
            release()
            return self.print(part, check, result=f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:150]}")
        if not got.pop("ok", True):
            self.failed.append(check)
        self.print(part, check, **got, seconds=time.perf_counter() - t0)
        return got


def release():
    """Free what the last check left: Python's cycles, dynamo's compiled graphs, CUDA's cached blocks."""
    gc.collect()
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def check_model(table, s, device, dtype):
    """Part 1: forward + backward of ours against transformers' Qwen3ForCausalLM (the same weights), with and
    without gradient checkpointing, and ours compiled. MFU: training.mfu with our FLOP count for both."""
    (B, T), (warmup, iters) = s["train"], s["steps"]
    ours = build_ours(s["preset"], device, dtype)
    hf = build_hf(ours, device, dtype)
    g = torch.Generator().manual_seed(0)
    idx, targets = (torch.randint(0, ours.config.vocab_size, (B, T), generator=g).to(device) for _ in range(2))
    times = {}

    def step(name, model, forward, vs=None):
        def fn():
            t, peak = measure(lambda: train_step(model, forward, targets), device, warmup, iters)
            times[name] = t
            result = "; ".join(f"{t / times[k]:.2f}x the step time of {k}" for k in vs or () if k in times)
            return dict(tok_s=B * T / t, mfu=mfu(ours, B * T / t, T, device), result=result or "-",
                        peak=None if peak is None else nbytes(model) + peak)  # the weights + what a step adds
        return fn
    run_ours, run_hf = (lambda: ours(idx, attn="causal")), (lambda: hf(input_ids=idx, use_cache=False).logits)
    table.run(1, "fwd+bwd: transformers (sdpa)", step("transformers", hf, run_hf))
    table.run(1, "fwd+bwd: ours", step("ours", ours, run_ours, ["transformers"]))
    hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ours.model.gradient_checkpointing = True
    table.run(1, "fwd+bwd: transformers, gradient checkpointing", step("transformers checkpointed", hf, run_hf))
    table.run(1, "fwd+bwd: ours, --grad_checkpoint",
              step("ours checkpointed", ours, run_ours, ["transformers checkpointed", "ours"]))
    ours.model.gradient_checkpointing = False
    compiled = torch.compile(ours)
    table.run(1, "fwd+bwd: ours, --compile", step("ours compiled", ours, lambda: compiled(idx, attn="causal"),
                                                  ["ours", "transformers"]), cuda_only=True)


def check_align(table, s, device, dtype):
    """Part 2: one align.py training step, λ = 0 (no teacher) and λ = 10 (the frozen teacher's forward too), each
    with only its own models on the device; peak: everything that step's run holds (models, AdamW, activations)."""
    (B, T), (warmup, iters) = s["train"], s["steps"]
    times = {}

    def variant(lam):
        def fn():
            with peak_memory(device) as mem:
                step, fpt = align_step(s["preset"], device, dtype, B, T, lam)
                t, _ = measure(step, device, warmup, iters)
            times[lam] = t
            peak = peak_flops(device)
            return dict(tok_s=B * T / t, mfu=None if peak is None else fpt * B * T / t / peak, peak=mem["peak"],
                        result=f"{t / times[0]:.2f}x the step time of λ=0" if lam and 0 in times else "-")
        return fn
    table.run(2, "align.py step: λ=0 (no teacher)", variant(0.0))
    release()
    table.run(2, "align.py step: λ=10 (frozen teacher)", variant(10.0))


def check_distill(table, s, device, dtype):
    """Part 3: one distill.py iteration (rollout, then the student's update with the teacher's forward), eager and
    compiled as distill.py --compile compiles (FlexAttention's kernels on CUDA); the vectorised student loss with a
    FlexAttention BlockMask against the dense mask on one rollout batch (eager, without grad), and the compiled
    training step's first loss on the same batch (before its update) against the same dense loss."""
    (B, N), (warmup, iters) = s["distill"], s["distill_iters"]
    run, times, check = DistillRun(s["preset"], device, dtype, B, N), {}, {}  # check: the batch, the dense loss

    def iteration(name):
        def fn():
            with peak_memory(device) as mem:
                for _ in range(warmup):
                    run.update(run.rollout())
                rolls, updates = [], []
                for _ in range(iters):
                    got = {}
                    rolls.append(timeit(lambda: got.update(batch=run.rollout()), 0, 1))
                    updates.append(timeit(lambda: run.update(got["batch"]), 0, 1))
            t_roll, t_upd = statistics.median(rolls), statistics.median(updates)
            times[name] = t = t_roll + t_upd
            result = f"rollout {t_roll / t:.0%} of the iteration"
            if name != "eager" and "eager" in times:
                result += f"; {t / times['eager']:.2f}x the eager iteration's time"
            return dict(tok_s=B * N / t, peak=mem["peak"], result=result)
        return fn
    table.run(3, "distill.py iteration: eager", iteration("eager"))
    tol = 1e-4 if dtype == torch.float32 else 2e-2  # relative; bf16 keeps 8 bits of mantissa

    def compare(flex):
        diff = abs(flex - check["dense"]) / abs(check["dense"])
        return diff <= tol, f"dense mask {check['dense']:.6f}: relative difference {diff:.1e} " \
                            f"({'equal' if diff <= tol else 'NOT EQUAL'} within {tol:g})"

    def same_loss():  # eager, no grad: FlexAttention's forward runs (unfused) on a CPU too
        check["batch"] = run.rollout()
        with torch.no_grad():
            flex, check["dense"] = (run.loss(check["batch"], how).item() for how in ("flex", "dense"))
        ok, result = compare(flex)
        return dict(ok=ok, result=f"FlexAttention {flex:.6f}; {result}")
    table.run(3, "distill loss: FlexAttention = dense mask", same_loss)

    def compiled():
        run.student.model.compile(dynamic=True)  # as distill.py --compile
        run.teacher.model.compile(dynamic=True)
        got = {}
        if "dense" in check:  # the compiled training step's first loss, on the check's batch, before its update
            got["first"] = run.update(check["batch"]).item()
        got.update(iteration("compiled")())
        if "first" in got:
            got["ok"], result = compare(got.pop("first"))
            got["result"] += f"; its FlexAttention loss vs the {result}"
        return got
    table.run(3, "distill.py iteration: --compile (FlexAttention)", compiled, cuda_only=True)


def check_decode(table, s, device, dtype):
    """Part 4: greedy AR decoding, batch 1 and 8 (ragged prompts, left-padded), s["new_tokens"] new tokens, no stop:
    transformers' generate, our ar_generate eager and compiled (CUDA graphs on CUDA), and the bandwidth roofline:
    every step reads every weight once, so at most batch x bandwidth / bytes of the weights tokens/s (the KV cache's
    reads not counted). peak: the model's weights (the same bytes in both) + what a generation adds."""
    from sample import ar_generate
    model, n, (warmup, iters) = build_ours(s["preset"], device, dtype).eval(), s["new_tokens"], s["decode_iters"]
    hf_generate, prompts = hf_generator(model, device, dtype), random_prompts(model.config.vocab_size)
    bandwidth, gpu = hbm_bandwidth(device)
    runs = {"transformers": hf_generate, "eager": lambda p, n: ar_generate(model, p, n),
            "compiled": lambda p, n: ar_generate(model, p, n, compile=True)}
    for B in (1, 8):
        times, out = {}, {}

        def gen(name):
            def go():
                t, peak = measure(lambda: out.update({name: runs[name](prompts[:B], n)}), device, warmup, iters)
                times[name], result = t, "-"
                if name != "transformers" and "transformers" in out:
                    same = (out[name].generated == out["transformers"].generated).all(1).sum()
                    result = f"{times['transformers'] / t:.2f}x transformers' tokens/s; same tokens: {same}/{B} rows"
                return dict(tok_s=B * n / t, peak=None if peak is None else nbytes(model) + peak, result=result)
            return go
        table.run(4, f"AR decode, batch {B}: transformers generate", gen("transformers"))
        table.run(4, f"AR decode, batch {B}: ours, eager", gen("eager"))
        table.run(4, f"AR decode, batch {B}: ours, compiled (CUDA graphs)", gen("compiled"), cuda_only=True)

        def roofline():
            if bandwidth is None:
                return dict(result=f"no HBM bandwidth known for {torch.cuda.get_device_name(device)}")
            best = B * bandwidth / nbytes(model)
            shares = ", ".join(f"{k} {B * n / t / best:.0%}" for k, t in times.items())
            return dict(tok_s=best, result=f"{bandwidth / 1e12:.1f} TB/s assumed ({gpu}), {nbytes(model) / 1e9:.2f} "
                                           f"GB of weights a step; reached: {shares}")
        table.run(4, f"AR decode, batch {B}: roofline (weights / HBM bandwidth)", roofline, cuda_only=True)


def check_block(table, s, device, dtype):
    """Part 5: the block sampler (block_generate, block 4, threshold 0.9, KV cache), batch 1, s["new_tokens"] new
    tokens, eager and compiled (CUDA graphs on CUDA). Random weights commit one token per round (the slowest case)."""
    from sample import block_generate
    model, n, (warmup, iters) = build_ours(s["preset"], device, dtype).eval(), s["new_tokens"], s["decode_iters"]
    c = model.config
    c.attn, c.block_size, c.mask_token_id, c.shift = "block", 4, c.vocab_size - 1, False
    prompts, times, out = random_prompts(c.vocab_size)[:1], {}, {}

    def gen(name, compile):
        def go():
            def fn():
                out[name] = block_generate(model, prompts, n, threshold=0.9, compile=compile)
            t, peak = measure(fn, device, warmup, iters)
            times[name] = t
            result = f"{out[name].tokens_per_forward.mean():.2f} tokens per forward"
            if compile and "eager" in out:
                same = "yes" if torch.equal(out[name].tokens, out["eager"].tokens) else "NO"
                result += f"; {times['eager'] / t:.2f}x eager's tokens/s; same tokens as eager: {same}"
            return dict(tok_s=n / t, peak=None if peak is None else nbytes(model) + peak, result=result)
        return go
    table.run(5, "block sampler, batch 1: eager", gen("eager", False))
    table.run(5, "block sampler, batch 1: compiled (CUDA graphs)", gen("compiled", True), cuda_only=True)


def gpu_check(device, dtype, tiny):
    """What only a GPU can measure, in one table (docs/scale.md, "One GPU check"); exits 1 if a check failed."""
    s = GPU_CHECK["tiny" if tiny else "gpu"]
    (B, T), (w, i), (Bd, N), (dw, di) = s["train"], s["steps"], s["distill"], s["decode_iters"]
    bandwidth, gpu = hbm_bandwidth(device)
    flops = peak_flops(device)
    print(f"{machine(device)}; {str(dtype).removeprefix('torch.')} weights (no autocast); preset {s['preset']} "
          f"({meta_model(s['preset']).num_params() / 1e6:.1f}M parameters), random weights")
    print(f"parts 1-2: batch {B} x {T} tokens, median of {i} steps after {w} warmup; MFU against "
          + ("no known peak" if flops is None else f"{flops / 1e12:.0f} TFLOP/s (dense bf16)"))
    print(f"part 3: batch {Bd}, 16-token prompts, {N}-token rollouts (block 4), median of {s['distill_iters'][1]} "
          f"iterations after {s['distill_iters'][0]} warmup; parts 4-5: {s['new_tokens']} new tokens, median of {di} "
          f"after {dw} warmup")
    print("roofline: " + (f"{bandwidth / 1e12:.1f} TB/s ({gpu})" if bandwidth else "none (no known HBM bandwidth)")
          + "; seconds: the row's wall time, warmup and compilation included\n", flush=True)
    table = CheckTable(device, s["budget"])
    for part in (check_model, check_align, check_distill, check_decode, check_block):
        part(table, s, device, dtype)
        release()
    print(f"\n{time.perf_counter() - table.t0:.0f} s in all")
    if table.failed:
        raise SystemExit(f"gpu check: {len(table.failed)} check(s) failed: {', '.join(table.failed)}")


def main():
    p = parser(__doc__)
    p.add_argument("--what", default="model", choices=["model", "sample", "cache", "align", "distill", "gpu_check"],
                   help="which benchmark to run")
    p.add_argument("--preset", default="tiny", choices=sorted(SHAPES),
                   help="mid: hidden 512, 8 layers, tiny's vocabulary")
    p.add_argument("--batch_size", type=int, default=8, help="sequences per call")
    p.add_argument("--seq_len", type=int, default=256,
                   help="tokens per sequence (sample: the longest generation, also run at 1/4 and 1/2)")
    p.add_argument("--iters", type=int, default=None, help="timed runs of each (the median is reported); default "
                   "10 (model), 3 (sample, cache)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="weights' dtype, same for both models; auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--compile", action="store_true", help="add a row for torch.compile(ours); sample: columns for "
                   "the compiled AR and block samplers")
    p.add_argument("--no_hf", action="store_true", help="skip transformers (two copies of a big model may not fit)")
    p.add_argument("--grad_checkpoint", action="store_true", help="gradient checkpointing in both models")
    p.add_argument("--ckpt", default=None, help="sample: trained weights from this checkpoint instead of "
                   "--preset; cache: the masked-diffusion DLM to measure")
    p.add_argument("--tiny", action="store_true", help="gpu_check: the micro preset, tiny lengths, one step of "
                   "each (a CPU run of the same code in seconds); gpu_check takes no other shape flags")
    p.add_argument("--data", default=None, help="cache: tasks.py's output directory; sample, with --ckpt: "
                   "prompts from this prepared dataset's validation split (the start of its documents' first "
                   "functions) instead of random ids")
    args = p.parse_args()
    if args.iters is not None and args.iters < 1:
        p.error("--iters must be at least 1")
    device, _ = setup(args.device)  # we cast the weights instead of training.py's autocast
    auto = torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = auto if args.dtype == "auto" else getattr(torch, args.dtype)
    if args.what == "model":
        args.iters = args.iters or 10
        bench_model(args, device, dtype)
    elif args.what == "align":
        args.iters = args.iters or 5
        bench_align(args, device, dtype)
    elif args.what == "distill":
        args.iters = args.iters or 3
        bench_distill(args, device, dtype)
    elif args.what == "gpu_check":
        gpu_check(device, dtype, args.tiny)
    elif args.what == "cache":
        bench_cache(args, device, dtype)
    else:
        bench_sample(args, device, dtype)


if __name__ == "__main__":
    main()
