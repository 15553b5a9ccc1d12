"""bench.py runs end to end on a tiny shape and prints its tables (speed itself is never asserted)."""
from conftest import run_script


def run(*args):
    return run_script("bench.py", *args)


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
