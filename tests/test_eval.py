"""eval.py: pass@k against its closed form; likelihoods against slow loops (a block DLM's BD3-LM bound: one
plain block-attention forward per row and block) and against the uniform model (ELBO = log2 V bits/token,
perplexity = V); the HumanEval harness on the canonical solutions (pass@1 = 1),
empty completions (0) and hostile completions (each caught, bounded time, nothing outside written or read, no secret
leaked, no process left behind; with and without the audit hook);
the 4-gram repetition rate against a slow count; generate (from the data and from a
prompts file) and humaneval end to end on micro checkpoints, and both on a stand-in declaring two end ids (each row
stopped and cut at the second); tasks through its command line: the oracle stand-in
scores 1.0 and the wrong one 0.0 at every threshold, an AR model gets one run, a checkpoint with another tokenizer
than the task data's is refused; likelihood and task_curve called as library functions give what the command line
writes."""
import collections
import contextlib
import json
import math
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import convert
import diffusion
import eval as E
import model as model_module
import sample as S
from conftest import run_script, world_copy
from model import Qwen3, preset
from lib import corpus
from lib import data
from worlds import tasks
from test_sandbox import needs_landlock, write_jsonl
from test_tasks import Oracle, wrong
from lib.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def world(base_world, tmp_path_factory):
    """A tiny corpus; a micro AR model (random), its DLM conversions, and a uniform AR model (zero head)."""
    root = world_copy(base_world, tmp_path_factory)
    m = Qwen3(preset("micro")).init_weights(0)
    with torch.no_grad():
        m.lm_head.weight.zero_()  # uniform logits over the whole vocabulary
    m.save_pretrained(root / "uniform")
    Tokenizer.byte_level().save_pretrained(root / "uniform")
    convert.convert(root / "uniform", root / "uniform_dlm", "bidirectional")
    convert.convert(root / "uniform", root / "uniform_block", "block", block_size=4)
    return root


def batches(world, n=2):
    return data.eval_batches(data.load_split(world / "data", "val"), 4, 32, n)


# ---- pass@k --------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,c,k", [(1, 0, 1), (1, 1, 1), (5, 2, 1), (10, 3, 1), (10, 3, 10), (10, 0, 10),
                                   (20, 1, 10), (20, 15, 10), (7, 7, 3), (200, 13, 10)])
def test_pass_at_k_closed_form(n, c, k):
    assert E.pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_truncate_and_entropy():
    assert E.truncate("    return 1\n\ndef g():\n    pass") == "    return 1\n"
    assert E.truncate("    x = 1\nprint(x)\nclass A: pass") == "    x = 1"
    assert E.truncate("    return 2\n") == "    return 2\n"
    assert data.unigram_entropy([7] * 10) == 0.0 and data.unigram_entropy([1, 2, 1, 2]) == pytest.approx(1.0)
    assert data.unigram_entropy(list(range(8))) == pytest.approx(3.0) and data.unigram_entropy([]) == 0.0
    ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]  # against the formula, term by term
    want = -sum(ids.count(v) / 11 * math.log2(ids.count(v) / 11) for v in set(ids))
    assert data.unigram_entropy(ids) == pytest.approx(want)
    assert data.unigram_entropy(np.array(ids, np.uint16)) == pytest.approx(want)  # a token file's dtype


def slow_repetition(ids, n=4):
    """Count, 4-gram by 4-gram, those equal to some earlier 4-gram (overlaps included), over all 4-grams."""
    total = len(ids) - n + 1
    seen = sum(any(ids[i:i + n] == ids[j:j + n] for j in range(i)) for i in range(total))
    return seen / total if total > 0 else None


def test_repetition_rate():
    assert E.repetition_rate([5] * 10) == pytest.approx(6 / 7)  # one distinct 4-gram of 7
    assert E.repetition_rate([1, 2, 3, 4] * 3) == pytest.approx(5 / 9) and E.repetition_rate(list(range(20))) == 0
    assert E.repetition_rate([1, 2, 3]) is None and E.repetition_rate([]) is None
    g = np.random.default_rng(0)
    for _ in range(50):
        ids = g.integers(0, 3, g.integers(0, 30)).tolist()  # 3 ids: many repeats, some overlapping
        assert E.repetition_rate(ids) == pytest.approx(slow_repetition(ids))


# ---- likelihood ----------------------------------------------------------------------------------

def slow_ar_nll(model, xs):
    nll, n = 0.0, 0
    for x in xs:
        for row in x:
            for i in range(1, len(row)):  # -log p(x_i | x_<i), one prefix at a time
                logits = model(row[None, :i], attn="causal")[0, -1]
                nll -= F.log_softmax(logits, -1)[row[i]].item()
                n += 1
    return nll / n


