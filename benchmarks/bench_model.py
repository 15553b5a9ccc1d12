"""
--what model (the default): one training step (forward, cross-entropy against random targets, backward)
of our Qwen3 against transformers' Qwen3ForCausalLM (attn_implementation="sdpa") holding the SAME
weights, at the same (batch, seq_len), causal attention. The two run interleaved (ours, HF, ours, HF, ...)
so that noise from other processes on the machine hits both alike. How to read the table:

- ms/step is the median over --iters steps after --warmup; tokens/s = batch * seq_len / that median;
- "ours / HF (time)" below 1.00x means ours is faster; on a shared CPU, differences under ~10% are noise,
  so run it twice before believing one;
- on CUDA: MFU against the GPU's dense bf16 peak (runner.peak_flops), and peak GiB = the model's own
  weights + the most memory a step allocated above what was resident before it (activations, gradients),
  i.e. about what that model alone would need. --grad_checkpoint shows the activation saving, e.g.
  `python -m benchmarks.bench --preset qwen3-0.6b --seq_len 4096 --batch_size 1 --grad_checkpoint` on a GPU.
- --compile adds a row for torch.compile(ours) (its first warmup step includes compilation).

Example: python -m benchmarks.bench --preset tiny --batch_size 8 --seq_len 256
"""
import statistics

import torch

from lib.runner import mfu
from lib.training import model_flops_per_token
from benchmarks.common import build_hf, build_ours, machine, measure, nbytes, train_step


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
            u = mfu(model_flops_per_token(ours, T) * tok_s, device)
            line += f" {'n/a' if u is None else f'{u:.1%}'} | {(nbytes(model) + peaks[name]) / 2**30:.2f} |"
        print(line)
    if "transformers (sdpa)" in median:
        ratio = median["ours"] / median["transformers (sdpa)"]
        print(f"| ours / HF (time) | {ratio:.2f}x |" + " |" * (head.count("|") - 3))
