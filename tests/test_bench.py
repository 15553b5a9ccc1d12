"""benchmarks.bench runs end to end on a tiny shape and prints its tables (speed itself is never asserted); gpu_check.sh
runs on a CPU with --tiny and prints its one table, every row there."""
import math
import os
import subprocess
import sys

from conftest import ROOT, run_script


def run(*args):
    return run_script("benchmarks/bench.py", *args)


def test_help():
    r = run("--help")
    assert r.returncode == 0 and "--preset" in r.stdout and "--no_hf" in r.stdout


def test_model_table_with_ratio():
    r = run("--preset", "tiny", "--batch_size", "1", "--seq_len", "16", "--iters", "1", "--warmup", "0")
    assert r.returncode == 0, r.stderr
    assert "| model | ms/step | tokens/s |" in r.stdout
    assert "| ours |" in r.stdout and "| transformers (sdpa) |" in r.stdout
    assert "| ours / HF (time) |" in r.stdout


def test_sample_tables():
    r = run("--what", "sample", "--seq_len", "8", "--batch_size", "2", "--iters", "1")
    assert r.returncode == 0, r.stderr
    assert "| new tokens | cached tokens/s | recompute tokens/s | cached speed-up |" in r.stdout
    assert "| 2 |" in r.stdout and "transformers 2/2 rows" in r.stdout  # ours and transformers' greedy tokens agree
    header = "| new tokens | decoding | cache | tokens/s | forwards | speed-up vs none | same tokens as none |"
    assert header in r.stdout
    for row in ("| 8 | 1 token/step | dual |", "| 4 | threshold 0.9 | prefix |", "| 8 | 1 token/step | none | "):
        assert row in r.stdout
    assert "| threshold |" in r.stdout and "| 1.01 |" in r.stdout and "| NO |" not in r.stdout
    assert "| threshold | per-row tokens per forward: mean (min-max) | batch tokens per forward |" in r.stdout


def test_align_table():
    r = run("--what", "align", "--preset", "micro", "--seq_len", "16", "--batch_size", "2", "--iters", "1",
            "--warmup", "0")
    assert r.returncode == 0, r.stderr
    for row in ("| λ=0 (AR fine-tuning) |", "| λ=10 |", "| λ=10, freeze embed,mlp |", "the throughput of λ=10"):
        assert row in r.stdout


def test_distill_tables():
    r = run("--what", "distill", "--preset", "micro", "--seq_len", "8", "--batch_size", "2", "--iters", "1",
            "--warmup", "0")
    assert r.returncode == 0, r.stderr
    for row in ("| rollout |", "| teacher forward |", "| student forward + backward + AdamW |", "| iteration |",
                "| vectorised: one forward over [prompt, x0, xt] |", "| per-block reference: 2 forwards |",
                "faster than per-block"):
        assert row in r.stdout
    diff = float(r.stdout.split("|loss difference| ")[1].split()[0])
    assert diff < 1e-4  # the two student forwards agree (distill's tests check this exactly)


GPU_CHECK_ROWS = [  # (part, check, runs on a CPU)
    ("1", "fwd+bwd: transformers (sdpa)", True), ("1", "fwd+bwd: ours", True),
    ("1", "fwd+bwd: transformers, gradient checkpointing", True), ("1", "fwd+bwd: ours, --grad_checkpoint", True),
    ("1", "fwd+bwd: ours, --compile", False),
    ("2", "align.py step: λ=0 (no teacher)", True), ("2", "align.py step: λ=10 (frozen teacher)", True),
    ("3", "distill.py iteration: eager", True), ("3", "distill loss: FlexAttention = dense mask", True),
    ("3", "distill.py iteration: --compile (FlexAttention)", False),
    *[row for B in (1, 8) for row in (
        ("4", f"AR decode, batch {B}: transformers generate", True), ("4", f"AR decode, batch {B}: ours, eager", True),
        ("4", f"AR decode, batch {B}: ours, compiled (CUDA graphs)", False),
        ("4", f"AR decode, batch {B}: roofline (weights / HBM bandwidth)", False))],
    ("5", "block sampler, batch 1: eager", True), ("5", "block sampler, batch 1: compiled (CUDA graphs)", False),
]


def test_gpu_check_runs_on_a_cpu():
    """The one command, as a GPU runs it but with --device cpu --tiny: exit 0, one table with every row in order;
    the rows that ran have finite positive tokens/s and seconds, the CUDA-only ones say "skipped (CPU)" and hold no
    number; FlexAttention's loss equals the dense mask's, and our greedy tokens equal transformers'."""
    r = subprocess.run(["bash", str(ROOT / "gpu_check.sh"), "--device", "cpu", "--tiny"], capture_output=True,
                       text=True, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [x for x in r.stdout.splitlines() if x.startswith("|")]
    assert lines[0] == "| part | check | tokens/s | MFU | peak GiB | seconds | result |" and set(lines[1]) == set("|-")
    rows = [[c.strip() for c in x.strip("|").split(" | ")] for x in lines[2:]]
    assert [(part, check) for part, check, *_ in rows] == [(part, check) for part, check, _ in GPU_CHECK_ROWS]
    for (part, check, tok_s, mfu, peak, seconds, result), (_, _, on_cpu) in zip(rows, GPU_CHECK_ROWS):
        assert (mfu, peak) == ("-", "-"), check  # no GPU peak, no CUDA memory on a CPU
        if not on_cpu:
            assert (tok_s, seconds, result) == ("-", "-", "skipped (CPU)"), check
            continue
        assert math.isfinite(float(seconds)) and float(seconds) >= 0, check
        if check.startswith("distill loss"):
            assert tok_s == "-" and "(equal within" in result, result
        else:
            assert math.isfinite(float(tok_s.replace(",", ""))) and float(tok_s.replace(",", "")) > 0, check
    results = {check: result for _, check, *_, result in rows}
    assert "same tokens: 1/1 rows" in results["AR decode, batch 1: ours, eager"]
    assert "same tokens: 8/8 rows" in results["AR decode, batch 8: ours, eager"]
    assert "the step time of transformers" in results["fwd+bwd: ours"]
    assert "s in all" in r.stdout