def slow_logp(model, x, xt):
    """(B, T, V) log-probs, entry [b, i] the denoiser's distribution for position i (row 0 unused under shift).
    Bidirectional: one forward over the corrupted window, read at i - shift. Block (BD3-LM): per row and block, one
    forward of the plain block rule over [x0_<blk, xt_blk], read at i - shift."""
    c, shift = model.config, int(model.config.shift)
    if c.attn != "block":
        return F.pad(F.log_softmax(model(xt, attn=c.attn), -1), (0, 0, shift, 0))[:, :x.shape[1]]
    out = torch.zeros(*x.shape, c.vocab_size)
    for b in range(len(x)):
        for s in range(0, x.shape[1], c.block_size):
            e = s + c.block_size
            logp = F.log_softmax(model(torch.cat([x[b, :s], xt[b, s:e]])[None], attn="block")[0], -1)
            out[b, max(s, shift):e] = logp[max(s, shift) - shift:e - shift]
    return out


def slow_nelbo(model, xs, n_draws, seed, eps):
    """The same draws as eval.dlm_nelbo (t per sequence; per sequence and block for a block DLM), scored by
    explicit loops over sequences and masked positions. -> (each draw's bits/token, each sequence's mean over the
    draws in bits/token)."""
    c, g = model.config, torch.Generator().manual_seed(seed)
    bs = c.block_size if c.attn == "block" else None
    draws, per_seq = [], [0.0] * sum(len(x) for x in xs)
    for _ in range(n_draws):
        per_batch, k = [], 0
        for x in xs:
            xt, masked, t = diffusion.corrupt(x, c.mask_token_id, c.shift, g, eps, block_size=bs)
            t = t[:, None].expand(x.shape) if t.dim() == 1 else t  # each position's rate
            logp = slow_logp(model, x, xt)
            seqs = []
            for b in range(len(x)):
                L = x.shape[1] - int(c.shift)  # maskable positions
                s = sum(-logp[b, i, x[b, i]].item() / t[b, i].item() for i in range(x.shape[1]) if masked[b, i])
                seqs.append(s / L)
                per_seq[k] += s / L / math.log(2) / n_draws
                k += 1
            per_batch.append(sum(seqs) / len(seqs))
        draws.append(sum(per_batch) / len(per_batch) / math.log(2))
    return draws, per_seq


@pytest.mark.parametrize("rows", [None, 5], ids=["one-chunk", "chunks-of-5"])  # Qwen3.cross_entropy's row chunks
@torch.no_grad()
def test_ar_likelihood_against_slow(world, rows, monkeypatch):
    if rows:
        monkeypatch.setattr(model_module, "CE_ROWS", rows)
    model = Qwen3.from_pretrained(world / "ar").eval()
    xs = [x[:, :12] for x in batches(world)]
    res = E.ar_likelihood(model, xs, torch.no_grad())
    ref = slow_ar_nll(model, xs)
    assert res["nll_nats"] == pytest.approx(ref, rel=1e-5)
    assert res["bits_per_token"] == pytest.approx(ref / math.log(2), rel=1e-5)
    assert res["perplexity"] == pytest.approx(math.exp(ref), rel=1e-5) and res["tokens"] == 2 * 4 * 11


@pytest.mark.parametrize("rows", [None, 5], ids=["one-chunk", "chunks-of-5"])
@pytest.mark.parametrize("ckpt", ["dlm", "dlm_noshift", "block", "block_shift"])
@torch.no_grad()
def test_nelbo_against_slow(world, ckpt, rows, monkeypatch):
    if rows:
        monkeypatch.setattr(model_module, "CE_ROWS", rows)
    model = Qwen3.from_pretrained(world / ckpt).eval()
    xs = batches(world)
    res = E.dlm_nelbo(model, xs, torch.no_grad(), 3, seed=5, eps=1e-3)
    draws, per_seq = slow_nelbo(model, xs, 3, 5, 1e-3)
    mean = sum(draws) / 3
    assert res["nelbo_bits_per_token"] == pytest.approx(mean, rel=1e-5)
    assert res["per_sequence"] == pytest.approx(per_seq, rel=1e-5) and len(per_seq) == 8
    sd = math.sqrt(sum((d - mean) ** 2 for d in draws) / 2)
    assert res["stderr"] == pytest.approx(sd / math.sqrt(3), rel=1e-4)
    assert res["n_draws"] == 3 and res["n_samples"] == 3 * 8


