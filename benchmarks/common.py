"""
What the benchmarks share: the shapes (the presets and a mid-size CPU shape), timers that synchronise CUDA,
peak memory, our model and transformers' on the same weights, one training step.
"""
import contextlib
import os
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from model import PRESETS, Qwen3, Qwen3Config


# the presets, and a mid-size shape for CPU timing: the tiny teacher's vocabulary, hidden 512, 8 layers (26M params)
SHAPES = {**PRESETS, "mid": dict(PRESETS["tiny"], hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                                 num_attention_heads=8, num_key_value_heads=4, head_dim=64)}


def race(runs, iters, warmup=1):
    """runs: {name: fn -> result}, run interleaved (every round calls each once, so that noise from the machine hits
    all alike) -> {name: (median seconds over iters rounds after warmup rounds, the last result)}."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
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
    from lib.cli import cpu_has_bf16
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"CPU, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, " \
        f"{torch.backends.cpu.get_cpu_capability()}, {'with' if cpu_has_bf16() else 'no'} bf16 instructions"
    return f"machine: {where}; torch {torch.__version__}"


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
    """transformers' Qwen3ForCausalLM (LlamaForCausalLM for a Llama) holding our weights: saved by us, loaded by it."""
    import transformers
    with tempfile.TemporaryDirectory() as tmp:
        ours.save_pretrained(tmp)
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp, attn_implementation="sdpa", dtype=dtype)
    return hf.to(device).train()


def train_step(model, forward, targets):
    """forward() -> logits; cross-entropy (fp32) against targets, backward, gradients dropped."""
    logits = forward()
    F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1)).backward()
    model.zero_grad(set_to_none=True)
