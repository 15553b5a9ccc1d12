"""bench.py runs end to end on a tiny shape and prints its table (speed itself is never asserted)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args):
    return subprocess.run([sys.executable, "bench.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


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
    assert "| 2 |" in r.stdout and "2/2 rows" in r.stdout  # ours and transformers' greedy tokens agree
    assert "| threshold |" in r.stdout and "| 1.01 |" in r.stdout and "| NO |" not in r.stdout