def test_likelihood_half_reads_one_half_of_the_split(world, monkeypatch):
    """--half first / second: the batches are cut from that half of the validation tokens alone (a rate swept on
    one half, the test on the other), and the two halves' sequences differ."""
    import argparse
    seen, cut = [], data.eval_batches
    monkeypatch.setattr(data, "eval_batches", lambda d, *a, **k: seen.append(np.asarray(d)) or cut(d, *a, **k))
    val = np.asarray(data.load_split(world / "data", "val"))
    out = {}
    for half in ("first", "second"):
        args = argparse.Namespace(ckpt=world / "dlm", device="cpu", seed=0, data=world / "data", half=half,
                                  batch_size=2, seq_len=16, n_batches=2, n_draws=2, eps=1e-3)
        out[half] = E.cmd_likelihood(args)
    assert np.array_equal(seen[0], val[:len(val) // 2]) and np.array_equal(seen[1], val[len(val) // 2:])
    assert len(out["first"]["per_sequence"]) == 4 and out["first"]["per_sequence"] != out["second"]["per_sequence"]


@pytest.mark.parametrize("dlm", ["uniform_dlm", "uniform_block"])
def test_uniform_model_likelihoods_are_log_vocab(world, tmp_path, dlm):
    V = Qwen3.from_pretrained(world / "uniform").config.vocab_size
    args = ["--data", world / "data", "--batch_size", "4", "--seq_len", "32", "--n_batches", "4"]
    r = run_script("eval.py", "likelihood", "--ckpt", world / "uniform", *args, "--out", tmp_path / "ar.json")
    assert r.returncode == 0, r.stderr
    ar = json.loads((tmp_path / "ar.json").read_text())["results"]
    assert ar["kind"] == "AR" and ar["perplexity"] == pytest.approx(V, rel=1e-5)
    assert ar["bits_per_token"] == pytest.approx(math.log2(V), rel=1e-6)
    r = run_script("eval.py", "likelihood", "--ckpt", world / dlm, *args, "--n_draws", "16",
                   "--out", tmp_path / "dlm.json")
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "dlm.json").read_text())
    d = res["results"]
    # E_t,M[ (1/(tL)) Σ_{i∈M} log V ] = log V exactly (per block too); the Monte Carlo estimate is within a few
    # standard errors
    assert d["kind"] == "DLM" and 0 < d["stderr"] < 0.05 * math.log2(V)
    assert d["bound"] == ("BD3-LM" if dlm == "uniform_block" else "masked diffusion")
    assert abs(d["nelbo_bits_per_token"] - math.log2(V)) < 4 * d["stderr"]
    assert d["n_samples"] == 16 * 16 and res["settings"]["seed"] == 1337
    assert d["ce_nats@0.5"] == pytest.approx(math.log(V), rel=1e-5)  # the masked-token CE at a fixed ratio
    assert "nelbo_bits_per_token" in r.stdout and "acc@0.15" in r.stdout


def test_likelihood_is_deterministic_and_refuses_bad_input(world, tmp_path):
    outs = []
    for i in range(2):
        r = run_script("eval.py", "likelihood", "--ckpt", world / "dlm", "--data", world / "data", "--batch_size",
                       "2", "--seq_len", "16", "--n_batches", "2", "--n_draws", "2", "--out", tmp_path / f"{i}.json")
        assert r.returncode == 0, r.stderr
        outs.append(json.loads((tmp_path / f"{i}.json").read_text())["results"])
    assert outs[0] == outs[1]
    r = run_script("eval.py", "likelihood", "--ckpt", tmp_path / "nope", "--data", world / "data")
    assert r.returncode != 0 and "nope" in r.stderr
    r = run_script("eval.py", "likelihood", "--ckpt", world / "dlm", "--n_draws", "0")
    assert r.returncode != 0 and "--n_draws must be positive" in r.stderr
    r = run_script("eval.py", "humaneval")
    assert r.returncode != 0 and "exactly one of --ckpt and --completions" in r.stderr


# ---- generate and humaneval with a model -------------------------------------------------------------

@pytest.mark.parametrize("ckpt,extra", [("ar", []), ("dlm", ["--block_length", "8", "--steps", "8"]),
                                        ("block", ["--threshold", "0.5"])])
def test_generate(world, tmp_path, ckpt, extra):
    r = run_script("eval.py", "generate", "--ckpt", world / ckpt, "--ref", world / "ar", "--data", world / "data",
                   "--num_prompts", "3", "--batch_size", "2", "--prompt_len", "8", "--max_new_tokens", "8",
                   "--ignore_eos", *extra, "--out", tmp_path / "g.json")
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "g.json").read_text())["results"]
    assert res["completion_tokens"] == 3 * 8 and res["gen_perplexity"] > 1
    assert 0 <= res["unigram_entropy_bits"] <= 3 and 0 <= res["repetition_4gram"] <= 1
    assert res["temperature"] == 0.0 and res["prompts"] == 3
    # --ignore_eos: every row counts all 8 tokens, so both throughputs count the same tokens
    assert res["tokens_per_s"] == pytest.approx(res["raw_tokens_per_s"]) == 3 * 8 / res["seconds"]
    lo, mean, hi = res["tokens_per_forward_min"], res["tokens_per_forward"], res["tokens_per_forward_max"]
    assert 1 <= lo <= mean <= hi <= 8 and res["tokens_per_forward_std"] <= hi - lo
    assert 8 / hi - 1e-9 <= res["forwards_per_row"] <= 8 / lo + 1e-9  # each row: 8 tokens / its tokens per forward
    if ckpt == "ar":
        assert mean == 1.0 and res["nfe"] == 2 * 8
    if ckpt == "dlm":
        assert mean == 1.0 and res["nfe"] == 2 * 8
    r = run_script("eval.py", "generate", "--ckpt", world / ckpt, "--ref", world / "dlm", "--data", world / "data",
                   "--num_prompts", "1", "--max_new_tokens", "8", *extra)
    assert r.returncode != 0 and "must be an AR checkpoint" in r.stderr


