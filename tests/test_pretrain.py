"""pretrain.py end to end on a small corpus: it learns, it writes a Hugging Face checkpoint with its
tokenizer, --resume reproduces the uninterrupted run's losses exactly, and a NaN loss stops cleanly."""
import json
import math

import pytest

import data
from conftest import run_script, tiny_world, killed_after_checkpoint
from eval import unigram_entropy
from model import Qwen3
from tokenizer import Tokenizer

SMALL = ["--preset", "micro", "--batch_size", "4", "--seq_len", "32", "--eval_batches", "2", "--warmup", "2",
         "--samples", "1"]


def run(*args):
    return run_script("pretrain.py", *args)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return tiny_world(tmp_path_factory.mktemp("world"), ar=False) / "data"


def losses(out):
    return [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]


def test_learns_and_writes_hf_checkpoint(corpus, tmp_path):
    out = tmp_path / "ar"
    r = run("--data", str(corpus), "--out_dir", str(out), "--max_iters", "40", "--eval_interval", "20", "--lr", "3e-3", *SMALL)
    assert r.returncode == 0, r.stderr[-2000:]
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert len(log) == 40 and all("tokens_per_s" in rec for rec in log)
    vals = [rec["val_loss"] for rec in log if "val_loss" in rec]
    assert vals[-1] < vals[0] - 0.5  # it learned
    h = unigram_entropy(data.load_split(str(corpus), "val")) * math.log(2)  # nats, like the loss
    assert vals[-1] < h  # below the frequency-only baseline
    assert "validation loss" in r.stdout and "unigram entropy" in r.stdout
    m = Qwen3.from_pretrained(out)
    assert m.config.attn == "causal" and m.config.vocab_size == 320 and m.config.hidden_size == 64
    assert Tokenizer.from_pretrained(out).vocab_size == 259


def test_resume_after_kill(corpus, tmp_path):
    """Train 12 steps straight; separately train, keep only the step-5 checkpoint, resume: same losses."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    common = ["--data", str(corpus), "--max_iters", "12", "--eval_interval", "6", *SMALL]
    assert run(*common, "--out_dir", str(full)).returncode == 0
    # simulate a kill right after the step-6 checkpoint
    with killed_after_checkpoint(6):
        assert run(*common, "--out_dir", str(cut)).returncode == 3
    assert len(losses(cut)) == 6  # steps 0..5 logged; step 6's record is written after its checkpoint
    r = run(*common, "--out_dir", str(cut), "--resume")
    assert r.returncode == 0, r.stderr[-2000:]
    got, want = losses(cut), losses(full)
    assert len(got) == 11 and got[:6] == want[:6] and got[6:] == want[7:]  # step 6's own record was lost


def test_nan_stops_cleanly_and_refusals(corpus, tmp_path):
    out = tmp_path / "nan"
    r = run("--data", str(corpus), "--out_dir", str(out), "--max_iters", "30", "--eval_interval", "1",
            "--lr", "1e12", "--grad_clip", "1e30", *SMALL)
    assert r.returncode == 1 and "at step" in r.stderr and "last good checkpoint" in r.stderr
    assert Qwen3.from_pretrained(out)  # the last good checkpoint is loadable
    r = run("--data", str(corpus), "--out_dir", str(out), "--max_iters", "2", *SMALL)
    assert r.returncode == 1 and "--resume" in r.stderr
    r = run("--data", str(tmp_path / "nowhere"), "--out_dir", str(tmp_path / "z"), *SMALL)
    assert r.returncode == 1 and "python data.py" in r.stderr
    r = run("--batch_size", "0")
    assert r.returncode == 2 and "must be positive" in r.stderr
