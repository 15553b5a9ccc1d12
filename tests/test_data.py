"""lib/corpus.py and lib/data.py: preparing a corpus (round trip, stable split, atomic writes), batching, JSONL
readers, the command line."""
import ast
import json
import os
import runpy
import subprocess
import sys

import numpy as np
import pytest
import torch

from lib import corpus
from lib import data
from lib.tokenizer import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOK = Tokenizer.byte_level()
DOCS = {f"pkg{i % 3}/mod{i}.py": f"# module {i}\nx = {i} * 'é'\n" for i in range(30)}
DOCS.update({"README.md": "# a readme\n\nwith ünïcode ✓\n", "notes.txt": "plain notes\n"})


def make_corpus(root, docs, reverse=False):
    """Write {relpath: text} under root (in reverse order when asked: creation order must not matter)."""
    for rel in sorted(docs, reverse=reverse):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(docs[rel], encoding="utf-8")
    return root


def reversed_walk(root, _walk=os.walk):
    """os.walk as if the OS listed every directory in the opposite order."""
    for d, dirs, files in _walk(root):
        dirs.reverse(), files.reverse()
        yield d, dirs, files


def split_texts(out_dir):
    """{split: [decoded documents]} of a prepared dataset, read with its own tokenizer."""
    tok = Tokenizer.from_pretrained(out_dir)
    return {s: [tok.decode(d.tolist()) for d in data.documents(data.load_split(out_dir, s), tok.eos_id)]
            for s in ("train", "val")}

# -----------------------------------------------------------------------------
# prepare


def test_bpe_is_learnt_on_train_documents_only(tmp_path):
    docs = {**DOCS, **{f"v{i}.py": "zyzzyva " * 50 for i in range(40)}}  # a word that only val may hold
    val_only = [n for n in docs if n.startswith("v") and data.is_val(n, 0.2)]
    docs = {n: t for n, t in docs.items() if not n.startswith("v") or n in val_only}
    assert val_only
    corpus.prepare(str(tmp_path / "out"), str(make_corpus(tmp_path / "src", docs)), val_fraction=0.2, vocab_size=400)
    tok = Tokenizer.from_pretrained(str(tmp_path / "out"))
    assert len(tok.encode(" zyzzyva")) >= 4  # never merged: the val documents did not shape the vocabulary


def test_prepare_round_trip(tmp_path):
    src, out = make_corpus(tmp_path / "src", DOCS), tmp_path / "out"
    meta = corpus.prepare(str(out), str(src), val_fraction=0.2, vocab_size=300)  # a BPE learnt here
    texts, tok = split_texts(out), Tokenizer.from_pretrained(str(out))
    assert 259 < tok.vocab_size <= 300 and meta["tokenizer"] == "bpe"  # fewer when pairs run out
    assert texts["train"] and texts["val"]
    # every document in exactly one split, decoded back exactly
    assert sorted(texts["train"] + texts["val"]) == sorted(DOCS.values())
    assert not set(texts["train"]) & set(texts["val"])
    # the split follows the hash rule
    val_names = {n for n in DOCS if data.is_val(n, 0.2)}
    assert sorted(texts["val"]) == sorted(DOCS[n] for n in val_names)
    for s in ("train", "val"):
        arr = data.load_split(out, s)
        assert arr.dtype == np.uint16 and meta["dtype"] == "uint16"
        # each document followed by exactly one eos, nothing else in the file
        assert arr[-1] == tok.eos_id
        assert int((arr == tok.eos_id).sum()) == len(texts[s]) == meta["splits"][s]["documents"]
        assert len(arr) == sum(len(tok.encode(t)) + 1 for t in texts[s]) == meta["splits"][s]["tokens"]
        assert os.path.getsize(out / f"{s}.bin") == 2 * meta["splits"][s]["tokens"]
    on_disk = json.loads((out / "meta.json").read_text())
    assert on_disk["vocab_size"] == tok.vocab_size and on_disk["eos_id"] == tok.eos_id
    assert on_disk["val_fraction"] == 0.2 and on_disk["python"]
    assert tok.decode(tok.encode("héllo")) == "héllo"
    assert len(tok.encode("x = 7 * 'é'")) < len("x = 7 * 'é'".encode())  # it learnt merges from the corpus
    assert not list(out.glob("*.tmp"))


