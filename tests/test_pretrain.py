"""pretrain.py end to end on a small corpus: it learns, it writes a Hugging Face checkpoint with its
tokenizer, --resume reproduces the uninterrupted run's losses exactly, and a NaN loss stops cleanly. The
answer-only loss (--loss_after): its mask (data.after_separator) and loss against slow per-token loops, and the
script's validation loss against a recomputation from its checkpoint."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import run_script, tiny_world, killed_after_checkpoint
from model import Qwen3, preset
from pretrain import ar_loss
from lib import corpus
from lib import data
from lib.tokenizer import Tokenizer
from worlds import tasks

SMALL = ["--preset", "micro", "--batch_size", "4", "--seq_len", "32", "--eval_batches", "2", "--warmup", "2",
         "--samples", "1"]


def run(*args):
    return run_script("pretrain.py", *args)


@pytest.fixture(scope="module")
def code_data(tmp_path_factory):
    return tiny_world(tmp_path_factory.mktemp("world"), ar=False) / "data"


def losses(out):
    return [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]


def test_learns_and_writes_hf_checkpoint(code_data, tmp_path):
    out = tmp_path / "ar"
    r = run("--data", str(code_data), "--out_dir", str(out), "--max_iters", "40", "--eval_interval", "20", "--lr",
            "3e-3", *SMALL)
    assert r.returncode == 0, r.stderr[-2000:]
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert len(log) == 40 and all("tokens_per_s" in rec for rec in log)
    vals = [rec["val_loss"] for rec in log if "val_loss" in rec]
    assert vals[-1] < vals[0] - 0.5  # it learned
    h = data.unigram_entropy(data.load_split(str(code_data), "val")) * math.log(2)  # nats, like the loss
    assert vals[-1] < h  # below the frequency-only baseline
    assert "validation loss" in r.stdout and "unigram entropy" in r.stdout
    m = Qwen3.from_pretrained(out)
    assert m.config.attn == "causal" and m.config.vocab_size == 320 and m.config.hidden_size == 64
    assert Tokenizer.from_pretrained(out).vocab_size == 259


def test_resume_after_kill(code_data, tmp_path):
    """Train 12 steps straight; separately train, keep only the step-5 checkpoint, resume: same losses."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    common = ["--data", str(code_data), "--max_iters", "12", "--eval_interval", "6", *SMALL]
    assert run(*common, "--out_dir", str(full)).returncode == 0
    # simulate a kill right after the step-6 checkpoint
    with killed_after_checkpoint(6):
        assert run(*common, "--out_dir", str(cut)).returncode == 3
    assert len(losses(cut)) == 6  # steps 0..5 logged; step 6's record is written after its checkpoint
    r = run(*common, "--out_dir", str(cut), "--resume")
    assert r.returncode == 0, r.stderr[-2000:]
    got, want = losses(cut), losses(full)
    assert len(got) == 11 and got[:6] == want[:6] and got[6:] == want[7:]  # step 6's own record was lost


def test_nan_stops_cleanly_and_refusals(code_data, tmp_path):
    out = tmp_path / "nan"
    r = run("--data", str(code_data), "--out_dir", str(out), "--max_iters", "30", "--eval_interval", "1",
            "--lr", "1e12", "--grad_clip", "1e30", *SMALL)
    assert r.returncode == 1 and "at step" in r.stderr and "last good checkpoint" in r.stderr
    assert Qwen3.from_pretrained(out)  # the last good checkpoint is loadable
    r = run("--data", str(code_data), "--out_dir", str(out), "--max_iters", "2", *SMALL)
    assert r.returncode == 1 and "--resume" in r.stderr
    r = run("--data", str(tmp_path / "nowhere"), "--out_dir", str(tmp_path / "z"), *SMALL)
    assert r.returncode == 1 and "python -m lib.corpus" in r.stderr
    r = run("--batch_size", "0")
    assert r.returncode == 2 and "must be positive" in r.stderr


# ---- the answer-only loss ------------------------------------------------------------------------

def slow_after_separator(row, sep, eos):
    """Token by token: a document's flag is raised by its first sep and lowered after its eos."""
    out, seen = [], False
    for t in row:
        out.append(seen)
        if t == eos:
            seen = False
        elif t == sep:
            seen = True
    return out


def test_after_separator_equals_a_per_document_loop():
    sep, eos = 1, 2
    x = torch.tensor([[5, 1, 6, 2, 7, 8, 1, 1, 9, 2, 2, 6, 1]])
    want = [0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0]  # a window may start in a prompt or end in one
    assert data.after_separator(x, sep, eos)[0].long().tolist() == want == slow_after_separator(x[0].tolist(), sep, eos)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 5, (64, 40), generator=g)  # seps, eos, empty documents, windows cut anywhere
    got = data.after_separator(x, sep, eos)
    assert got.tolist() == [slow_after_separator(row, sep, eos) for row in x.tolist()]
    assert 0.2 < got.float().mean() < 0.8  # both kinds are common


