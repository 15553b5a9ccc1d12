"""
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
import gc
import statistics
import time

import torch

from lib.runner import mfu, peak_flops
from lib.training import model_flops_per_token
from benchmarks.bench_sample import hf_generator, random_prompts
from benchmarks.bench_train import DistillRun, align_step
from benchmarks.common import (build_hf, build_ours, machine, measure, meta_model, nbytes, peak_memory, timeit,
                               train_step)


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
    without gradient checkpointing, and ours compiled. MFU: runner.mfu with our FLOP count for both."""
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
            fpt = model_flops_per_token(ours, T)
            return dict(tok_s=B * T / t, mfu=mfu(fpt * B * T / t, device), result=result or "-",
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
            return dict(tok_s=B * T / t, mfu=mfu(fpt * B * T / t, device), peak=mem["peak"],
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
