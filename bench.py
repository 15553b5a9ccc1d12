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
"""
import argparse
import os
import statistics
import tempfile
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from model import PRESETS, Qwen3, Qwen3Config
from training import HelpFormatter, mfu, peak_flops, setup


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


def machine(device):
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"CPU, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    return f"machine: {where}; torch {torch.__version__}"


# ---- --what model --------------------------------------------------------------------------------

def build_ours(args, device, dtype):
    """Our model in `dtype` directly on `device` (no fp32 copy first, so big presets fit), random weights."""
    torch.set_default_dtype(dtype)
    with torch.device(device):
        model = Qwen3(Qwen3Config(**SHAPES[args.preset]))
    torch.set_default_dtype(torch.float32)
    return model.init_weights(seed=0).train()


def build_hf(ours, device, dtype):
    """transformers' Qwen3ForCausalLM holding our weights: saved by us, loaded by it."""
    import transformers
    with tempfile.TemporaryDirectory() as tmp:
        ours.save_pretrained(tmp)
        hf = transformers.Qwen3ForCausalLM.from_pretrained(tmp, attn_implementation="sdpa", dtype=dtype)
    return hf.to(device).train()


def bench_model(args, device, dtype):
    ours = build_ours(args, device, dtype)
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

    def train_step(model, forward):
        logits = forward()
        F.cross_entropy(logits.float().view(-1, V), targets.view(-1)).backward()
        model.zero_grad(set_to_none=True)

    cuda = device.type == "cuda"
    times = {name: [] for name in rows}
    peaks = {name: 0 for name in rows}
    for i in range(args.warmup + args.iters):  # interleaved: every round runs each model once
        for name, (model, forward) in rows.items():
            if cuda:
                resident = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
            t = timeit(lambda: train_step(model, forward), warmup=0, iters=1)
            if i >= args.warmup:
                times[name].append(t)
                if cuda:
                    peaks[name] = max(peaks[name], torch.cuda.max_memory_allocated(device) - resident)

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
            weights = sum(p.numel() * p.element_size() for p in model.parameters())
            line += f" {'n/a' if u is None else f'{u:.1%}'} | {(weights + peaks[name]) / 2**30:.2f} |"
        print(line)
    if "transformers (sdpa)" in median:
        ratio = median["ours"] / median["transformers (sdpa)"]
        print(f"| ours / HF (time) | {ratio:.2f}x |" + " |" * (head.count("|") - 3))


# ---- --what sample -------------------------------------------------------------------------------

def sample_model(args, device, dtype):
    """--ckpt's trained weights, or --preset's random ones (seed 0), for inference."""
    if args.ckpt:
        return Qwen3.from_pretrained(args.ckpt, device=device, dtype=dtype).eval()
    torch.set_default_dtype(dtype)
    with torch.device(device):
        model = Qwen3(Qwen3Config(**SHAPES[args.preset])).init_weights(seed=0).eval()
    torch.set_default_dtype(torch.float32)
    return model


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
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, min(256, c.vocab_size), (n,), generator=g).tolist()
                   for n in (16, 9, 12, 16, 5, 16, 11, 3)]  # ragged: left-padded in a batch
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
        (tc, gc), (tr, gr) = r[True], r[False]
        print(f"| {n} | {n / tc:,.0f} | {n / tr:,.0f} | {tr / tc:.2f}x | {gc.tokens_per_forward.mean():.2f} | "
              f"{'yes' if torch.equal(gc.tokens, gr.tokens) else 'NO'} |")

    n = args.seq_len // 2
    runs = {"ours": lambda B: ar_generate(model, prompts[:B], n)}
    if args.compile:
        runs["ours compiled"] = lambda B: ar_generate(model, prompts[:B], n, compile=True)
    if not args.no_hf:
        import transformers
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            hf = transformers.Qwen3ForCausalLM.from_pretrained(tmp, attn_implementation="sdpa", dtype=dtype).to(device)
        hf.eval()
        hf.generation_config.eos_token_id = None  # both run the full length

        def hf_generate(B):
            pad = ar_generate(model, prompts[:B], 1)  # for the left-padded prompts and their attention mask
            x = pad.tokens[:, :pad.start]
            real = (torch.arange(pad.start, device=device) >= (pad.start - pad.prompt_lens)[:, None]).long()
            out = hf.generate(input_ids=x, attention_mask=real, max_new_tokens=n, do_sample=False, pad_token_id=0)
            return SimpleNamespace(generated=out[:, x.shape[1]:])
        runs["transformers"] = hf_generate
    print(f"\nAR greedy, {n} new tokens: ours (static cache), eager{' and compiled' * args.compile}, "
          f"{'vs transformers generate(do_sample=False) on the same weights' * (not args.no_hf)}; batch > 1: "
          "ragged prompts, left-padded; a compiled run's first (warmup) call compiles\n")
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
        print(line + f" {', '.join(agree) or '-'} rows |")

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


# ---- --what align --------------------------------------------------------------------------------