def slow_answer_loss(model, x, sep, eos):
    """The mean over rows and positions of -log p(target) for the targets slow_after_separator marks."""
    logp = torch.log_softmax(model(x[:, :-1], attn="causal").float(), -1)
    terms = [-logp[b, i, x[b, i + 1]] for b in range(len(x))
             for i, marked in enumerate(slow_after_separator(x[b].tolist(), sep, eos)[1:]) if marked]
    return torch.stack(terms).mean()


def test_answer_only_loss_equals_slow_loop():
    model = Qwen3(preset("micro")).init_weights(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 12, (6, 33), generator=g)
    with torch.no_grad():
        got = ar_loss(model, x, sep_id=3, eos_id=4)
        assert torch.allclose(got, slow_answer_loss(model, x, 3, 4), atol=1e-5)
        full = F.cross_entropy(model(x[:, :-1], attn="causal").flatten(0, 1), x[:, 1:].flatten())
        assert torch.allclose(ar_loss(model, x), full) and not torch.allclose(got, full, atol=1e-3)
        assert ar_loss(model, x, sep_id=200, eos_id=4) == 0  # no answer in the batch: 0, not NaN


def test_windows_begin_at_document_starts():
    """get_batch and eval_batches with starts=document_starts: every window is the data from a document's first
    token (offset 0 or one after an eos), found by a slow scan; the draws cover many documents."""
    import numpy as np
    eos, L = 9, 6
    g = torch.Generator().manual_seed(0)
    arr = torch.randint(0, 10, (400,), generator=g).numpy().astype(np.uint16)  # documents of random lengths
    slow = [i for i in range(len(arr) - L + 1) if i == 0 or arr[i - 1] == eos]
    starts = data.document_starts(arr, eos, L)
    assert starts.tolist() == slow
    x = data.get_batch(arr, 200, L, generator=g, starts=starts)
    windows = {tuple(arr[i:i + L].tolist()): i for i in slow}
    assert all(tuple(row) in windows for row in x.tolist())
    assert len({tuple(row) for row in x.tolist()}) > len(slow) / 3
    at = [windows[tuple(row)] for row in torch.cat(data.eval_batches(arr, 5, L, 3, starts=starts)).tolist()]
    assert len(at) == 15 and at == sorted(set(at)) and at[0] == 0 and at[-1] == slow[-1]  # spread over the split


@pytest.fixture(scope="module")
def task_world(tmp_path_factory):
    """rev and sort of 2-3 digits, byte tokenizer (its one-token separator is "=")."""
    root = tmp_path_factory.mktemp("tasks")
    train, _ = tasks.build(seed=0, n_train=1500, n_heldout=1, families=("sort", "rev"), max_len=3)
    tasks.write(root, train, [])
    corpus.prepare(str(root), source=str(root / "train.jsonl"), tokenizer="byte", val_fraction=0.1)
    return root


def test_loss_after_trains_and_validates_on_answers(task_world, tmp_path):
    out = tmp_path / "ar"
    r = run("--data", task_world, "--out_dir", out, "--max_iters", "30", "--eval_interval", "10", "--lr", "3e-3",
            "--loss_after", "=", *SMALL)
    assert r.returncode == 0, r.stderr[-2000:]
    vals = [rec["val_loss"] for rec in map(json.loads, (out / "log.jsonl").read_text().splitlines())
            if "val_loss" in rec]
    assert vals[-1] < vals[0] - 0.5
    model, tok = Qwen3.from_pretrained(out).eval(), Tokenizer.from_pretrained(out)
    val = data.load_split(str(task_world), "val")
    batches = data.eval_batches(val, 4, 33, 2, starts=data.document_starts(val, tok.eos_id, 33))  # SMALL's sizes
    with torch.no_grad():
        want = sum(slow_answer_loss(model, x, tok.encode("=")[0], tok.eos_id).item() for x in batches) / 2
    assert json.loads((out / "results.json").read_text())["val_loss"] == pytest.approx(want, abs=1e-5)
    assert "temperature 0.0, prompt 'sort" in r.stdout or "temperature 0.0, prompt 'rev" in r.stdout
    assert all(line.endswith("='") for line in r.stdout.splitlines() if ", prompt " in line)  # cut at "="
    for bad in (" =", "Z"):  # two byte tokens; one that never occurs
        r = run("--data", task_world, "--out_dir", tmp_path / bad, "--loss_after", bad, *SMALL)
        assert r.returncode == 1 and "--loss_after" in r.stderr, r.stderr[-2000:]
