"""The methods on the exact-answer world: align.py --loss_after masks answers only (windows at document starts)
and, with --tasks, logs exact match and tokens per forward at every evaluation; distill.py takes worlds/tasks.py's
prompts.jsonl and logs the same; the numbers logged are eval.py tasks' (a child process), equal to tasks.exact_match
on the last checkpoint in this process."""
import json

import pytest
import torch

import convert
import diffusion
from conftest import ROOT, killed_after_checkpoint, run_script
from model import Qwen3, preset
from lib import corpus
from lib import data
from lib import runner
from lib.tokenizer import Tokenizer
from worlds import tasks

TASK_KEYS = {"task_acc", "task_acc_sort", "task_acc_rev", "task_acc_add", "task_tpf", "task_pref"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The task world's files (small), prepared with the byte tokenizer ("=" is one token), a micro AR model with random
    weights, and its bidirectional and block conversions."""
    root = tmp_path_factory.mktemp("tasks")
    train, items = tasks.build(seed=0, n_train=600, n_heldout=4)
    tasks.write(root / "data", train, items, *tasks.prompts_and_pairs(train, items, n_prompts=40))
    corpus.prepare(str(root / "data"), source=str(root / "data/train.jsonl"), tokenizer="byte")
    Qwen3(preset("micro")).init_weights(0).save_pretrained(root / "ar")
    Tokenizer.byte_level().save_pretrained(root / "ar")
    convert.convert(root / "ar", root / "dlm", "bidirectional")
    convert.convert(root / "ar", root / "block", "block", block_size=4, shift=True)
    return root


def log(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def test_answer_only_masks(world, tmp_path, monkeypatch):
    """align.py --loss_after "=": every training window opens a document, and its masks (what diffusion_loss
    scores) fall on the answers and their eos only (data.after_separator), on every step."""
    tok, seen = Tokenizer.byte_level(), []
    sep = tok.encode("=")[0]
    orig = diffusion.diffusion_loss

    def spy(model, x0, xt, masked, *a, **kw):
        if torch.is_grad_enabled():  # a training step (the evaluation scores its fixed masks without grad)
            seen.append((x0.clone(), masked.clone()))
        return orig(model, x0, xt, masked, *a, **kw)
    monkeypatch.setattr(diffusion, "diffusion_loss", spy)
    r = run_script("align.py", "--init", world / "dlm", "--data", world / "data", "--out_dir", tmp_path / "a",
                   "--loss_after", "=", "--seq_len", 24, "--batch_size", 8, "--max_iters", 4, "--eval_interval", 4,
                   "--eval_batches", 1, "--samples", 0, "--lambda_align", 0)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(seen) == 4
    for x0, masked in seen:
        assert all(tok.decode(row[:4].tolist()) in ("sort", "rev ", "add ") for row in x0)  # windows open documents
        answers = data.after_separator(x0, sep, tok.eos_id)
        assert masked.any() and not (masked & ~answers).any()


def test_align_and_distill_log_the_task_world(world, tmp_path):
    d, heldout = world / "data", world / "data/heldout.jsonl"
    small = ["--batch_size", 4, "--max_iters", 3, "--eval_interval", 2, "--tasks", heldout, "--tasks_n", 2]
    r = run_script("align.py", "--init", world / "dlm", "--data", d, "--out_dir", tmp_path / "align", "--loss_after",
                   "=", "--seq_len", 24, "--eval_batches", 1, "--samples", 0, "--tasks_also", "1,0.5", *small)
    assert r.returncode == 0, r.stderr[-2000:]
    evals = [rec for rec in log(tmp_path / "align") if "val_nelbo" in rec]
    assert [rec["step"] for rec in evals] == [0, 2] and all(TASK_KEYS <= set(rec) for rec in evals)
    assert all(0 <= rec["task_acc"] <= 1 and rec["task_tpf"] > 0 for rec in evals)
    assert not (tmp_path / "align/task_eval").exists()  # the child's copy of the weights is gone
    final = Qwen3.from_pretrained(tmp_path / "align").eval()  # the last step's weights: the last record's
    tok, items = Tokenizer.from_pretrained(tmp_path / "align"), tasks.load_items(heldout, 2)
    res = tasks.exact_match(final, tok, items, threshold=0.9)
    assert {k: evals[-1][k] for k in TASK_KEYS} == pytest.approx(runner.task_record(res))
    for t in (1.0, 0.5):  # --tasks_also: the same prompts at each further threshold
        res = tasks.exact_match(final, tok, items, threshold=t)
        assert (evals[-1][f"task_acc@{t:g}"], evals[-1][f"task_tpf@{t:g}"]) == pytest.approx(
            (res["accuracy"], res["tokens_per_forward"]))
    r = run_script("distill.py", "--init", world / "block", "--teacher", world / "ar", "--prompts",
                   d / "prompts.jsonl", "--out_dir", tmp_path / "distill", "--seq_len", 16, "--rollout_min", 8,
                   "--rollout_max", 8, "--train_eos", "--eval_batches", 1, *small)
    assert r.returncode == 0, r.stderr[-2000:]
    evals = [rec for rec in log(tmp_path / "distill") if "val_kl" in rec]
    assert [rec["step"] for rec in evals] == [0, 2] and all(TASK_KEYS <= set(rec) for rec in evals)
    bad = run_script("align.py", "--init", world / "dlm", "--data", d, "--out_dir", tmp_path / "bad", "--loss_after",
                     "sort", *small)
    assert bad.returncode != 0 and "--loss_after 'sort' is 4 tokens" in bad.stderr
    bad = run_script("align.py", "--init", world / "dlm", "--data", d, "--out_dir", tmp_path / "bad", "--tasks",
                     tmp_path / "none.jsonl")
    assert bad.returncode == 2 and "no such file" in bad.stderr
    bad = run_script("align.py", "--init", world / "dlm", "--data", d, "--out_dir", tmp_path / "bad", "--tasks",
                     heldout, "--tasks_also", "0.9,1.5")
    assert bad.returncode == 2 and "'0.9,1.5' is not a comma-separated list of numbers in (0, 1]" in bad.stderr


def test_align_with_tasks_resumes_exactly(world, tmp_path):
    """Killed after its step-2 checkpoint and resumed, align.py --tasks logs what the uninterrupted run logs, the
    exact match that eval.py computed on each evaluation step's weights included."""
    d, full, cut = world / "data", tmp_path / "full", tmp_path / "cut"
    args = ["--init", world / "dlm", "--data", d, "--loss_after", "=", "--seq_len", 24, "--eval_batches", 1,
            "--samples", 0, "--batch_size", 4, "--max_iters", 4, "--eval_interval", 3, "--ckpt_interval", 2,
            "--tasks", d / "heldout.jsonl", "--tasks_n", 2]
    assert run_script("align.py", *args, "--out_dir", full).returncode == 0
    with killed_after_checkpoint(2):
        assert run_script("align.py", *args, "--out_dir", cut).returncode == 3
    r = run_script("align.py", *args, "--out_dir", cut, "--resume")
    assert r.returncode == 0, r.stderr[-2000:]
    def keep(recs):
        return [{k: v for k, v in x.items() if k in {"step", "loss", "diff_loss", "align_loss"} | TASK_KEYS}
                for x in recs]
    got, want = keep(log(cut)), keep(log(full))
    assert got == want[:2] + want[3:] and TASK_KEYS <= set(got[-1])  # step 2's own record went with the kill


def test_eos_grid_runs_every_rule_and_setting(world, tmp_path):
    """scripts/eos_grid.py on the tiny world: every rule, threshold, block and canvas decoded on the same prompts,
    each prompt's forwards split adding up, and its tables printed."""
    r = run_script("scripts/eos_grid.py", "--run", world, "--data", world / "data", "--models", "dlm", "block",
                   "--num_prompts", 2, "--out", tmp_path / "g.json")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads((tmp_path / "g.json").read_text())
    assert len(out["teacher"]["correct"]) == 6 and len(out["rows"]) == 2 * 2 * 4 + 2 * 4
    assert {(x["model"], x["canvas"], x["block"]) for x in out["rows"]} == {
        ("dlm", 6, 6), ("dlm", 8, 4), ("dlm", 16, 16), ("dlm", 16, 4), ("block", 8, 4), ("block", 16, 4)}
    for row in out["rows"]:
        assert set(row["rules"]) == {"free", "last", "penalty 1", "penalty 3"}
        for rows in row["rules"].values():
            assert len(rows) == 6 and all(x["forwards_answer"] + x["forwards_after"] == x["forwards"] for x in rows)
    assert "| dlm | 6 | 6 | 0.5 |" in r.stdout and "Within 2 points of the AR teacher's exact match" in r.stdout


@pytest.mark.parametrize("world,stages", [
    ("tasks", ["-m worlds.tasks", "pretrain.py", "align.py", "distill.py", "dpo.py", "merge.py merge", "eval.py tasks",
               "-m scripts.report tasks_world"]),
    ("stdlib", ["-m lib.corpus", "pretrain.py", "align.py", "distill.py", "dpo.py", "merge.py merge",
                "eval.py generate", "-m scripts.report stdlib_world"])])
def test_run_sh_names_every_stage_of_a_world(world, stages, tmp_path):
    """bash run.sh tasks / stdlib, dry: a stand-in Python that only logs its arguments runs every stage, so an unset
    variable or a broken line in any stage fails here (the real chains take minutes; run.sh real has its own test)."""
    import os
    import shutil
    import subprocess
    shutil.copy(ROOT / "run.sh", tmp_path / "run.sh")
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    (tmp_path / "out" / "tasks").mkdir(parents=True)
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/calls.log\n')
    fake.chmod(0o755)
    r = subprocess.run(["bash", str(tmp_path / "run.sh"), world], capture_output=True, text=True,
                       env=dict(os.environ, PYTHON=str(fake)), cwd=tmp_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    calls = (tmp_path / "calls.log").read_text()
    for s in stages:
        assert s in calls, s
    assert "run.sh: done in" in r.stdout


def test_pip_once_installs_once_per_environment_and_again_when_a_requirement_changes(tmp_path):
    """scripts/python_env.sh's pip_once: a stand-in Python in a stand-in virtual environment logs its pip calls; the
    same install twice runs pip once, a changed constraints.txt or other arguments run it again, and outside a virtual
    or conda environment it runs every time (no stamp is written there)."""
    import os
    import shutil
    import subprocess
    shutil.copy(ROOT / "scripts" / "python_env.sh", tmp_path / "python_env.sh")
    (tmp_path / "requirements.txt").write_text("torch\n")
    (tmp_path / "constraints.txt").write_text("torch==2.13.0\n")
    env_dir = tmp_path / "venv"
    env_dir.mkdir()
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nif [ "$1" = -c ]; then echo "$PREFIX"; else echo "$*" >> {tmp_path}/pip.log; fi\n')
    fake.chmod(0o755)

    def pip_calls(*args, prefix=env_dir):
        script = f"set -euo pipefail; source python_env.sh; pip_once {' '.join(args)}"
        r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path,
                           env=dict(os.environ, PYTHON=str(fake), PREFIX=str(prefix)))
        assert r.returncode == 0, r.stderr
        log = tmp_path / "pip.log"
        return len(log.read_text().splitlines()) if log.exists() else 0

    assert pip_calls("-r", "requirements.txt") == 1  # no virtual environment yet: no stamp
    (env_dir / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert pip_calls("-r", "requirements.txt") == 2 and pip_calls("-r", "requirements.txt") == 2  # once
    assert pip_calls("gguf") == 3 and pip_calls("gguf") == 3  # other arguments: their own stamp
    (tmp_path / "constraints.txt").write_text("torch==2.14.0\n")
    assert pip_calls("-r", "requirements.txt") == 4
    assert "-m pip install -q --disable-pip-version-check -r requirements.txt -c constraints.txt" in \
        (tmp_path / "pip.log").read_text()
