"""Bad input ends a run with one clear line and loses nothing: overlapping or truncated checkpoints in convert.py,
tokenizer fingerprints (data vs model, teacher vs student, a checkpoint's own tokenizer never replaced), the kind
of checkpoint a teacher must be, bad --device / --seq_len, Ctrl-C, --resume with changed settings, no step-0
checkpoint, --save_dtype, failed lib/corpus.py runs, and the one atomic writer."""
import hashlib
import io
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from conftest import ROOT, killed_after_checkpoint, run_script, world_copy
from convert import convert
from model import Qwen3, Qwen3Config, preset
from lib import checkpoint
from lib import corpus
from lib import data
from lib import training
from lib.checkpoint import check_saving, trained_with
from lib.cli import atomic_write
from lib.corpus import train_bpe
from lib.hf import safetensors_names, weight_files
from lib.tokenizer import Tokenizer, fingerprint_of
from lib.training import load_tokenizer

SMALL = ["--preset", "micro", "--batch_size", "4", "--seq_len", "32", "--eval_batches", "1", "--warmup", "2",
         "--samples", "0"]


@pytest.fixture(scope="module")
def world(base_world, tmp_path_factory):
    """tiny_world (byte-tokenized data, a micro AR model) plus its bidirectional DLM, and an AR model and DLM of the
    same shape whose tokenizer is a small learnt BPE instead (`other`, `other_dlm`)."""
    root = world_copy(base_world, tmp_path_factory, "inputs")
    bpe = train_bpe(["def f(x):\n    return x + 1\n" * 20], 280)
    Qwen3(preset("micro")).init_weights(1).save_pretrained(root / "other")
    bpe.save_pretrained(root / "other")
    convert(root / "other", root / "other_dlm", "bidirectional")
    return root


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_line(r):
    return r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""


def log_steps(out):
    return [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()]


def losses(out):
    return [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]


# ---- convert.py ------------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["same", "inside", "around"])
def test_convert_refuses_overlapping_directories(world, tmp_path, where):
    ar = tmp_path / "ar"
    convert_src = world / "ar"
    ar.mkdir()
    for f in convert_src.iterdir():
        (ar / f.name).write_bytes(f.read_bytes())
    before = {f.name: sha(f) for f in ar.iterdir()}
    out, src = {"same": (ar, ar), "inside": (ar / "dlm", ar), "around": (tmp_path, ar)}[where]
    with pytest.raises(SystemExit, match="overlap"):
        convert(src, out, "bidirectional", overwrite=True)
    assert {f.name: sha(f) for f in ar.iterdir()} == before  # the AR checkpoint is untouched
    r = run_script("convert.py", "--ar", src, "--out_dir", out, "--attn", "bidirectional", "--overwrite")
    assert r.returncode == 1 and "overlap" in one_line(r) and len(r.stderr.strip().splitlines()) == 1
    assert {f.name: sha(f) for f in ar.iterdir()} == before


def safetensors_reference(f):
    """The names the safetensors library itself reads (a file it cannot open raises)."""
    with safe_open(f, "pt") as sf:
        names = set(sf.keys())
        for k in names:
            sf.get_tensor(k)  # reading every tensor fails on a truncated file
    return names


def test_safetensors_check_matches_the_library_and_catches_truncation(world, tmp_path):
    f = world / "ar" / "model.safetensors"
    assert safetensors_names(f) == safetensors_reference(f)
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    cases = {"truncated": raw[:-1], "half": raw[:len(raw) // 2], "header_only": raw[:8 + n], "padded": raw + b"\0",
             "not_json": raw[:8] + b"x" * n + raw[8 + n:], "tiny": raw[:5]}
    for name, content in cases.items():
        bad = tmp_path / f"{name}.safetensors"
        bad.write_bytes(content)
        with pytest.raises(ValueError, match=re.escape(str(bad))):
            safetensors_names(bad)


def test_convert_refuses_a_truncated_checkpoint(world, tmp_path):
    ar = tmp_path / "ar"
    ar.mkdir()
    for f in (world / "ar").iterdir():
        (ar / f.name).write_bytes(f.read_bytes())
    raw = (ar / "model.safetensors").read_bytes()
    (ar / "model.safetensors").write_bytes(raw[:-100])
    r = run_script("convert.py", "--ar", ar, "--out_dir", tmp_path / "dlm", "--attn", "bidirectional")
    assert r.returncode == 1 and "model.safetensors" in r.stderr and "truncated" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "dlm").exists()