def bench_align(args, device, dtype):
    """One REPR-ALIGN training step (corrupt, student forward on xt, teacher forward on x0, backward, AdamW)
    for lambda = 0, lambda = 10, and lambda = 10 with embed+mlp frozen (shared with the teacher), interleaved."""
    import align
    from training import configure_optimizer
    B, T = args.batch_size, args.seq_len
    variants = {"λ=0 (AR fine-tuning)": (0.0, []), "λ=10": (10.0, []),
                "λ=10, freeze embed,mlp": (10.0, ["embed", "mlp"])}
    steps = {}
    for name, (lam, freeze) in variants.items():
        student = build_ours(args, device, dtype)  # same seed: student and teacher start equal, as after convert.py
        c = student.config
        c.attn, c.mask_token_id, c.shift = "bidirectional", c.vocab_size - 1, True  # the last row: never a token
        student.freeze(freeze)
        teacher = None
        if lam:
            teacher = align.share_frozen(student, build_ours(args, device, dtype).requires_grad_(False).eval())
        opt = configure_optimizer(student, 1e-4, 0.1, device_type=device.type)
        layers = list(range(c.num_hidden_layers + 1))
        g = torch.Generator(device).manual_seed(0)

        def step(student=student, teacher=teacher, opt=opt, lam=lam, layers=layers, g=g):
            x0 = torch.randint(0, c.vocab_size - 1, (B, T), device=device, generator=g)
            loss, _ = align.loss_step(student, teacher, x0, g, layers=layers, lambda_align=lam)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        steps[name] = (step, align.flops_per_token(student, teacher, T), student)
    cuda = device.type == "cuda"
    times, peaks = {k: [] for k in steps}, {k: 0 for k in steps}
    for i in range(args.warmup + args.iters):  # interleaved
        for name, (step, _, _) in steps.items():
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            t = timeit(step, warmup=0, iters=1)
            if i >= args.warmup:
                times[name].append(t)
                peaks[name] = max(peaks[name], torch.cuda.max_memory_allocated(device) if cuda else 0)
    print(f"{machine(device)}; dtype {str(dtype).removeprefix('torch.')}")
    print(f"preset {args.preset}, batch {B} x seq_len {T}, one align.py training step, median of {args.iters} "
          f"after {args.warmup} warmup, interleaved (all variants' models stay resident on the device)\n")
    head = "| variant | ms/step | tokens/s | step time vs λ=0 |" + (" MFU | peak GiB (all resident) |" if cuda else "")
    print(head + "\n" + "|---" * (head.count("|") - 1) + "|")
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["λ=0 (AR fine-tuning)"]
    for name, (_, fpt, _) in steps.items():
        line = f"| {name} | {med[name] * 1e3:.1f} | {B * T / med[name]:,.0f} | {med[name] / base:.2f}x |"
        if cuda:
            peak = peak_flops(device)
            util = "n/a" if peak is None else f"{fpt * B * T / med[name] / peak:.1%}"
            line += f" {util} | {peaks[name] / 2**30:.2f} |"
        print(line)
    print(f"\nfreezing embed+mlp: {med['λ=10'] / med['λ=10, freeze embed,mlp']:.2f}x the throughput of λ=10 unfrozen")


# ---- --what distill ------------------------------------------------------------------------------