def test_split_is_stable(tmp_path, monkeypatch):
    """Same files -> same bytes, whatever order the OS lists them in; extra files move nobody."""
    src = str(make_corpus(tmp_path / "src_a", DOCS))
    a = corpus.prepare(str(tmp_path / "a"), src, val_fraction=0.2)
    monkeypatch.setattr(corpus.os, "walk", reversed_walk)
    corpus.prepare(str(tmp_path / "a2"), src, val_fraction=0.2)
    for s in ("train", "val"):
        assert (tmp_path / "a" / f"{s}.bin").read_bytes() == (tmp_path / "a2" / f"{s}.bin").read_bytes()
    more = dict(DOCS, **{f"extra/e{i}.txt": f"extra document {i}\n" for i in range(20)})
    corpus.prepare(str(tmp_path / "b"), str(make_corpus(tmp_path / "src_b", more, reverse=True)), val_fraction=0.2)
    ta, tb = split_texts(tmp_path / "a"), split_texts(tmp_path / "b")
    for s in ("train", "val"):
        assert set(ta[s]) == set(tb[s]) & set(DOCS.values())
    assert a["splits"]["val"]["documents"] > 0


def test_tiny_corpus_gets_both_splits(tmp_path, monkeypatch):
    src = make_corpus(tmp_path / "src", {"a.txt": "first\n", "b.txt": "second\n"})
    for out in ("o1", "o2"):
        meta = corpus.prepare(str(tmp_path / out), str(src), val_fraction=0.0001)
        assert meta["splits"]["train"]["documents"] == meta["splits"]["val"]["documents"] == 1
    assert split_texts(tmp_path / "o1") == split_texts(tmp_path / "o2")
    # and the other way round: every document would hash to val
    meta = corpus.prepare(str(tmp_path / "o3"), str(src), val_fraction=0.9999)
    assert meta["splits"]["train"]["documents"] == meta["splits"]["val"]["documents"] == 1
    # the document that is moved does not depend on listing order
    src = make_corpus(tmp_path / "src5", {f"{c}.txt": f"doc {c}\n" for c in "abcde"})
    for frac in (0.0001, 0.9999):
        corpus.prepare(str(tmp_path / "f"), str(src), val_fraction=frac, overwrite=True)  # another split: another BPE
        with monkeypatch.context() as m:
            m.setattr(corpus.os, "walk", reversed_walk)
            corpus.prepare(str(tmp_path / "r"), str(src), val_fraction=frac, overwrite=True)
        f, r = split_texts(tmp_path / "f"), split_texts(tmp_path / "r")
        assert {s: set(t) for s, t in f.items()} == {s: set(t) for s, t in r.items()}


def test_too_few_documents(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="found 0 text documents"):
        corpus.prepare(str(tmp_path / "o"), str(tmp_path / "empty"))
    one = make_corpus(tmp_path / "one", {"a.txt": "only\n", "b.txt": "  \n"})  # whitespace-only is skipped
    with pytest.raises(ValueError, match="found 1 text documents"):
        corpus.prepare(str(tmp_path / "o"), str(one))
    with pytest.raises(FileNotFoundError, match="source not found"):
        corpus.prepare(str(tmp_path / "o"), str(tmp_path / "nope"))
    assert not (tmp_path / "o" / "train.bin").exists() and not list((tmp_path / "o").glob("*.tmp"))