def test_generate_from_a_prompts_file(world, tmp_path):
    """--prompts: the records' prompts (each its last --prompt_len tokens, at most --num_prompts of them), not the
    data's; the temperature is in the results."""
    jsonl = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "def add(a, b):"}, {"prompt": "import os\nx = 1"},
                                               {"prompt": "never read"}])
    r = run_script("eval.py", "generate", "--ckpt", world / "block", "--ref", world / "ar", "--prompts", jsonl,
                   "--num_prompts", "2", "--prompt_len", "6", "--max_new_tokens", "8", "--temperature", "1.0",
                   "--show", "5", "--out", tmp_path / "g.json")
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "g.json").read_text())["results"]
    assert [s["prompt"] for s in res["samples"]] == ["a, b):", "\nx = 1"]  # byte-level: the last 6 bytes
    assert res["prompts"] == 2 and res["temperature"] == 1.0
    r = run_script("eval.py", "generate", "--ckpt", world / "block", "--ref", world / "ar", "--prompts",
                   tmp_path / "missing.jsonl")
    assert r.returncode == 1 and "missing.jsonl" in r.stderr


def test_generate_refuses_flags_the_sampler_ignores(world):
    r = run_script("eval.py", "generate", "--ckpt", world / "ar", "--ref", world / "ar", "--data", world / "data",
                   "--num_prompts", "1", "--max_new_tokens", "8", "--threshold", "0.9")
    last = r.stderr.strip().splitlines()[-1]  # the lines before it: tqdm's progress bar
    assert r.returncode == 1 and last.startswith("eval: sampler: threshold: not used by the AR sampler")




@needs_landlock
@pytest.mark.parametrize("ckpt", ["ar", "dlm"])
def test_humaneval_with_a_model(world, tmp_path, ckpt):
    r = run_script("eval.py", "humaneval", "--ckpt", world / ckpt, "--limit", "2", "--n_samples", "2",
                   "--max_new_tokens", "16", "--batch_size", "4", "--workers", "2", "--out", tmp_path / "h.json")
    assert r.returncode == 0, r.stderr
    res = json.loads((tmp_path / "h.json").read_text())
    assert res["results"]["problems"] == 2 and res["results"]["programs"] == 4
    assert res["results"]["pass@1"] == 0.0 and "pass@10" not in res["results"]
    assert res["settings"]["temperature"] == 0.8
    assert all(not any(s in x["completion"] for s in E.STOP) for x in res["results"]["samples"])


# ---- a checkpoint with two end ids -----------------------------------------------------------------

IM_END = 258  # the byte-level tokenizer's <|im_end|>, which ends a Qwen3 instruct model's turn
TWO_ENDS = {"def add(a, b):\n": "    return a + b\n", "xs = [1, 2]\nys = ": "xs[::-1]\n"}  # prompt -> completion


@pytest.mark.parametrize("attn, block_size", [("causal", None), ("bidirectional", None), ("block", 4)])
def test_generate_and_humaneval_stop_and_cut_at_every_end_id(world, tmp_path, monkeypatch, attn, block_size):
    """A stand-in checkpoint (test_tasks' Oracle on the byte-level tokenizer) declaring two end ids in
    generation_config.json, in either order, and ending each completion with <|im_end|>, not the tokenizer's
    eos: generate and humaneval stop every row there (tokens/s counts each row up to and with it) and score the
    completion before it; with --ignore_eos the rows run to --max_new_tokens and the completions are cut all
    the same. Stopping only at eos, every completion would end in "<|im_end|>" text."""
    tok = Tokenizer.byte_level()
    jsonl = write_jsonl(tmp_path / "p.jsonl", [{"prompt": p} for p in TWO_ENDS])
    want, N = list(TWO_ENDS.values()), 24
    real_load = E.load
    for declared in ([IM_END, tok.eos_id], [tok.eos_id, IM_END]):
        model = Oracle(tok, TWO_ENDS, attn, block_size, end=IM_END)
        model.config.generation = {"eos_token_id": declared}
        monkeypatch.setattr(E, "load", lambda path, *a, **k: (model, tok, torch.device("cpu"), contextlib.nullcontext())
                            if path == "stand-in" else real_load(path, *a, **k))
        for ignore in ([], ["--ignore_eos"]):
            common = ["--ckpt", "stand-in", "--max_new_tokens", N, "--batch_size", 2, "--temperature", 0, *ignore]
            args = E.parser().parse_args(map(str, ["generate", *common, "--ref", world / "ar", "--prompts", jsonl,
                                                   "--prompt_len", 64, "--show", 2]))
            res = E.cmd_generate(args)
            assert [s["completion"] for s in res["samples"]] == want, (declared, ignore)
            assert res["completion_tokens"] == sum(map(len, want))  # byte-level: a token a character
            rows = 2 * N if ignore else sum(len(c) + 1 for c in want)  # each row's tokens up to and with its end
            assert res["tokens_per_s"] * res["seconds"] == pytest.approx(rows)
            recs, _ = E.model_completions(model, tok, {p: {"prompt": p} for p in TWO_ENDS}, n_samples=1,
                                          max_new_tokens=N, batch_size=2, seed=1337, ignore_eos=bool(ignore),
                                          temperature=0.0)
            assert [r["completion"] for r in recs] == want, (declared, ignore)


