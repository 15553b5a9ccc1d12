"""Several processes on a CPU (torchrun, gloo): two ranks reproduce the one-process run step for step. pretrain,
align (with a teacher and frozen tensors) and dpo log the same losses with --nproc_per_node=2 as alone, each
rank computing half of the --grad_accum micro-batches; distill runs on two ranks and writes one checkpoint, with the
same first losses as alone; --fsdp (FSDP2) gives the same losses as DDP and saves the same whole checkpoint. The
one-process runs are in-process; each two-process run starts torch twice (seconds on 2 cores)."""
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, run_script, world_copy
from model import Qwen3

SMALL = ["--batch_size", "2", "--seq_len", "32", "--eval_batches", "2", "--warmup", "2", "--grad_accum", "4"]
TOL = dict(rel=1e-5, abs=1e-6)


def torchrun(script, *args, n=2):
    """`torchrun --nproc_per_node=n script args...` in a subprocess -> CompletedProcess."""
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", "--master_addr=127.0.0.1",
           f"--master_port={port}", script, *map(str, args)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def log(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def same_losses(a, b, keys=("loss",)):
    la, lb = log(a), log(b)
    assert len(la) == len(lb) > 0
    for ra, rb in zip(la, lb):
        for k in keys:  # evaluation keys: at the evaluation steps only
            assert (k in ra) == (k in rb) and ra.get(k) == pytest.approx(rb.get(k), **TOL), (k, ra["step"])
    return la


def same_weights(a, b):
    wa, wb = Qwen3.from_pretrained(a).state_dict(), Qwen3.from_pretrained(b).state_dict()
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def world(base_world, tmp_path_factory):
    root = world_copy(base_world, tmp_path_factory)
    (root / "pairs.jsonl").write_text("".join(json.dumps(dict(prompt=f"def f{i}(x):\n", chosen=f"    return '{i}'",
                                                              rejected=f'    return "{i}"')) + "\n" for i in range(12)))
    return root


def both(world, tmp_path, script, *args, first=()):
    """The run alone (in-process) and on two ranks; -> (out_dir alone, out_dir on two ranks)."""
    one, two = tmp_path / "one", tmp_path / "two"
    r = run_script(script, *first, *args, "--out_dir", one)
    assert r.returncode == 0, r.stderr[-2000:]
    r = torchrun(script, *first, *args, "--out_dir", two)
    assert r.returncode == 0, r.stderr[-3000:]
    assert {rec["world_size"] for rec in log(one)} == {1} and {rec["world_size"] for rec in log(two)} == {2}
    assert json.loads((two / "results.json").read_text())["world_size"] == 2
    return one, two


def test_pretrain_two_ranks_equal_one(world, tmp_path):
    one, two = both(world, tmp_path, "pretrain.py", "--data", world / "data", "--preset", "micro", "--max_iters", 4,
                    "--eval_interval", 2, "--samples", 0, *SMALL)
    same_losses(one, two, ("loss", "grad_norm"))
    assert [r["val_loss"] for r in log(one) if "val_loss" in r] == \
        pytest.approx([r["val_loss"] for r in log(two) if "val_loss" in r], **TOL)
    same_weights(one, two)


def test_resume_under_torchrun_equals_the_uninterrupted_run(world, tmp_path):
    """Two ranks stopped after step 1 (its checkpoint, train_state.pt included) and --resume'd to step 3 log the
    losses and write the weights of the same two-rank run done in one go. A flat learning rate (--min_lr = --lr,
    no warmup) makes the 2-step run's schedule that of the 4-step one, so only the stop differs."""
    args = ["pretrain.py", "--data", world / "data", "--preset", "micro", "--eval_interval", 1, "--samples", 0,
            *SMALL, "--warmup", 0, "--lr", 1e-3, "--min_lr", 1e-3]
    full, cut = tmp_path / "full", tmp_path / "cut"
    for extra in (["--max_iters", 4, "--out_dir", full], ["--max_iters", 2, "--out_dir", cut],
                  ["--max_iters", 4, "--out_dir", cut, "--resume"]):
        r = torchrun(*args, *extra)
        assert r.returncode == 0, r.stderr[-3000:]
    assert [rec["step"] for rec in log(cut) if "loss" in rec] == [0, 1, 2, 3]
    same_losses(full, cut, ("loss", "grad_norm", "val_loss"))
    same_weights(full, cut)


@pytest.fixture(scope="module")
def align_runs(world, tmp_path_factory):
    """align with λ = 1 and the embedding frozen: alone, on two ranks (DDP), and on two ranks with --fsdp."""
    tmp = tmp_path_factory.mktemp("align")
    args = ["--init", world / "dlm", "--data", world / "data", "--max_iters", 3, "--eval_interval", 2,
            "--ckpt_interval", 2, "--lambda_align", 1, "--freeze", "embed", "--samples", 0, "--weights_only", *SMALL]
    one, two = both(world, tmp, "align.py", *args)
    r = torchrun("align.py", *args, "--out_dir", tmp / "fsdp", "--fsdp")
    assert r.returncode == 0, r.stderr[-3000:]
    return one, two, tmp / "fsdp"


def test_align_two_ranks_equal_one(align_runs):
    one, two, _ = align_runs
    same_losses(one, two, ("loss", "diff_loss", "align_loss", "grad_norm", "val_acc@0.5"))
    same_weights(one, two)


def test_fsdp_equals_ddp(align_runs):
    """FSDP2 (sharded student, its tensors not shared with the whole teacher) against DDP: the same losses, the
    same evaluation, and the checkpoint gathered to rank 0 holds the same weights."""
    _, two, fsdp = align_runs
    same_losses(two, fsdp, ("loss", "diff_loss", "align_loss", "grad_norm", "val_acc@0.5", "val_nelbo", "val_cos"))
    same_weights(two, fsdp)


def test_dpo_two_ranks_equal_one(world, tmp_path):
    one, two = both(world, tmp_path, "dpo.py", "--ar", world / "ar", "--pairs", world / "pairs.jsonl", "--heldout",
                    world / "pairs.jsonl", "--max_iters", 3, "--eval_interval", 2, "--lr", 1e-3, *SMALL)
    same_losses(one, two, ("loss", "reward_acc", "margin", "grad_norm", "heldout_loss"))
    same_weights(one, two)


def test_distill_two_ranks_write_one_checkpoint(world, tmp_path):
    """Each rank rolls out its share of the prompts, from seeds every rank draws: the first step (same weights,
    same rollouts) is the one-process step; later rollouts may differ by a float rounding, so only finite."""
    one, two = both(world, tmp_path, "distill.py", "--init", world / "block", "--data", world / "data",
                    "--max_iters", 2, "--eval_interval", 1, "--seq_len", 12, "--rollout_min", 8, "--rollout_max", 8,
                    "--num_prompts", 8, *SMALL)
    a, b = log(one), log(two)
    assert a[0]["loss"] == pytest.approx(b[0]["loss"], **TOL) and a[0]["kl"] == pytest.approx(b[0]["kl"], **TOL)
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in b)
    assert sorted(p.name for p in two.iterdir() if p.suffix == ".safetensors") == ["model.safetensors"]
    assert Qwen3.from_pretrained(two).config.attn == "block"


def test_refusals(world, tmp_path, monkeypatch):
    common = ["--data", world / "data", "--preset", "micro", "--out_dir", tmp_path / "x", "--max_iters", 1]
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun --nproc_per_node=2 sets it; parse_loop_args checks first
    r = run_script("pretrain.py", *common, "--grad_accum", 3)
    assert r.returncode == 2 and "--grad_accum 3 is not a multiple of the 2 processes" in r.stderr
    assert "use 4" in r.stderr
    r = run_script("pretrain.py", *common, "--grad_accum", 2, "--fsdp")
    assert r.returncode == 2 and "add --weights_only" in r.stderr
    r = run_script("pretrain.py", *common, "--grad_accum", 2, "--fsdp", "--weights_only", "--resume")
    assert r.returncode == 2 and "which an --fsdp run does not write" in r.stderr
    monkeypatch.delenv("WORLD_SIZE")
    r = run_script("pretrain.py", *common, "--fsdp", "--weights_only")
    assert r.returncode == 1 and "run under torchrun" in r.stderr
