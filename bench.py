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
"""
import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from model import PRESETS, Qwen3, preset
from training import mfu, setup


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
        model = Qwen3(preset(args.preset))
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


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--what", default="model", choices=["model"], help="which benchmark to run")
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--seq_len", type=int, default=256)
    p.add_argument("--iters", type=int, default=10, help="timed steps per model (the median is reported)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="weights' dtype, same for both models; auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--compile", action="store_true", help="add a row for torch.compile(ours)")
    p.add_argument("--no_hf", action="store_true", help="skip transformers (two copies of a big model may not fit)")
    p.add_argument("--grad_checkpoint", action="store_true", help="gradient checkpointing in both models")
    args = p.parse_args()
    if args.iters < 1:
        p.error("--iters must be at least 1")
    device, _ = setup(args.device)  # we cast the weights instead of training.py's autocast
    auto = torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = auto if args.dtype == "auto" else getattr(torch, args.dtype)
    if args.what == "model":
        bench_model(args, device, dtype)


if __name__ == "__main__":
    main()