# ---- the sandbox -------------------------------------------------------------------------------------

# ---- tasks ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def task_data(tmp_path_factory):
    """Task worlds as worlds/tasks.py and lib/corpus.py leave them: heldout.jsonl (4 prompts per family, answers of
    different lengths), train.jsonl, token files and the tokenizer; "bpe" (learnt on them) and "byte"."""
    out = {}
    for kind in ("bpe", "byte"):
        root = tmp_path_factory.mktemp(f"tasks-{kind}")
        train, items = tasks.build(seed=0, n_train=2000, n_heldout=4, min_len=2, max_len=6, max_digits=3)
        tasks.write(root, train, items)
        corpus.prepare(str(root), source=str(root / "train.jsonl"), tokenizer=kind)
        out[kind] = root
    return out


def eval_tasks(monkeypatch, capsys, model, tok, *args):
    """eval.py tasks through its command line (eval.main), with `model` as the checkpoint that load() returns."""
    monkeypatch.setattr(E, "load", lambda *a, **k: (model, tok, torch.device("cpu"), contextlib.nullcontext()))
    monkeypatch.setattr(sys, "argv", ["eval.py", "tasks", "--ckpt", "stand-in", *map(str, args)])
    E.main()
    return capsys.readouterr().out


@pytest.mark.parametrize("attn, block_size", [("causal", None), ("bidirectional", None), ("block", 4)])
def test_tasks_oracle_scores_one_and_wrong_zero(task_data, tmp_path, monkeypatch, capsys, attn, block_size):
    root = task_data["bpe"]
    tok = Tokenizer.from_pretrained(root)
    items = data.read_jsonl(root / "heldout.jsonl")
    thresholds = [None] if attn == "causal" else [0.5, 0.9, 1.0]  # AR: one run, whatever --thresholds says
    for answer, want in ((lambda a: a, 1.0), (wrong, 0.0)):
        model = Oracle(tok, {it["prompt"]: answer(it["answer"]) for it in items}, attn, block_size)
        model.config.tokenizer_sha256 = tok.fingerprint  # trained on this data
        out = eval_tasks(monkeypatch, capsys, model, tok, "--data", root, "--thresholds", "0.5,0.9,1",
                         "--num_prompts", 3, "--batch_size", 2, "--out", tmp_path / "t.json")
        saved = json.loads((tmp_path / "t.json").read_text())
        res = saved["results"]
        assert saved["command"] == "tasks" and saved["settings"]["seed"] == 1337 and res["prompts"] == 9
        assert [run["threshold"] for run in res["runs"]] == thresholds
        for run in res["runs"]:
            assert run["accuracy"] == want and run["n"] == 9 and "rows" not in run
            assert {f: (r["n"], r["accuracy"]) for f, r in run["families"].items()} == {
                f: (3, want) for f in tasks.FAMILIES}
            # a confident oracle: AR one token a forward; a DLM commits a whole block per forward
            assert (run["tokens_per_forward"] == 1.0) == (attn == "causal")
        # the table: a row per run and family, and the run's overall row; then a row per run, family and answer
        # length, counted from the items scored (the first 3 of each family)
        table, by_length = ([line.split("|")[1:-1] for line in part.splitlines() if line.startswith("| ")
                             and "---" not in line][1:] for part in out.split("By the answer's length"))
        assert [[c.strip() for c in r[1:5]] for r in table] == [
            ["—" if t is None else f"{t:g}", f, str(n), f"{want:.3f}"]
            for t in thresholds for f, n in (*((f, 3) for f in tasks.FAMILIES), ("all", 9))]
        scored = [it for f in tasks.FAMILIES for it in [it for it in items if it["family"] == f][:3]]
        lengths = collections.Counter((it["family"], str(len(it["answer"].split()))) for it in scored)
        assert [[c.strip() for c in r[:5]] for r in by_length] == [
            ["—" if t is None else f"{t:g}", f, d, str(n), f"{want:.3f}"]
            for t in thresholds for (f, d), n in sorted(lengths.items(), key=lambda kv: f"{kv[0][0]}/{kv[0][1]}")]