def test_jsonl_source(tmp_path):
    texts = [f"record {i}: {'ß' * i}" for i in range(12)]
    src = tmp_path / "c.jsonl"
    src.write_text("\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate(texts)) + "\n\n")
    meta = corpus.prepare(str(tmp_path / "out"), str(src), val_fraction=0.3)
    got = split_texts(tmp_path / "out")
    assert sorted(got["train"] + got["val"]) == sorted(texts)
    assert meta["splits"]["val"]["documents"] + meta["splits"]["train"]["documents"] == 12


def test_failing_source_leaves_nothing(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"text": "fine"}\n{"text": "fine too"}\n{"text": broken\n')
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"bad\.jsonl:3"):
        corpus.prepare(str(out), str(src))
    assert not (out / "train.bin").exists() and not (out / "meta.json").exists()
    assert not list(out.glob("*.tmp"))


def test_interrupted_finish_leaves_no_meta(tmp_path, monkeypatch):
    """A re-prepare that dies after replacing the .bin files must not leave the old meta.json."""
    src, out = str(make_corpus(tmp_path / "src", DOCS)), tmp_path / "out"
    corpus.prepare(str(out), src, val_fraction=0.2)

    def boom(self, directory):
        raise RuntimeError("disk full")
    monkeypatch.setattr(corpus.Tokenizer, "save_pretrained", boom)
    with pytest.raises(RuntimeError):
        corpus.prepare(str(out), src, val_fraction=0.5, overwrite=True)
    assert not (out / "meta.json").exists() and not list(out.glob("*.tmp"))
    with pytest.raises(FileNotFoundError, match="missing meta.json"):
        data.load_split(str(out), "train")


def test_binary_files_skipped(tmp_path):
    src = make_corpus(tmp_path / "src", {"a.txt": "alpha\n", "b.md": "beta\n", "c.py": "gamma = 1\n"})
    (src / "blob.dat").write_bytes(b"\x00\x01ab" * 100)  # valid UTF-8, but NUL bytes: binary
    (src / "latin1.txt").write_bytes("café".encode("latin-1"))  # not UTF-8
    (src / ".hidden").mkdir()
    (src / ".hidden" / "x.txt").write_text("hidden\n")
    meta = corpus.prepare(str(tmp_path / "out"), str(src), val_fraction=0.3)
    assert meta["skipped_binary"] == 2
    got = split_texts(tmp_path / "out")
    assert sorted(got["train"] + got["val"]) == ["alpha\n", "beta\n", "gamma = 1\n"]


def test_stdlib_slice(tmp_path):
    meta = corpus.prepare(str(tmp_path / "std"), max_mb=0.3)
    assert meta["source"] == "stdlib" and 0.3 <= meta["source_mb"] < 1.5
    got = split_texts(tmp_path / "std")
    assert len(got["train"]) > 5 and got["val"]
    for t in got["train"] + got["val"]:  # whole source files, decoded back exactly
        ast.parse(t)

# -----------------------------------------------------------------------------
# loading and batching


def test_load_split_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing meta\.json.*python -m lib\.corpus --out_dir"):
        data.load_split(str(tmp_path), "train")
    src = make_corpus(tmp_path / "src", DOCS)
    corpus.prepare(str(tmp_path / "out"), str(src), val_fraction=0.2)
    with open(tmp_path / "out" / "train.bin", "r+b") as f:
        f.truncate(100)
    with pytest.raises(ValueError, match="prepare it again"):
        data.load_split(str(tmp_path / "out"), "train")


def test_get_batch():
    arr = np.arange(5000, dtype=np.uint16)
    x = data.get_batch(arr, 8, 32, generator=torch.Generator().manual_seed(0))
    assert x.shape == (8, 32) and x.dtype == torch.long
    assert (x[:, 1:] - x[:, :-1] == 1).all()  # contiguous windows of the data
    assert torch.equal(x, data.get_batch(arr, 8, 32, generator=torch.Generator().manual_seed(0)))
    assert not torch.equal(x, data.get_batch(arr, 8, 32, generator=torch.Generator().manual_seed(1)))
    # windows reach both ends; seq_len == len(data) gives the whole array
    starts = data.get_batch(arr[:40], 2000, 8, generator=torch.Generator().manual_seed(0))[:, 0]
    assert starts.min() == 0 and starts.max() == 32
    assert torch.equal(data.get_batch(arr[:40], 1, 40)[0], torch.arange(40))
    with pytest.raises(ValueError, match="fewer than seq_len"):
        data.get_batch(arr[:10], 2, 11)


def test_eval_batches():
    arr = np.random.default_rng(0).integers(0, 250, 3000).astype(np.uint16)
    state = torch.get_rng_state()
    b1 = data.eval_batches(arr, 4, 64, 5)
    torch.manual_seed(123)
    b2 = data.eval_batches(arr, 4, 64, 5)
    assert len(list(b2)) == len(list(b2)) == 5  # re-iterable: made once, evaluated with many times
    assert len(b1) == 5 and all(b.shape == (4, 64) and b.dtype == torch.long for b in b1)
    assert all(torch.equal(p, q) for p, q in zip(b1, b2))
    torch.set_rng_state(state)
    rows = torch.cat(b1)
    assert torch.equal(rows[0], torch.from_numpy(arr[:64].astype(np.int64)))  # first window at 0,
    assert torch.equal(rows[-1], torch.from_numpy(arr[-64:].astype(np.int64)))  # last one at the end
    with pytest.raises(ValueError, match="fewer than seq_len"):
        data.eval_batches(arr[:10], 1, 64, 1)


def test_documents():
    e = 256
    docs = data.documents(np.array([1, 2, e, e, 3, e, 4], dtype=np.uint16), e)
    assert [d.tolist() for d in docs] == [[1, 2], [3], [4]]

# -----------------------------------------------------------------------------
# JSONL readers


def test_read_jsonl(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "a"}\n\n{"prompt": "b", "x": 1}\n')
    assert data.read_prompts(p) == [{"prompt": "a"}, {"prompt": "b", "x": 1}]
    p.write_text('{"prompt": "a"}\n\n{"prompt": oops}\n')
    with pytest.raises(ValueError, match=r"p\.jsonl:3: malformed"):
        data.read_prompts(p)
    p.write_text('{"prompt": "a"}\n["not", "an", "object"]\n')
    with pytest.raises(ValueError, match=r"p\.jsonl:2: expected a JSON object"):
        data.read_prompts(p)
    p.write_text('{"prompt": 3}\n')
    with pytest.raises(ValueError, match=r"p\.jsonl:1: key 'prompt' must be a string"):
        data.read_prompts(p)
    p.write_text("\n")
    with pytest.raises(ValueError, match="no records"):
        data.read_prompts(p)


def test_read_pairs(tmp_path):
    p = tmp_path / "pairs.jsonl"
    good = {"prompt": "q", "chosen": "yes", "rejected": "no"}
    p.write_text(json.dumps(good) + "\n" + json.dumps({"prompt": "q", "chosen": "yes"}) + "\n")
    with pytest.raises(ValueError, match=r"pairs\.jsonl:2: missing key 'rejected'"):
        data.read_pairs(p)
    p.write_text(json.dumps(good) + "\n")
    assert data.read_pairs(p) == [good]

# -----------------------------------------------------------------------------
# CLI


def test_cli_help():
    """The one real subprocess (importing torch costs seconds): the script runs as a file."""
    r = subprocess.run([sys.executable, "-m", "lib.corpus", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "--out_dir" in r.stdout and "--val_fraction" in r.stdout


def run_cli(monkeypatch, *args):
    """Run lib/corpus.py's __main__ in this process; returns the exit code (0 when it returns)."""
    monkeypatch.setattr(sys, "argv", ["lib/corpus.py", *args])
    try:
        runpy.run_path(os.path.join(ROOT, "lib/corpus.py"), run_name="__main__")
    except SystemExit as e:
        return e.code
    return 0


def test_cli(tmp_path, monkeypatch, capsys):
    assert run_cli(monkeypatch, "--no_such_flag", "1") == 2
    assert "unrecognized arguments" in capsys.readouterr().err
    assert run_cli(monkeypatch, "--out_dir", str(tmp_path / "o"), "--source", str(tmp_path / "missing")) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    (tmp_path / "empty").mkdir()
    code = run_cli(monkeypatch, "--out_dir", str(tmp_path / "o"), "--source", str(tmp_path / "empty"))
    assert code not in (0, None) and "found 0 text documents" in str(code)  # sys.exit(message)
    src = make_corpus(tmp_path / "src", DOCS)
    assert run_cli(monkeypatch, "--out_dir", str(tmp_path / "o"), "--source", str(src), "--val_fraction", "0.2") == 0
    assert "val:" in capsys.readouterr().out
    meta = json.loads((tmp_path / "o" / "meta.json").read_text())
    assert sum(meta["splits"][s]["documents"] for s in ("train", "val")) == len(DOCS)


def test_answer_batch_equals_get_batch_and_the_windowed_separator_rule():
    """answer_batch draws get_batch's windows (the same generator, the same offsets); with loss_targets' marks for
    --loss_after (the separator rule on the whole split) each window's marks equal after_separator on the window
    itself, for windows that begin at a document."""
    from types import SimpleNamespace
    tok = Tokenizer.byte_level()
    docs = [f"sort {' '.join('312'[:k + 1])} = {' '.join(sorted('312'[:k + 1]))}" for k in range(3)] * 20
    arr = np.asarray([i for d in docs for i in tok.encode(d) + [tok.eos_id]], dtype=np.uint16)
    args = SimpleNamespace(loss_after="=", assistant_only=False)
    answers, starts = data.loss_targets(args, tok, arr, arr, 12, "test")
    g1, g2 = (torch.Generator().manual_seed(3) for _ in range(2))
    x, where = data.answer_batch(arr, answers, 16, 12, generator=g1, starts=starts["train"])
    assert torch.equal(x, data.get_batch(arr, 16, 12, generator=g2, starts=starts["train"]))
    sep = tok.encode("=")[0]
    assert torch.equal(where, data.after_separator(x, sep, tok.eos_id)) and where.any()
    assert data.answer_batch(arr, None, 4, 12)[1] is None
