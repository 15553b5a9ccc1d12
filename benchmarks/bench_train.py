"""
--what align: one align.py training step for λ = 0 (the "AR fine-tuning" baseline: no teacher), λ = 10, and
λ = 10 with embed+mlp frozen (shared with the teacher), interleaved; step-time ratios against λ = 0 (the
teacher's forward is the overhead) and the throughput gain from freezing. On a GPU:
`python -m benchmarks.bench --what align --preset qwen3-0.6b --seq_len 2048 --batch_size 1` adds MFU and peak memory.

--what distill: one distill.py iteration on --preset's random weights (OPDLM's student: block 4, unshifted;
the teacher a second copy), batch --batch_size, 16-token prompts, a --seq_len-token rollout at threshold 0.9,
temperature 1.0, no end-of-sequence token: the time of the rollout, the teacher's forward and the student's
update (forward, backward, AdamW). Then, on one rollout batch, the vectorised student forward over
[prompt, x0, xt] against the one-forward-per-block reference (diffusion.per_block_logits), interleaved, with
their losses (equal up to rounding). Random weights commit one token per round, so the rollout is the slowest
case (seq_len forwards). On a GPU: `python -m benchmarks.bench --what distill --preset qwen3-0.6b --seq_len 512
--batch_size 1` (the Qwen3-0.6B shape, rollout 512).
"""
import contextlib
import statistics

import torch

from lib.runner import mfu
from benchmarks.common import build_ours, machine, measure, timeit


def align_step(preset, device, dtype, B, T, lam, freeze=()):
    """-> (step, training FLOPs per token): step() runs one REPR-ALIGN training step (corrupt, student forward on
    xt, teacher forward on x0, backward, AdamW) on random x0 (B, T), for a student of the preset's shape (random
    weights) and, for lam > 0, its frozen teacher (an equal copy, as after convert.py; frozen groups shared)."""
    import align
    import diffusion
    from lib.training import configure_optimizer, flops_per_token, freeze as freeze_groups, share_frozen
    student = build_ours(preset, device, dtype)  # same seed: student and teacher start equal, as after convert.py
    c = student.config
    c.attn, c.mask_token_id, c.shift = "bidirectional", c.vocab_size - 1, True  # the last row: never a token
    freeze_groups(student, list(freeze))
    teacher = None
    if lam:
        teacher = share_frozen(student, build_ours(preset, device, dtype).requires_grad_(False).eval())
    opt = configure_optimizer(student, 1e-4, 0.1)
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
            util = mfu(fpt * B * T / med[name], device)
            util = "n/a" if util is None else f"{util:.1%}"
            line += f" {util} | {peaks[name] / 2**30:.2f} |"
        print(line)
    print(f"\nfreezing embed+mlp: {med['λ=10'] / med['λ=10, freeze embed,mlp']:.2f}x the throughput of λ=10 unfrozen")


@contextlib.contextmanager
def student_mask(how, distill=None):
    """Inside: distill.py's vectorised student forward (diffusion.block_logits) attends through a dense (B, 1, T, T)
    mask (how="dense") or a FlexAttention BlockMask ("flex") on any device, or distill's student is read by the
    definition, one forward per block ("per-block": diffusion.per_block_logits); otherwise as distill.py chooses
    (FlexAttention on CUDA, the dense mask elsewhere)."""
    import diffusion
    train_mask, block_logits = diffusion.train_mask, getattr(distill, "block_logits", None)
    if how in ("dense", "flex"):
        diffusion.train_mask = lambda real, N, bs, flex=False, **packed: train_mask(real, N, bs, flex=how == "flex",
                                                                                    **packed)
    if how == "per-block":
        distill.block_logits = lambda *a, flex=False, doc=None, **kw: diffusion.per_block_logits(*a, **kw)
    try:
        yield
    finally:
        diffusion.train_mask = train_mask
        if distill is not None:
            distill.block_logits = block_logits


class DistillRun:
    """distill.py's iteration on the preset's random weights: OPDLM's student (block 4, unshifted) and its teacher
    (a second copy), B 16-token prompts, N-token rollouts at distill.py's threshold and temperature, no
    end-of-sequence token (the mask id is never sampled), so every rollout runs the full N tokens. Random weights
    commit one token per round: the rollout is the slowest case (N forwards)."""

    def __init__(self, preset, device, dtype, B, N, bs=4):
        import distill
        from lib.training import configure_optimizer
        self.distill, self.N, self.bs = distill, N, bs
        self.student = build_ours(preset, device, dtype)
        self.teacher = build_ours(preset, device, dtype).requires_grad_(False).eval()
        c = self.student.config
        c.attn, c.block_size, c.mask_token_id, c.shift = "block", bs, c.vocab_size - 1, False  # OPDLM's student
        self.eos_id, self.vocab = c.mask_token_id, c.vocab_size - 1
        self.hp = distill.p.parse_args([])
        self.opt = configure_optimizer(self.student, 1e-4, 0.1)
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
        with student_mask(how, self.distill):
            return self.distill.distill_loss(self.student, self.teacher, *batch, eos_id=self.eos_id,
                                             vocab_size=self.vocab)[0]

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