def test_tasks_cache_and_compile_reach_the_sampler(world, task_data, tmp_path, monkeypatch):
    """eval.py tasks --cache and --compile: passed to the sampler for every batch and named in the sampler column;
    the run's exact match and forwards are those of tasks.exact_match with that cache; refused for an AR model."""
    seen, real = [], S.generate

    def spy(*a, **k):
        seen.append((k["cache"], k["compile"]))
        return real(*a, **k)
    monkeypatch.setattr(S, "generate", spy)
    r = run_script("eval.py", "tasks", "--ckpt", world / "dlm", "--data", task_data["byte"], "--num_prompts", 2,
                   "--thresholds", "0.9", "--block_length", 2, "--cache", "dual", "--compile", "--device", "cpu",
                   "--out", tmp_path / "dual.json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert seen == [("dual", True)] * 3  # one batch per family
    assert "| masked diffusion, dual cache | 0.9 | all | 6 |" in r.stdout
    run = json.loads((tmp_path / "dual.json").read_text())["results"]["runs"][0]
    monkeypatch.setattr(S, "generate", real)
    m = Qwen3.from_pretrained(world / "dlm").eval()
    items = [it for f in tasks.FAMILIES for it in
             [it for it in data.read_jsonl(task_data["byte"] / "heldout.jsonl") if it["family"] == f][:2]]
    want = tasks.exact_match(m, Tokenizer.from_pretrained(world / "dlm"), items, threshold=0.9, block_length=2,
                             cache="dual", generator=torch.Generator().manual_seed(1337))
    assert (run["accuracy"], run["forwards_per_row"], run["nfe"]) == (want["accuracy"], want["forwards_per_row"],
                                                                       want["nfe"])
    r = run_script("eval.py", "tasks", "--ckpt", world / "ar", "--data", task_data["byte"], "--cache", "prefix")
    assert r.returncode == 1 and r.stderr.strip().endswith("cache: not used by the AR sampler (config.attn "
                                                           "'causal'); drop it")


def test_bench_cache_reports_exact_match_and_agreement(world, task_data, monkeypatch):
    """benchmarks.bench --what cache: a row per block length, threshold and cache, in that order; each row's exact
    match, family accuracies and tokens per forward are tasks.exact_match's with that cache, its 'same answers' the
    share of completions equal to the uncached run's (computed here from the rows); the uncached sampler gives the same
    answers on its second run as on its first. A random model's answers do not depend on the cache, so a stand-in
    exact_match whose answers and speeds do checks the agreement and speed-up columns by hand. Refused in one line
    for a block model or without --data."""
    r = run_script("benchmarks/bench.py", "--what", "cache", "--ckpt", world / "dlm", "--data", task_data["byte"],
                   "--iters", 2,                    "--batch_size", 4, "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [x for x in r.stdout.splitlines() if x.startswith("| ")]
    assert lines[0].startswith("| block length | threshold | cache | sort | rev | add | exact match | same answers")
    rows = [[c.strip() for c in x.strip("|").split(" | ")] for x in lines[1:]]
    assert [tuple(row[:3]) for row in rows] == [(bl, thr, c) for bl in ("the answer (one block)", "4")
                                                 for thr in ("0.9", "1") for c in ("none", "prefix", "dual")]
    m, tok = Qwen3.from_pretrained(world / "dlm").eval(), Tokenizer.from_pretrained(world / "dlm")
    items = tasks.load_items(task_data["byte"] / "heldout.jsonl")
    for bl, thr, cache, sort, rev, add, acc, same, tpf, *_ in rows:
        kw = dict(batch_size=4, threshold=float(thr), block_length=None if bl.startswith("the") else int(bl))
        want, none = (tasks.exact_match(m, tok, items, cache=c, **kw) for c in (cache, "none"))
        share = sum(a["completion"] == b["completion"] for a, b in zip(want["rows"], none["rows"])) / len(items)
        assert (acc, tpf, same) == (f"{want['accuracy']:.3f}", f"{want['tokens_per_forward']:.2f}", f"{share:.1%}")
        assert [sort, rev, add] == [f"{want['families'][f]['accuracy']:.3f}" for f in ("sort", "rev", "add")]
        if cache == "none":
            assert same == "100.0%"
    calls, fams = [], ("sort", "rev", "add")
    speeds = {"none": [1, 2, 10], "prefix": [6, 20, 4], "dual": [9, 3, 12]}  # medians 2, 6, 9: ratios 3x, 4.5x

    def stand_in(model, tok, items, *, batch_size, threshold, block_length, cache):
        run = sum(c == (block_length, threshold, cache) for c in calls)  # this configuration's run 0, 1, 2
        calls.append((block_length, threshold, cache))
        k = ("none", "prefix", "dual").index(cache)  # prefix and dual answer 3 of the 12 prompts differently
        rows = [dict(completion=cache if i % 4 == 0 and k else "same") for i in range(len(items))]
        return dict(accuracy=0.5 / 2 ** k, rows=rows, tokens_per_forward=1.5 + k, forwards_per_row=2.0,
                    tokens_per_s=100.0 * speeds[cache][run],
                    families={f: dict(accuracy=(j + 3 * k) / 10) for j, f in enumerate(fams)})
    monkeypatch.setattr(tasks, "exact_match", stand_in)
    r = run_script("benchmarks/bench.py", "--what", "cache", "--ckpt", world / "dlm", "--data", task_data["byte"],
                   "--iters", 3)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(items) == 12 and len(calls) == 4 * 3 * 3  # every configuration, each cache --iters times
    assert calls[:9] == [(None, 0.9, c) for c in ("none", "prefix", "dual")] * 3  # interleaved
    lines = [x for x in r.stdout.splitlines() if x.startswith("| ")][1:]
    rows = [[c.strip() for c in x.strip("|").split(" | ")] for x in lines]
    want = [["none", "0.000", "0.100", "0.200", "0.500", "100.0%", "1.50", "2.00", "200", "1.00x"],
            ["prefix", "0.300", "0.400", "0.500", "0.250", "75.0%", "2.50", "2.00", "600", "3.00x"],
            ["dual", "0.600", "0.700", "0.800", "0.125", "75.0%", "3.50", "2.00", "900", "4.50x"]]
    assert [row[2:] for row in rows] == want * 4  # the ratio of medians, not the median of per-run ratios
    monkeypatch.undo()
    r = run_script("benchmarks/bench.py", "--what", "cache", "--ckpt", world / "block", "--data", task_data["byte"])
    assert r.returncode == 1 and "is a block model; the caches are masked diffusion's" in r.stderr
    r = run_script("benchmarks/bench.py", "--what", "cache", "--ckpt", world / "dlm")
    assert r.returncode == 1 and "needs --ckpt (a masked-diffusion DLM) and --data" in r.stderr


def test_tasks_on_checkpoints_and_bad_input(world, task_data, tmp_path, monkeypatch, capsys):
    """Real (untrained, byte-tokenizer) micro checkpoints end to end; the refusals, each in one line."""
    for ckpt, runs in (("ar", 1), ("block", 2)):
        r = run_script("eval.py", "tasks", "--ckpt", world / ckpt, "--data", task_data["byte"], "--num_prompts", 2,
                       "--thresholds", "0.7,0.95", "--device", "cpu", "--out", tmp_path / f"{ckpt}.json")
        assert r.returncode == 0, r.stderr[-2000:]
        res = json.loads((tmp_path / f"{ckpt}.json").read_text())["results"]
        assert len(res["runs"]) == runs and all(0 <= run["accuracy"] <= 1 for run in res["runs"])
        assert all(1 <= run["tokens_per_forward_min"] <= run["tokens_per_forward_max"] for run in res["runs"])
    r = run_script("eval.py", "tasks", "--ckpt", world / "ar", "--data", task_data["bpe"])  # byte model, BPE data
    assert r.returncode == 1 and r.stderr.startswith("tokenizer mismatch: eval: the task data") and \
        len(r.stderr.strip().splitlines()) == 1
    r = run_script("eval.py", "tasks", "--ckpt", world / "ar", "--data", tmp_path)
    assert r.returncode == 1 and "heldout.jsonl" in r.stderr and "python -m worlds.tasks" in r.stderr
    for bad in ("0.5,x", "0", "1.5", ""):
        r = run_script("eval.py", "tasks", "--ckpt", world / "dlm", "--data", task_data["byte"], "--thresholds", bad)
        assert r.returncode == 2 and "--thresholds" in r.stderr
    r = run_script("eval.py", "tasks", "--ckpt", world / "ar", "--data", task_data["byte"], "--block_length", 4)
    assert r.returncode == 1 and r.stderr.strip().endswith("block_length: not used by the AR sampler "
                                                           "(config.attn 'causal'); drop it")


def untimed(x):
    """x without its wall-clock figures (tokens_per_s, raw_tokens_per_s), at any depth."""
    if isinstance(x, dict):
        return {k: untimed(v) for k, v in x.items() if not k.endswith("tokens_per_s")}
    return [untimed(v) for v in x] if isinstance(x, list) else x


def test_measures_as_library_functions_match_the_command_line(world, task_data, tmp_path):
    """eval.likelihood and eval.task_curve called as library functions (a model, its tokenizer, batches or items,
    numbers: no argparse namespace) return what eval.py likelihood and eval.py tasks write (--out) on the same
    checkpoint, data and seed; the timings aside."""
    r = run_script("eval.py", "likelihood", "--ckpt", world / "dlm", "--data", world / "data", "--batch_size", 2,
                   "--seq_len", 16, "--n_batches", 2, "--n_draws", 2, "--seed", 3, "--device", "cpu",
                   "--out", tmp_path / "l.json")
    assert r.returncode == 0, r.stderr[-2000:]
    model = Qwen3.from_pretrained(world / "dlm").eval()
    xs = data.eval_batches(data.load_split(world / "data", "val"), 2, 16, 2)
    res = E.likelihood(model, xs, contextlib.nullcontext(), 2, 3)
    assert res["kind"] == "DLM" and res == json.loads((tmp_path / "l.json").read_text())["results"]
    r = run_script("eval.py", "tasks", "--ckpt", world / "block", "--data", task_data["byte"], "--num_prompts", 2,
                   "--thresholds", "0.5,0.9", "--seed", 3, "--device", "cpu", "--out", tmp_path / "t.json")
    assert r.returncode == 0, r.stderr[-2000:]
    model, tok = Qwen3.from_pretrained(world / "block").eval(), Tokenizer.from_pretrained(world / "block")
    res = E.task_curve(model, tok, tasks.load_items(task_data["byte"] / "heldout.jsonl", 2), [0.5, 0.9], seed=3)
    assert [run["threshold"] for run in res["runs"]] == [0.5, 0.9] and res["prompts"] == 6
    assert untimed(res) == untimed(json.loads((tmp_path / "t.json").read_text())["results"])


# ---- winrate -------------------------------------------------------------------------------------

@pytest.mark.parametrize("attn, block_size", [("bidirectional", None), ("block", 4)])
def test_win_rate_samples_stop_and_cut_at_every_end_id(attn, block_size):
    """eval.completions (merge.py's win rate) on a stand-in DLM (test_tasks' Oracle, confident enough that
    temperature 1.0 samples its choice) declaring [<|endoftext|>, <|im_end|>] and ending each completion with
    <|im_end|>: each sample is cut there, and the sampler stops there (the rest of the row repeats it)."""
    tok = Tokenizer.byte_level()
    texts = {"x = 'a' + ": "'b'\n", "print(\"hi\", ": "'there')\n"}  # prompt -> completion
    model = Oracle(tok, texts, attn, block_size, sharp=lambda j: 30.0, end=258)
    model.config.generation = {"eos_token_id": [tok.eos_id, 258]}
    seen = []
    sampler = {"bidirectional": "diffusion_generate", "block": "block_generate"}[attn]
    with pytest.MonkeyPatch.context() as mp:
        original = getattr(S, sampler)
        mp.setattr(S, sampler, lambda *a, **k: seen.append(original(*a, **k)) or seen[-1])
        out = E.completions(model, [tok.encode(t) for t in texts], tok, 0, contextlib.nullcontext())
    assert out == list(texts.values())
    for b, c in enumerate(texts.values()):
        assert (seen[0].generated[b, len(c):] == 258).all() and int(seen[0].row_tokens[b]) == len(c) + 1


def test_win_rate_keeps_each_completion_score(monkeypatch):
    """eval.py winrate (cmd_winrate, then win_rate) returns every completion's rule score (scores per --ckpt,
    scores_ref), in the prompts' order, and its win rates are those scores compared pairwise, a tie counting half."""
    import argparse
    import types
    texts = {"ref": ['"a"', "'b'", "x"], "m1": ["'a'", '"b"', "y"], "m2": ["'a' \"b\"", "'b'", "'z'"]}
    model = types.SimpleNamespace(config=types.SimpleNamespace(attn="bidirectional"))
    monkeypatch.setattr(E, "load", lambda path, *a: (model, path, None, contextlib.nullcontext()))
    monkeypatch.setattr(data, "tokenized_pairs", lambda *a: [([k], None, None) for k in range(3)])
    monkeypatch.setattr(E, "completions", lambda m, prompts, tok, seed, ctx: texts[tok][:len(prompts)])
    args = argparse.Namespace(ref="ref", ckpt=["m1", "m2"], pairs="p.jsonl", samples=3, device="cpu", seed=0)
    res = E.cmd_winrate(args)
    assert res["scores_ref"] == [-1.0, 1.0, 0.0]
    assert res["scores"] == [[1.0, -1.0, 0.0], [0.0, 1.0, 1.0]]
    assert res["win_rates"] == [pytest.approx((1 + 0 + 0.5) / 3), pytest.approx((1 + 0.5 + 1) / 3)]