def sharded(world, d):
    """The micro AR checkpoint written as two shards and an index, as Hugging Face does for large models."""
    d.mkdir()
    state = {k: v for k, v in Qwen3.from_pretrained(world / "ar").state_dict().items() if k != "lm_head.weight"}
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[:len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for name, ks in shards.items():
        save_file({k: state[k].contiguous() for k in ks}, d / name, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: name for name, ks in shards.items() for k in ks}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (d / f).write_bytes((world / "ar" / f).read_bytes())
    return d, shards, index


def test_sharded_checkpoints_are_checked_too(world, tmp_path):
    ar, shards, index = sharded(world, tmp_path / "ar")
    c = convert(ar, tmp_path / "dlm", "bidirectional")  # a sound sharded checkpoint converts, shards copied
    assert c.attn == "bidirectional"
    assert all((tmp_path / "dlm" / s).read_bytes() == (ar / s).read_bytes() for s in shards)
    a, b = Qwen3.from_pretrained(world / "ar").state_dict(), Qwen3.from_pretrained(tmp_path / "dlm").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    second = ar / "model-00002-of-00002.safetensors"
    good = second.read_bytes()
    second.write_bytes(good[:-7])
    with pytest.raises(SystemExit, match=re.escape(str(second))):
        convert(ar, tmp_path / "dlm2", "bidirectional")
    assert not (tmp_path / "dlm2").exists()
    second.write_bytes(good)
    moved = dict(index["weight_map"], **{next(iter(shards["model-00002-of-00002.safetensors"])):
                                         "model-00001-of-00002.safetensors"})
    (ar / "model.safetensors.index.json").write_text(json.dumps(dict(index, weight_map=moved)))
    with pytest.raises(ValueError, match="does not hold them"):
        weight_files(ar)
    (ar / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a valid shard index"):
        weight_files(ar)


# ---- tokenizer fingerprints --------------------------------------------------------------------------

def test_fingerprint_follows_the_ids_not_the_file(tmp_path):
    byte, bpe = Tokenizer.byte_level(), train_bpe(["abcabcabd " * 50], 270)
    assert len({byte.fingerprint, bpe.fingerprint}) == 2 and re.fullmatch("[0-9a-f]{64}", bpe.fingerprint)
    bpe.save_pretrained(tmp_path / "a")
    assert Tokenizer.from_pretrained(tmp_path / "a").fingerprint == bpe.fingerprint  # a saved copy: the same
    spec = json.loads((tmp_path / "a/tokenizer.json").read_text())
    (tmp_path / "b").mkdir()
    (tmp_path / "b/tokenizer.json").write_text(json.dumps(spec, sort_keys=True))  # other formatting: the same
    assert fingerprint_of(tmp_path / "b") == bpe.fingerprint
    for change in ("rank", "special", "nfc"):  # anything that changes an id or how text is split: another one
        s = json.loads(json.dumps(spec))
        if change == "rank":
            (t1, i1), (t2, i2) = sorted(s["model"]["vocab"].items(), key=lambda kv: kv[1])[-2:]
            s["model"]["vocab"][t1], s["model"]["vocab"][t2] = i2, i1
        elif change == "special":
            s["added_tokens"][-1]["special"] = False
        else:
            s["normalizer"] = {"type": "NFC"}
        (tmp_path / change).mkdir()
        (tmp_path / change / "tokenizer.json").write_text(json.dumps(s))
        assert fingerprint_of(tmp_path / change) not in (None, bpe.fingerprint), change
    assert fingerprint_of(tmp_path / "nothing") is None


def test_data_and_checkpoints_record_the_fingerprint(world, tmp_path):
    fp = Tokenizer.byte_level().fingerprint
    assert json.loads((world / "data/meta.json").read_text())["tokenizer_sha256"] == fp
    assert json.loads((world / "dlm/config.json").read_text())["tokenizer_sha256"] == fp  # convert.py
    out = tmp_path / "ar"
    r = run_script("pretrain.py", "--data", world / "data", "--out_dir", out, "--max_iters", "2", *SMALL)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((out / "config.json").read_text())["tokenizer_sha256"] == fp  # save_checkpoint
    # a checkpoint written before fingerprints were recorded: computed from its tokenizer files
    cfg = json.loads((out / "config.json").read_text())
    del cfg["tokenizer_sha256"]
    (out / "config.json").write_text(json.dumps(cfg))
    assert Qwen3Config.load(out).tokenizer_sha256 is None  # as recorded
    assert trained_with(Qwen3Config.load(out)) == fp and trained_with(Qwen3.from_pretrained(out).config) == fp
    assert Qwen3Config.load(out).path == str(out) and "path" not in Qwen3.from_pretrained(out).config.to_dict()


def test_a_model_and_data_tokenized_differently_are_refused(world, tmp_path):
    other = Tokenizer.from_pretrained(world / "other").fingerprint
    byte = Tokenizer.byte_level().fingerprint
    before = sha(world / "other_dlm/tokenizer.json")
    r = run_script("align.py", "--init", world / "other_dlm", "--data", world / "data", "--out_dir", tmp_path / "a",
                   "--max_iters", "2", "--batch_size", "2", "--seq_len", "32", "--samples", "0")
    line = one_line(r)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert all(s in line for s in (str(world / "data"), str(world / "other_dlm"), other[:12], byte[:12])), line
    assert sha(world / "other_dlm/tokenizer.json") == before and not (tmp_path / "a" / "model.safetensors").exists()
    r = run_script("pretrain.py", "--init", world / "other", "--data", world / "data", "--out_dir", tmp_path / "p",
                   "--max_iters", "2", *SMALL)
    assert r.returncode == 1 and "tokenizer mismatch" in one_line(r) and str(world / "other") in one_line(r)


def test_training_helpers_refuse_other_tokenizers(world, tmp_path):
    student = Qwen3.from_pretrained(world / "dlm")
    with pytest.raises(SystemExit, match="tokenizer mismatch.*other"):  # a teacher of another tokenizer
        training.load_model(world / "other", "cpu", "align: teacher", like=student)
    assert training.load_model(world / "ar", "cpu", "teacher", like=student, attn="causal").config.attn == "causal"
    with pytest.raises(SystemExit, match="tokenizer mismatch.*data.*other_dlm"):  # data of another tokenizer
        data.load_splits(world / "data", "distill", like=Qwen3.from_pretrained(world / "other_dlm"))
    data.load_splits(world / "data", "distill", like=student)
    # a checkpoint's own tokenizer files replaced by another: refused, naming its config.json
    d = tmp_path / "replaced"
    d.mkdir()
    for f in (world / "dlm").iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    Tokenizer.from_pretrained(world / "other").save_pretrained(d)
    with pytest.raises(SystemExit, match="config.json.*replaced"):
        load_tokenizer(d, Qwen3Config.load(d))
    # a checkpoint never gets another tokenizer than the model's, nor one over a checkpoint's own (Run.save checks)
    model = Qwen3(preset("micro")).init_weights(0)
    out = tmp_path / "ckpt"
    Tokenizer.from_pretrained(world / "other").save_pretrained(out)
    kept = sha(out / "tokenizer.json")
    with pytest.raises(SystemExit, match="tokenizer mismatch"):
        check_saving(Tokenizer.byte_level(), model.config, out)
    assert model.config.tokenizer_sha256 is None
    model.config.tokenizer_sha256 = Tokenizer.from_pretrained(world / "other").fingerprint
    with pytest.raises(SystemExit, match="tokenizer mismatch"):
        check_saving(Tokenizer.byte_level(), model.config, tmp_path / "ckpt2")
    model.config.tokenizer_sha256 = None  # a new model: the tokenizer saved with it becomes its own
    check_saving(Tokenizer.byte_level(), model.config, tmp_path / "ckpt2")
    assert model.config.tokenizer_sha256 == Tokenizer.byte_level().fingerprint
    # and through a run: pretrain.py into a directory that holds another tokenizer leaves it as it was
    r = run_script("pretrain.py", "--data", world / "data", "--out_dir", out, "--max_iters", "1", *SMALL)
    assert r.returncode != 0 and "already holds" not in r.stderr and "tokenizer mismatch" in one_line(r)
    assert sha(out / "tokenizer.json") == kept and not (out / "model.safetensors").exists()


def test_data_py_does_not_replace_a_tokenizer_silently(world, tmp_path):
    out = tmp_path / "d"
    src = world / "src"
    assert run_script("lib/corpus.py", "--out_dir", out, "--source", src, "--tokenizer", "byte").returncode == 0
    assert run_script("lib/corpus.py", "--out_dir", out, "--source", src, "--tokenizer", "byte").returncode == 0  # same
    before = {f: sha(out / f) for f in ("tokenizer.json", "meta.json", "train.bin")}
    r = run_script("lib/corpus.py", "--out_dir", out, "--source", src, "--tokenizer", world / "other")
    assert r.returncode == 1 and "--overwrite" in one_line(r) and len(r.stderr.strip().splitlines()) == 1
    assert {f: sha(out / f) for f in before} == before
    r = run_script("lib/corpus.py", "--out_dir", out, "--source", src, "--tokenizer", world / "other", "--overwrite")
    assert r.returncode == 0 and fingerprint_of(out) == fingerprint_of(world / "other")


def test_failed_data_py_leaves_no_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="found 0 text documents"):
        corpus.prepare(str(tmp_path / "new" / "sub"), str(tmp_path / "empty"), tokenizer="byte")
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()
    with pytest.raises(ValueError):
        corpus.prepare(str(tmp_path / "kept"), str(tmp_path / "empty"), tokenizer="byte")
    assert (tmp_path / "kept").is_dir()  # a directory that was there stays


# ---- the kind of checkpoint, --device, --seq_len ---------------------------------------------------------

def test_load_model_refuses_another_kind(world, tmp_path):
    with pytest.raises(SystemExit, match=r"attn='bidirectional'.*attn='causal'.*converted from .*ar.*AR checkpoint"):
        training.load_model(world / "dlm", "cpu", "distill: teacher", attn="causal")
    r = run_script("pretrain.py", "--init", world / "dlm", "--data", world / "data", "--out_dir", tmp_path / "no",
                   "--max_iters", "2", *SMALL)
    assert r.returncode == 1 and "AR checkpoint" in one_line(r) and len(r.stderr.strip().splitlines()) == 1


def test_bad_device_and_seq_len_are_one_line(world, tmp_path):
    for device in ("gpu", "tpu", "cuda:x"):
        r = run_script("pretrain.py", "--data", world / "data", "--out_dir", tmp_path / "x", "--device", device, *SMALL)
        assert r.returncode == 1 and "auto, cpu, cuda or cuda:N" in one_line(r), r.stderr[-2000:]
        assert len(r.stderr.strip().splitlines()) == 1
    r = run_script("align.py", "--init", world / "dlm", "--data", world / "data", "--out_dir", tmp_path / "a",
                   "--seq_len", "100000")
    assert r.returncode == 1 and "--seq_len 100000" in one_line(r) and len(r.stderr.strip().splitlines()) == 1
    assert f"split of {world / 'data'}" in one_line(r) and not (tmp_path / "a").exists()


# ---- checkpoints: step 0, --save_dtype, --resume ---------------------------------------------------------

def saved_steps(monkeypatch):
    steps = []
    orig = Qwen3.save_pretrained

    def record(self, path, metadata=None, **kw):
        steps.append(int(metadata["step"]))
        return orig(self, path, metadata, **kw)
    monkeypatch.setattr(Qwen3, "save_pretrained", record)
    return steps


def test_no_checkpoint_at_step_0_unless_the_run_is_one_step(world, tmp_path, monkeypatch):
    steps = saved_steps(monkeypatch)
    common = ["--data", world / "data", "--eval_interval", "2", *SMALL]
    assert run_script("pretrain.py", *common, "--out_dir", tmp_path / "a", "--max_iters", "5").returncode == 0
    assert steps == [2, 4]
    steps.clear()
    assert run_script("pretrain.py", *common, "--out_dir", tmp_path / "b", "--max_iters", "1").returncode == 0
    assert steps == [0] and Qwen3.from_pretrained(tmp_path / "b")


def test_save_dtype_and_exact_resume(world, tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    common = ["--data", world / "data", "--max_iters", "8", "--eval_interval", "3", "--save_dtype", "bfloat16", *SMALL]
    assert run_script("pretrain.py", *common, "--out_dir", full).returncode == 0
    with safe_open(full / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    assert json.loads((full / "config.json").read_text())["torch_dtype"] == "bfloat16"
    state = torch.load(full / "train_state.pt", weights_only=False)
    assert state["weights"]["model.norm.weight"].dtype == torch.float32  # the exact weights, for --resume
    with killed_after_checkpoint(3):
        assert run_script("pretrain.py", *common, "--out_dir", cut).returncode == 3
    r = run_script("pretrain.py", *common, "--out_dir", cut, "--resume")
    assert r.returncode == 0, r.stderr[-2000:]
    assert losses(cut) == losses(full)[:3] + losses(full)[4:]  # step 3's own record was lost with the kill
    a, b = (torch.load(d / "train_state.pt", weights_only=False) for d in (full, cut))
    assert all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])
    # the default (auto) keeps the stored dtype: float32 for the micro preset, and no second copy
    r = run_script("pretrain.py", "--data", world / "data", "--out_dir", tmp_path / "f32", "--max_iters", "1", *SMALL)
    assert r.returncode == 0
    assert torch.load(tmp_path / "f32/train_state.pt", weights_only=False)["weights"] is None
    assert json.loads((tmp_path / "f32/config.json").read_text())["torch_dtype"] == "float32"


def test_weights_only_and_train_state_keeps_only_what_rounds(world, tmp_path):
    """--weights_only: checkpoints are the Hugging Face directory alone, and --resume says there is nothing to resume.
    Otherwise train_state.pt keeps the fp32 value only of the tensors the stored dtype rounds: a frozen embedding
    loaded from a bf16 checkpoint is stored exactly, so it is not kept, and --resume still reproduces the run."""
    out = tmp_path / "w"
    common = ["--data", world / "data", "--out_dir", out, "--eval_interval", "1", *SMALL]
    assert run_script("pretrain.py", *common, "--max_iters", "3", "--weights_only").returncode == 0
    assert Qwen3.from_pretrained(out) and not (out / "train_state.pt").exists()
    r = run_script("pretrain.py", *common, "--max_iters", "5", "--resume")
    assert r.returncode == 1 and "no train_state.pt" in one_line(r)

    bf16 = tmp_path / "bf16"  # the DLM stored in bf16, as Qwen3 checkpoints are
    Qwen3.from_pretrained(world / "dlm").to(torch.bfloat16).save_pretrained(bf16)
    Tokenizer.from_pretrained(world / "dlm").save_pretrained(bf16)
    full, cut = tmp_path / "full", tmp_path / "cut"
    args = ["--init", bf16, "--data", world / "data", "--batch_size", "4", "--seq_len", "32", "--eval_batches", "1",
            "--samples", "0", "--lambda_align", "0", "--freeze", "embed", "--max_iters", "6", "--ckpt_interval", "2"]
    assert run_script("align.py", *args, "--out_dir", full).returncode == 0
    state = torch.load(full / "train_state.pt", weights_only=False)
    trained = {n for n, q in Qwen3.from_pretrained(bf16).named_parameters() if "embed_tokens" not in n}
    assert set(state["weights"]) == trained  # the frozen embedding (and the tied head) not kept
    with killed_after_checkpoint(2):
        assert run_script("align.py", *args, "--out_dir", cut).returncode == 3
    r = run_script("align.py", *args, "--out_dir", cut, "--resume")
    assert r.returncode == 0, r.stderr[-2000:]
    assert losses(cut) == losses(full)[:2] + losses(full)[3:]  # step 2's own record was lost with the kill


def test_resume_refuses_changed_settings(world, tmp_path):
    out = tmp_path / "run"
    common = ["--data", world / "data", "--out_dir", out, "--eval_interval", "2", *SMALL]
    with killed_after_checkpoint(2):
        assert run_script("pretrain.py", *common, "--max_iters", "6").returncode == 3
    r = run_script("pretrain.py", *common, "--max_iters", "6", "--resume", "--lr", "1e-2", "--grad_clip", "0.5")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "--grad_clip 1.0 (now 0.5)" in one_line(r) and "--lr 0.006 (now 0.01)" in one_line(r)
    assert "--allow_changed_settings" in one_line(r) and log_steps(out) == [0, 1]
    r = run_script("pretrain.py", *common, "--max_iters", "4", "--resume", "--eval_interval", "1")  # may change
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_script("pretrain.py", *common, "--max_iters", "6", "--resume", "--lr", "1e-2", "--allow_changed_settings")
    assert r.returncode == 0, r.stderr[-2000:]
    assert log_steps(out) == [0, 1, 3, 4, 5]  # step 2's record was lost with the kill; nothing logged twice
    assert torch.load(out / "train_state.pt", weights_only=False)["extra"]["lr"] == 1e-2  # the new value, recorded


def test_training_refuses_a_colliding_mask_id_and_a_tokenizer_larger_than_the_model(world, tmp_path):
    """A DLM whose mask id is one of the tokenizer's ordinary ids (it would be trained, and sampled, as a token), and
    a model with fewer embedding rows than its tokenizer has ids: each refused in one line before training starts."""
    bad = tmp_path / "bad_dlm"
    shutil.copytree(world / "dlm", bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(dict(config, mask_token_id=65)))  # "A" in the byte tokenizer
    r = run_script("align.py", "--init", bad, "--data", world / "data", "--out_dir", tmp_path / "a", "--max_iters", 1,
                   "--batch_size", 2, "--seq_len", 32, "--samples", 0)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "mask_token_id 65 is an ordinary token" in r.stderr and not (tmp_path / "a").exists()
    with pytest.raises(SystemExit, match="uses 259 ids but the model has only 200 embedding rows"):
        load_tokenizer(world / "data", Qwen3Config(vocab_size=200))


def test_resume_refuses_a_corrupt_or_mismatched_train_state(world, tmp_path):
    """--resume from a train_state.pt that cannot be read, or that names another step than the weights: one line
    each, naming the file, and nothing written."""
    out = tmp_path / "run"
    common = ["--data", world / "data", "--out_dir", out, "--eval_interval", "2", "--max_iters", "6", *SMALL]
    with killed_after_checkpoint(2):
        assert run_script("pretrain.py", *common).returncode == 3
    state = (out / "train_state.pt").read_bytes()
    (out / "train_state.pt").write_bytes(state[:len(state) // 2])  # truncated, as a full disk leaves it
    r = run_script("pretrain.py", *common, "--resume")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "train_state.pt cannot be read" in r.stderr
    assert log_steps(out) == [0, 1]
    saved = torch.load(io.BytesIO(state), weights_only=False)
    torch.save(dict(saved, step=4), out / "train_state.pt")  # a step the weights are not from
    r = run_script("pretrain.py", *common, "--resume")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "weights are from step 2 but train_state.pt from step 4" in r.stderr and log_steps(out) == [0, 1]


def test_ctrl_c_is_one_line_and_resume_continues_exactly(world, tmp_path):
    """A real process, sent SIGINT mid-run: one line naming the step and the checkpoint, no traceback; --resume then
    cuts log.jsonl back to the checkpoint and reproduces an uninterrupted run (constant lr: min_lr = lr, so the
    schedule does not depend on --max_iters)."""
    cut, full = tmp_path / "cut", tmp_path / "full"
    common = ["--data", str(world / "data"), "--eval_interval", "4", "--lr", "3e-3", "--min_lr", "3e-3", *SMALL]
    cmd = [sys.executable, "pretrain.py", *common, "--out_dir", str(cut), "--max_iters", "100000"]
    # the child must handle SIGINT as in a terminal even if pytest inherited SIG_IGN (a background job): a Python
    # handler here becomes SIG_DFL at exec, where SIG_IGN would be inherited
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with open(tmp_path / "stderr", "w") as err:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
                                    env=dict(os.environ, OMP_NUM_THREADS="1"))
    finally:
        signal.signal(signal.SIGINT, outer)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if (cut / "log.jsonl").exists() and len((cut / "log.jsonl").read_text().splitlines()) >= 6:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        proc.kill()  # never leave a training run behind (a no-op once it has exited)
        proc.wait()
    err = (tmp_path / "stderr").read_text()
    assert proc.returncode in (130, -signal.SIGINT) and "Traceback" not in err, err[-3000:]
    m = re.search(r"pretrain\.py: interrupted at step (\d+); the last checkpoint is step (\d+) in (\S+): "
                  r"rerun with --resume\n", err)
    assert m and m.group(3) == str(cut), err[-3000:]
    step, ckpt = int(m.group(1)), int(m.group(2))
    logged = log_steps(cut)  # SIGINT may land just after step `step`'s record was written
    assert ckpt % 4 == 0 and ckpt <= step and logged in (list(range(step)), list(range(step + 1)))
    lost = {ckpt} - set(logged)  # interrupted between the checkpoint and its step's record: that record is lost
    end = ckpt + 3
    r = run_script("pretrain.py", *common, "--out_dir", cut, "--max_iters", end, "--resume")
    assert r.returncode == 0, r.stderr[-2000:]
    assert run_script("pretrain.py", *common, "--out_dir", full, "--max_iters", end).returncode == 0
    assert log_steps(cut) == [s for s in range(end) if s not in lost]
    assert losses(cut) == [x for s, x in enumerate(losses(full)) if s not in lost]


# ---- the one atomic writer -------------------------------------------------------------------------------

def test_one_atomic_writer_without_torch_in_the_tokenizer(tmp_path):
    from lib import tokenizer
    from lib import training
    assert checkpoint.atomic_write is training.atomic_write is tokenizer.atomic_write is atomic_write
    f = tmp_path / "x.json"
    f.write_text("old")

    def fail(name):
        Path(name).write_text("half")
        raise OSError("disk full")
    with pytest.raises(OSError):
        atomic_write(f, fail)
    assert f.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]
    atomic_write(f, lambda name: Path(name).write_text("new"))
    assert f.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]
    r = subprocess.run([sys.executable, "-c", "import sys; from lib import tokenizer; print('torch' in sys.modules)"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.stdout.strip() == "False", r.stderr


def test_ctrl_c_while_saving_waits_for_the_whole_checkpoint():
    """SIGINT between the weights and train_state.pt would leave a pair --resume refuses: it is held until both
    are written, then raised; the previous handler is back afterwards. A process that ignores SIGINT (a background
    job of a script inherits SIG_IGN) still ignores it inside the block and after."""
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whatever pytest inherited
    try:
        reached = []
        with pytest.raises(KeyboardInterrupt):
            with checkpoint.interrupts_deferred():
                os.kill(os.getpid(), signal.SIGINT)  # delivered now, held by the block
                time.sleep(0.05)
                reached.append("the rest of the block")
        assert reached == ["the rest of the block"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with checkpoint.interrupts_deferred():  # no signal: nothing raised
            pass
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            with checkpoint.interrupts_deferred():
                os.kill(os.getpid(), signal.SIGINT)  # ignored, as the process asked
                time.sleep(0.05)
        except KeyboardInterrupt:
            pytest.fail("a SIGINT the process ignores was raised by interrupts_deferred")
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, outer)