def bench_distill(args, device, dtype):
    """One distill.py iteration (rollout, teacher forward, student forward + backward + AdamW) with its time
    split, then the vectorised student forward against the per-block reference on one batch, interleaved."""
    import diffusion
    import distill
    from training import configure_optimizer
    B, N, bs = args.batch_size, args.seq_len, 4
    student, teacher = build_ours(args, device, dtype), build_ours(args, device, dtype).requires_grad_(False).eval()
    c = student.config
    c.attn, c.block_size, c.mask_token_id, c.shift = "block", bs, c.vocab_size - 1, False  # OPDLM's student
    # no end-of-sequence token (the mask id is never sampled), so every rollout runs the full N tokens
    tok, hp = SimpleNamespace(eos_id=c.mask_token_id, vocab_size=c.vocab_size - 1), distill.p.parse_args([])
    opt = configure_optimizer(student, 1e-4, 0.1, device_type=device.type)
    g = torch.Generator(device).manual_seed(0)
    items = [(torch.randint(0, tok.vocab_size, (16,), generator=g, device=device).tolist(), []) for _ in range(B)]
    got, t_teach, teacher_logits, train_mask = {}, [0.0], distill.teacher_logits, diffusion.train_mask

    def timed_teacher(*a, out=[]):  # distill_loss calls it by its module-level name
        t_teach[0] += timeit(lambda: out.append(teacher_logits(*a)), 0, 1)
        return out.pop()
    distill.teacher_logits = timed_teacher

    def rollout():
        student.eval()
        got["batch"] = distill.make_batch(student, items, N, "on", g, eos_id=tok.eos_id, vocab_limit=tok.vocab_size,
                                          threshold=hp.threshold, temperature=hp.temperature)[:4]  # x, lens, P, masked
        student.train()

    def loss_of(batch, v=True):  # v: True (vectorised), False (per block), "dense" (vectorised, dense mask on CUDA)
        diffusion.train_mask = (lambda real, N, bs, flex: train_mask(real, N, bs)) if v == "dense" else train_mask
        return distill.distill_loss(student, teacher, *batch, eos_id=tok.eos_id, vocab_size=tok.vocab_size,
                                    vectorised=bool(v))[0]

    def update(batch, v=True):
        loss = loss_of(batch, v)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    split = {"rollout": [], "teacher forward": [], "student forward + backward + AdamW": []}
    for i in range(args.warmup + args.iters):
        t_roll = timeit(rollout, 0, 1)
        t_teach[0] = 0.0
        t_upd = timeit(lambda: update(got["batch"]), 0, 1)
        if i >= args.warmup:
            for k, v in zip(split, (t_roll, t_teach[0], t_upd - t_teach[0])):
                split[k].append(v)
    rollout()
    batch, t_vec = got["batch"], {True: [], False: []}
    if device.type == "cuda":  # the vectorised forward uses FlexAttention there; time the dense mask too
        t_vec["dense"] = []
    loss = {v: loss_of(batch, v).item() for v in t_vec}
    for grp in opt.param_groups:  # lr 0 (AdamW's decay is scaled by it too): both time the same weights
        grp["lr"] = 0.0
    for i in range(args.warmup + args.iters):  # interleaved
        for v in t_vec:
            t_teach[0] = 0.0
            t = timeit(lambda: update(batch, v), 0, 1)
            if i >= args.warmup:
                t_vec[v].append(t - t_teach[0])  # the student's part: the teacher's forward is the same in both
    distill.teacher_logits, diffusion.train_mask = teacher_logits, train_mask
    med = {k: statistics.median(v) for k, v in split.items()}
    total = sum(med.values())
    print(f"{machine(device)}; dtype {str(dtype).removeprefix('torch.')}; preset {args.preset}, random weights")
    print(f"one distill.py iteration: batch {B}, 16-token prompts, rollout {N} tokens (block {bs}, threshold "
          f"{hp.threshold}, temperature {hp.temperature}), median of {args.iters} after {args.warmup} warmup\n")
    print("| part | ms | share |\n|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v * 1e3:.1f} | {v / total:.0%} |")
    print(f"| iteration | {total * 1e3:.1f} | {B / total:.2f} sequences/s, {1 / total:.2f} iterations/s |")
    m = {k: statistics.median(v) for k, v in t_vec.items()}
    print(f"\nstudent forward + backward + AdamW on one rollout batch ({int(batch[3].sum())} masked positions), "
          "interleaved\n")
    print("| student training | ms | loss |\n|---|---|---|")
    print(f"| vectorised: one forward over [prompt, x0, xt] | {m[True] * 1e3:.1f} | {loss[True]:.6f} |")
    print(f"| per-block reference: {N // bs} forwards | {m[False] * 1e3:.1f} | {loss[False]:.6f} |")
    if "dense" in m:
        print(f"| vectorised, dense (B, 1, T, T) mask to SDPA | {m['dense'] * 1e3:.1f} | {loss['dense']:.6f} |")
    how = "the dense mask to SDPA (FlexAttention is used on CUDA only: no backward on CPU)"
    if "dense" in m:
        how = "a FlexAttention BlockMask (the dense-mask row: the same forward with SDPA)"
    print("\nvectorised: " + how)
    print(f"vectorised: {m[False] / m[True]:.2f}x faster than per-block; |loss difference| "
          f"{abs(loss[True] - loss[False]):.2e}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--what", default="model", choices=["model", "sample", "align", "distill"],
                   help="which benchmark to run")
    p.add_argument("--preset", default="tiny", choices=sorted(SHAPES),
                   help="mid: hidden 512, 8 layers, tiny's vocabulary")
    p.add_argument("--batch_size", type=int, default=8, help="sequences per call")
    p.add_argument("--seq_len", type=int, default=256,
                   help="tokens per sequence (sample: the longest generation, also run at 1/4 and 1/2)")
    p.add_argument("--iters", type=int, default=None, help="timed runs of each (the median is reported); default "
                   "10 (model), 3 (sample)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="weights' dtype, same for both models; auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--compile", action="store_true", help="add a row for torch.compile(ours); sample: columns for "
                   "the compiled AR and block samplers")
    p.add_argument("--no_hf", action="store_true", help="skip transformers (two copies of a big model may not fit)")
    p.add_argument("--grad_checkpoint", action="store_true", help="gradient checkpointing in both models")
    p.add_argument("--ckpt", default=None, help="sample: trained weights from this checkpoint instead of --preset")
    p.add_argument("--data", default=None, help="sample, with --ckpt: prompts from this prepared dataset's "
                   "validation split (the start of its documents' first functions) instead of random ids")
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
    else:
        bench_sample(args, device, dtype)


if __name__ == "__main__":
    main()
