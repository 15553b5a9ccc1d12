"""worlds/realworld.py: each family's checker on replies written here (right and wrong ones: the words alone, in order),
the split by prompt hash, the prompts' files, and evaluate's scores and counts on tiny chat models."""
import json
import math
import shutil

import pytest
import torch

from conftest import run_script, world_copy
from model import Qwen3
from lib import data
from lib.tokenizer import Tokenizer
from worlds import realworld as R


def item(family, prompt, answer):
    return dict(family=family, prompt=prompt, answer=answer)


def test_checkers_read_replies_as_a_person_would():
    s = item("sum", "What is 12 + 7? Reply with the number only.", "19")
    assert R.check(s, "19") and R.check(s, "The answer is 19.") and R.check(s, "12 + 7 = 19") and R.check(s, "19\n")
    assert not R.check(s, "9") and not R.check(s, "119") and not R.check(s, "nineteen") and not R.check(s, "")
    assert not R.check(s, "19 + 1 = 20")
    cap = item("capital", "What is the capital of France?", "Paris")
    assert R.check(cap, "The capital of France is Paris.") and R.check(cap, "paris")
    assert not R.check(cap, "The capital of France is Lyon.")
    rev = item("reverse", "Write these words in reverse order: apple, river, stone.", "stone river apple")
    assert R.check(rev, "stone, river, apple") and R.check(rev, "Stone River Apple.")
    assert not R.check(rev, "apple, river, stone") and not R.check(rev, "Here: stone, river, apple")
    n = item("letters", 'How many letters are in the word "river"? Reply with the number only.', "5")
    assert R.check(n, "5") and not R.check(n, "6")


def test_items_answer_their_own_prompts():
    rng = R.random.Random(0)
    for _ in range(200):
        f = rng.choice(R.FAMILIES)
        it = R.make(f, rng)
        words = it["prompt"].split(": ")[-1].rstrip(".").split(", ")
        want = {"sum": lambda: str(sum(int(x) for x in it["prompt"][8:].split("?")[0].split(" + "))),
                "letters": lambda: str(len(it["prompt"].split('"')[1])),
                "capital": lambda: R.CAPITALS[next(c for c in R.CAPITALS if f" {c}?" in it["prompt"]
                                                   or f" {c}." in it["prompt"])],
                "copy": lambda: " ".join(words), "reverse": lambda: " ".join(words[::-1]),
                "sort": lambda: " ".join(sorted(words))}[f]()
        assert it["answer"] == want and R.check(it, it["answer"]), it


def test_split_is_by_prompt_hash_and_the_files_are_written(tmp_path):
    train, held = R.build(seed=1, n_train=300, n_heldout=5)
    assert len(train) == 300 and len(held) == 5 * len(R.FAMILIES)
    assert all(data.is_val(it["prompt"], 0.2) for it in held) and not any(data.is_val(it["prompt"], 0.2)
                                                                          for it in train)
    assert len({it["prompt"] for it in train + held}) == len(train) + len(held)
    assert R.build(seed=1, n_train=300, n_heldout=5) == (train, held)
    r = run_script("worlds/realworld.py", "--out_dir", tmp_path, "--per_family", 3)
    assert r.returncode == 0 and "held-out prompts" in r.stdout, r.stderr
    rows = [json.loads(line) for line in (tmp_path / "heldout.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * len(R.FAMILIES) and set(rows[0]) == {"family", "prompt", "answer"}
    assert run_script("worlds/realworld.py").returncode == 2  # neither --ckpt nor --out_dir


def test_validation_prompts_are_training_prompts_no_chat_reaches():
    """--split validation: per family the first n prompts of the training list's second half, so neither the
    held-out prompts nor the chat data (the first --chats training prompts, at most half) are among them."""
    train, held = R.build(seed=1, n_train=300, n_heldout=5)
    val = R.validation(train, R.FAMILIES, 4)
    assert [it["family"] for it in val] == [f for f in R.FAMILIES for _ in range(4)]
    assert all(it in train[150:] for it in val) and not any(it in train[:150] or it in held for it in val)
    for f in R.FAMILIES:
        assert [it for it in val if it["family"] == f] == [it for it in train[150:] if it["family"] == f][:4]
    r = run_script("worlds/realworld.py", "--ckpt", "x", "--out_dir", "y", "--chats", 1001)
    assert r.returncode == 2 and "--chats 1001: at most 1000" in r.stderr
    r = run_script("worlds/realworld.py", "--ckpt", "x", "--out_dir", "y", "--chats", 5, "--split", "validation")
    assert r.returncode == 2 and "--split heldout" in r.stderr


# ---- evaluate: every reply scored, counted and compared with the teacher's ---------------------------------------

@pytest.fixture(scope="module")
def chat_world(base_world, tmp_path_factory):
    from test_chat_data import with_template
    root = world_copy(base_world, tmp_path_factory, "realworld")
    for name in ("ar", "block_shift", "dlm"):
        with_template(root / name, root / f"{name}_chat")
    return root


def test_token_f1_by_hand():
    assert R.token_f1("Paris", "paris.") == 1.0 and R.token_f1("The capital is Paris", "Paris") == 2 / 5
    assert R.token_f1("a a b", "a b b") == 2 * 2 / 6 and R.token_f1("x", "y") == 0.0
    assert R.token_f1("", "") == 1.0 and R.token_f1("", "Paris") == 0.0 and R.token_f1("...", "") == 1.0


def test_evaluate_scores_counts_and_agrees_with_a_slow_reference(chat_world):
    """evaluate on a tiny AR model and a block DLM in a chat template: accuracy is the checker's share, an AR reply
    costs one forward a token, a model agrees with its own replies, each DLM row's forwards split into answer and
    after; nelbo_bits of the AR model is the plain sum of -log2 p over the answers' tokens (and <|im_end|>)."""
    items = R.build(seed=0, n_train=0, n_heldout=2, families=("sum", "capital"))[1]
    ar = Qwen3.from_pretrained(chat_world / "ar_chat").eval()
    tok = Tokenizer.from_pretrained(chat_world / "ar_chat")
    run = R.evaluate(ar, tok, items, max_new_tokens=8)["greedy"]
    texts = [r["reply"] for r in run["rows"]]
    assert run["accuracy"] == sum(R.check(it, t) for it, t in zip(items, texts)) / 4 and run["canvas"] == 8
    assert run["tokens_per_forward"] == 1.0 and run["forwards_after"] == 0 and "agree" not in run
    assert run["full_stop"] == sum(R.full_stop(t) for t in texts) / 4
    assert [R.full_stop(t) for t in ("Paris.", "Paris. ", "3......", "Why?.", ".", "Paris")] == [True, True, False,
                                                                                               False, False, False]
    own = R.evaluate(ar, tok, items, teacher=texts, max_new_tokens=8)["greedy"]
    assert own["agree"] == own["f1"] == 1.0 and [r["reply"] for r in own["rows"]] == texts
    other = R.evaluate(ar, tok, items, teacher=["Paris."] * 4, max_new_tokens=8)["greedy"]
    assert other["agree"] == sum(t == "Paris." for t in texts) / 4
    assert other["f1"] == pytest.approx(sum(R.token_f1(t, "Paris.") for t in texts) / 4)
    blk = Qwen3.from_pretrained(chat_world / "block_shift_chat").eval()
    runs = R.evaluate(blk, tok, items, thresholds=[0.5, 1.0], teacher=texts, max_new_tokens=8)
    assert set(runs) == {"0.5", "1"}
    for run in runs.values():
        assert all(r["forwards_answer"] >= 1 and r["forwards_answer"] + r["forwards_after"] <= 8 for r in run["rows"])
        assert run["tokens_per_forward"] == pytest.approx(sum(r["tokens_per_forward"] for r in run["rows"]) / 4)
    assert all(r["tokens_per_forward"] <= 1.0 for r in runs["1"]["rows"])  # at most one token a forward at 1.0
    end, want, n = tok.special_tokens["<|im_end|>"], 0.0, 0
    with torch.no_grad():
        for it, t in zip(items, texts):
            x, y = R.prompt_ids(tok, it), tok.encode(t) + [end]
            logp = ar(torch.tensor([x + y]))[0].float().log_softmax(-1)  # (T, V), causal
            want -= sum(logp[len(x) + i - 1, j].item() for i, j in enumerate(y))
            n += len(y)
    assert R.nelbo_bits(ar, tok, items, texts) == pytest.approx(want / n / math.log(2), rel=1e-4)
    bound = R.nelbo_bits(blk, tok, items, texts)
    assert bound > 0 and bound == R.nelbo_bits(blk, tok, items, texts)  # fixed draws: the same number again


def test_block_length_decodes_the_masked_canvas_in_blocks(chat_world, tmp_path):
    """--block_length: the masked student's replies are its sampler's own at that block length (the blocks
    themselves: tests/test_sample.py), recorded in --out; refused for a block model and for a length that does not
    divide the canvas."""
    import sample
    items = R.build(seed=0, n_train=0, n_heldout=2, families=("sum", "capital"))[1]
    dlm = Qwen3.from_pretrained(chat_world / "dlm_chat").eval()
    tok = Tokenizer.from_pretrained(chat_world / "dlm_chat")
    run = R.evaluate(dlm, tok, items, thresholds=[0.9], max_new_tokens=8, block_length=4)["0.9"]
    ends = tok.end_ids(dlm.config, turn=True)
    g = torch.Generator().manual_seed(1337)
    gen = sample.generate(dlm, [R.prompt_ids(tok, it) for it in items], 8, eos_id=ends, generator=g,
                          vocab_limit=tok.vocab_size, block_length=4, threshold=0.9, record=True)
    assert [r["reply"] for r in run["rows"]] == [tok.decode(sample.until_end(gen.generated[b].tolist(), ends))
                                                 for b in range(len(items))]
    out = tmp_path / "r.json"
    r = run_script("worlds/realworld.py", "--ckpt", chat_world / "dlm_chat", "--max_new_tokens", 8, "--per_family", 1,
                   "--families", "sum", "--thresholds", "0.9", "--block_length", 4, "--out", out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(out.read_text())["block_length"] == 4
    r = run_script("worlds/realworld.py", "--ckpt", chat_world / "block_shift_chat", "--max_new_tokens", 8,
                   "--per_family", 1, "--families", "sum", "--block_length", 4)
    assert r.returncode != 0 and "--block_length is the masked sampler's" in r.stderr
    r = run_script("worlds/realworld.py", "--ckpt", chat_world / "dlm_chat", "--max_new_tokens", 8, "--block_length", 3)
    assert r.returncode == 2 and "a divisor of --max_new_tokens 8" in r.stderr


def test_full_stop_pairs_in_the_chat_template(chat_world, tmp_path):
    """stop_pairs: a reply with and without its closing full stop, the rest the model's own; data.tokenized_pairs
    reads such a chat pair as the user turn in the template and each response closed by <|im_end|>."""
    items = [item("sum", "What is 1 + 2?", "3"), item("capital", "Capital of Peru?", "Lima"), item("sum", "x", "1")]
    pairs = R.stop_pairs(items, ["3", "It is Lima. ", "."])
    assert pairs == [dict(prompt="What is 1 + 2?", chosen="3.", rejected="3", chat=True),
                     dict(prompt="Capital of Peru?", chosen="It is Lima.", rejected="It is Lima", chat=True)]
    f = tmp_path / "pairs.jsonl"
    f.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    tok = Tokenizer.from_pretrained(chat_world / "ar_chat")
    (x, yw, yl), _ = data.tokenized_pairs(f, tok, 200)
    end = tok.special_tokens["<|im_end|>"]
    assert x == R.prompt_ids(tok, items[0]) and yw == tok.encode("3.") + [end] and yl == tok.encode("3") + [end]


def test_real_arms_chains_every_stage_at_a_toy_size(chat_world, tmp_path):
    """bash scripts/real_arms.sh, two steps a stage, on the tiny chat AR model in place of SmolLM2 (REAL_AR): every
    stage runs, each model is scored, and the table names every model with its numbers."""
    import os
    import subprocess
    import sys

    from conftest import ROOT, randomise
    ar = tmp_path / "ar"  # larger random weights than init_weights': replies of varied bytes, not an end token at once
    shutil.copytree(chat_world / "ar_chat", ar)
    randomise(Qwen3.from_pretrained(ar), seed=1).save_pretrained(ar)
    env = dict(os.environ, PYTHON=sys.executable, REAL_AR=str(ar), REAL_DATA=str(tmp_path / "d"),
               REAL_OUT=str(tmp_path / "o"), REAL_PER_FAMILY="2", REAL_CHATS="24", REAL_CANVAS="8", REAL_STEPS="2",
               REAL_DISTILL_STEPS="2", REAL_DPO_STEPS="2", REAL_SEQ_LEN="160", REAL_EVAL_INTERVAL="1",
               REAL_THRESHOLDS="0.9,1", REAL_LR_SFT="3e-4", REAL_LR_ALIGN="1e-3", REAL_SEED="7")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "real_arms.sh")], capture_output=True, text=True, env=env,
                       cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    table = (tmp_path / "o" / "results.md").read_text()
    for name in ("AR teacher", "REPR-ALIGN, λ = 10", "as long as λ = 10 takes", "OPDLM (`distill.py`)",
                 "off-policy", "AR-MAP", "DPO on its ELBO", "threshold 0.9 | threshold 1", "AR-MAP: γ ="):
        assert name in table, name
    ar = json.loads((tmp_path / "o" / "eval" / "ar.json").read_text())
    assert ar["prompts"] == 4 and len((tmp_path / "d" / "pairs_heldout.jsonl").read_text().splitlines()) <= 4
    for m in ("align", "distill", "merged", "dlm-dpo"):
        res = json.loads((tmp_path / "o" / "eval" / f"{m}.json").read_text())
        assert set(res["runs"]) == {"0.9", "1"} and res["nelbo_bits"] > 0
    first = {m: json.loads((tmp_path / "o" / m / "log.jsonl").read_text().splitlines()[0])["lr"]
             for m in ("align0", "align0-time", "align")}  # step 0 of the same warmup: lr / warmup
    assert first["align0"] == pytest.approx(first["align0-time"]) == pytest.approx(0.3 * first["align"])  # 3e-4, 1e-3
    r = run_script("scripts/report.py", "real_verdicts", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    assert "| REPR-ALIGN converges faster than λ = 0 | align against align0-time | right |" in r.stdout
    assert "| AR-MAP beats DPO on the DLM itself | merged against dlm-dpo | full_stop |" in r.stdout
    # the end-token rules on the run's DLMs: under free, on the run's canvas and block, the run's own replies
    r = run_script("scripts/eos_grid.py", "--world", "real", "--run", tmp_path / "o", "--num_prompts", 2,
                   "--canvases", 8, "--out", tmp_path / "g.json")
    assert r.returncode == 0, r.stderr[-2000:]
    grid = json.loads((tmp_path / "g.json").read_text())
    assert grid["teacher"]["correct"] == [row["right"] for row in ar["runs"]["greedy"]["rows"]]
    assert {(x["model"], x["canvas"], x["block"]) for x in grid["rows"]} == {("align", 8, 8), ("align", 8, 4),
                                                                             ("distill", 8, 4)}
    for m in ("align", "distill"):
        res = json.loads((tmp_path / "o" / "eval" / f"{m}.json").read_text())
        for row in (x for x in grid["rows"] if x["model"] == m and x["block"] == (8 if m == "align" else 4)):
            want = res["runs"].get(f"{row['threshold']:g}")
            if want:  # the run decoded at 0.9 and 1
                assert [x["correct"] for x in row["rules"]["free"]] == [x["right"] for x in want["rows"]]
                assert [x["forwards_answer"] for x in row["rules"]["free"]] == [x["forwards_answer"] for x in
                                                                                want["rows"]]
        for row in (x for x in grid["rows"] if x["model"] == m):
            assert set(row["rules"]) == {"free", "last", "penalty 1", "penalty 3"}
    assert "| align | 8 | 4 | 0.5 |" in r.stdout
    # REAL_ARMS: some models alone, in a seed's folder beside the first (the teacher's scores copied, as
    # repro_real.sh does): only those trained and scored, and the verdicts leave out what the seed lacks
    (tmp_path / "s2" / "eval").mkdir(parents=True)
    seed2 = dict(env, REAL_OUT=str(tmp_path / "s2"), REAL_ARMS="align", REAL_SEED="8")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "real_arms.sh")], capture_output=True, text=True, cwd=ROOT,
                       env=seed2)  # without the teacher's scores: one line naming the fix, nothing trained
    assert r.returncode == 1 and "copy it from the folder that made" in r.stderr
    assert not (tmp_path / "s2" / "dlm").exists()
    shutil.copy(tmp_path / "o" / "eval" / "ar.json", tmp_path / "s2" / "eval" / "ar.json")
    r = subprocess.run(["bash", str(ROOT / "scripts" / "real_arms.sh")], capture_output=True, text=True, cwd=ROOT,
                       env=seed2)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert sorted(p.name for p in (tmp_path / "s2" / "eval").iterdir()) == ["align.json", "ar.json"]
    assert not (tmp_path / "s2" / "align0").exists() and not (tmp_path / "s2" / "ar-dpo").exists()
    assert "REPR-ALIGN, λ = 10" in (tmp_path / "s2" / "results.md").read_text()
    r = run_script("scripts/report.py", "real_verdicts", tmp_path / "o", tmp_path / "s2")
    assert r.returncode == 0, r.stderr
    assert "align against" not in r.stdout and "| o | align |" in r.stdout and "| s2 | align |" in r.stdout


def test_run_sh_real_converts_at_a_toy_size(chat_world, tmp_path):
    """bash run.sh real on a tiny chat AR model in place of SmolLM2 (REAL_AR; its end token's embedding doubled, so
    that about half its replies end within the canvas): the data, the block conversion, two steps of training on
    packed conversations, the teacher and the student on the held-out sums, capitals and open prompts, the table;
    a second run reuses every stage."""
    import os
    import subprocess
    import sys

    from conftest import ROOT, randomise
    ar = tmp_path / "ar"
    shutil.copytree(chat_world / "ar_chat", ar)
    model = randomise(Qwen3.from_pretrained(ar), seed=1)
    with torch.no_grad():
        model.model.embed_tokens.weight[Tokenizer.from_pretrained(ar).special_tokens["<|im_end|>"]] *= 2
    model.save_pretrained(ar)
    env = dict(os.environ, PYTHON=sys.executable, REAL_AR=str(ar), REAL_DATA=str(tmp_path / "d"),
               REAL_OUT=str(tmp_path / "o"), REAL_PER_FAMILY="2", REAL_CHATS="40", REAL_CANVAS="16", REAL_STEPS="2",
               REAL_SEQ_LEN="192", REAL_ROWS="2", REAL_THRESHOLDS="0.9,1", REAL_COMPILE="", REAL_VAL_FRACTION="0.3")
    r = subprocess.run(["bash", str(ROOT / "run.sh"), "real"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    table = (tmp_path / "o" / "results.md").read_text()
    for name in ("teacher (AR)", "student, threshold 0.9", "student, threshold 1 ", "kept", "F1 (open)",
                 "2 capital, 2 sum, 2 open"):
        assert name in table, name
    student = json.loads((tmp_path / "o" / "student" / "config.json").read_text())
    assert student["attn"] == "block" and student["block_size"] == 4 and student["shift"] is True
    res = json.loads((tmp_path / "o" / "eval" / "student.json").read_text())
    assert set(res["runs"]) == {"0.9", "1"} and res["nelbo_bits"] > 0 and res["prompts"] == 6
    assert {r["family"] for r in res["runs"]["0.9"]["rows"]} == {"sum", "capital", "open"}
    assert len((tmp_path / "d" / "validation.jsonl").read_text().splitlines()) == 150  # the sweeps' split
    log = [json.loads(line) for line in (tmp_path / "o" / "student" / "log.jsonl").read_text().splitlines()]
    assert len([x for x in log if "loss" in x]) == 2
    assert "--time_budget" in r.stdout  # the minutes the budget left, REAL_STEPS capping them
    env["REAL_MINUTES"] = "1"  # gone already: a finished student is reused all the same
    r = subprocess.run(["bash", str(ROOT / "run.sh"), "real"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.count("reusing") == 6 and (tmp_path / "o" / "results.md").read_text() == table
    shutil.rmtree(tmp_path / "o" / "student")
    r = subprocess.run(["bash", str(ROOT / "run.sh"), "real"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 1 and "no time left to train (raise REAL_MINUTES)" in r.stderr.strip().splitlines()[-1]


def dry_run(tmp_path, script, **env):
    """scripts/SCRIPT run in tmp_path (a copy of scripts/, the files run.sh real leaves that it checks for) with a
    stand-in Python that only logs its arguments -> (the finished process, the logged calls so far)."""
    import os
    import subprocess

    from conftest import ROOT
    if not (tmp_path / "scripts").exists():
        shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
        for f in ("out/real/eval/ar.json", "out/real/block/config.json", "out/real/dlm/config.json"):
            (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / f).write_text("{}")
        fake = tmp_path / "python"
        fake.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/calls.log\n'  # and the --snapshots directories
                        'while [ $# -gt 1 ]; do case $1 in --snapshots) s=$2;; --out_dir) o=$2;; esac; shift; done\n'
                        'for n in $(echo ${s:-} | tr , " "); do mkdir -p $o/step-$n; done\n')
        fake.chmod(0o755)
    r = subprocess.run(["bash", str(tmp_path / "scripts" / script)], capture_output=True, text=True, cwd=tmp_path,
                       env=dict(os.environ, PYTHON=str(tmp_path / "python"), **env))
    log = tmp_path / "calls.log"
    return r, log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("arm,init", [("block0", "out/real/block"), ("masked0", "out/real/dlm"),
                                      ("align", "out/real/dlm"), ("opdlm", "out/real/block"),
                                      ("opdlm_off", "out/real/block")])
def test_repro_conversion_names_every_stage(arm, init, tmp_path):
    """scripts/repro_conversion.sh, dry: a stand-in Python that only logs its arguments; the arm trains from its
    conversion with its snapshots, every snapshot is scored (the last at every threshold), then the curve."""
    r, calls = dry_run(tmp_path, "repro_conversion.sh", ARM=arm, STEPS="40", SNAPS="10,20")
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    train = next(c for c in calls if c.startswith(("align.py", "distill.py")))
    assert f"--init {init}" in train and "--snapshots 10,20,40" in train and "--autocast fast " in train
    if arm.startswith("opdlm"):  # rolled out on the training prompts, which the data stage writes when missing
        assert train.startswith("distill.py") and "--prompts data/real/prompts.jsonl" in train
        assert f"--policy {'on' if arm == 'opdlm' else 'off'}" in train and "--rollout_max 32" in train
        data = [k for k, c in enumerate(calls) if c.startswith("-m worlds.conversion --ckpt out/real/ar --out_dir "
                                                              "data/real --chats 5000")]
        assert len(data) == 1 and data[0] < calls.index(train)
    else:
        assert train.startswith("align.py") and "--assistant_only" in train and "--compile" in train
    R = f"out/conversion/{arm}-1e-4-s1337"
    evals = [c for c in calls if c.startswith("-m worlds.realworld")]
    assert [e.split()[3] for e in evals] == [f"{R}/step-{s}" for s in (10, 20, 40)]
    assert "--thresholds 0.9 " in evals[0] and "--thresholds 0.5,0.7,0.9,0.95,1 " in evals[2]
    assert calls[-1] == f"-m scripts.report conversion_curve {R}"
    r, calls = dry_run(tmp_path, "repro_conversion.sh", ARM=arm, MINUTES="20", NAME="budget")  # minutes, not steps
    train = [c for c in calls if c.startswith(("align.py", "distill.py"))][-1]
    cap = dict(block0=720, masked0=1700, align=1280).get(arm, 720)  # the arm's STEPS: a cap, the one snapshot asked
    assert "--time_budget 20 " in train and f"--max_iters {cap} " in train and f"--snapshots {cap} " in train
    evals = [c for c in calls if c.startswith("-m worlds.realworld") and "budget" in c]
    assert len(evals) == 1 and "--thresholds 0.5,0.7,0.9,0.95,1 " in evals[0]  # the budget's last step alone
    r, calls = dry_run(tmp_path, "repro_conversion.sh", ARM=arm, STEPS="41", SNAPS="", AUTOCAST="none", NAME="fp32")
    train = [c for c in calls if c.startswith(("align.py", "distill.py")) and "fp32" in c][-1]  # a slower CPU's run,
    assert "--autocast none " in train and "--snapshots 41 " in train and "--time_budget" not in train  # repeated
    if arm == "block0":  # eager: the recipe of run.sh real's λ = 0 student
        r, calls = dry_run(tmp_path, "repro_conversion.sh", ARM=arm, MINUTES="20", NAME="eager", COMPILE="0")
        train = [c for c in calls if c.startswith("align.py") and "eager" in c][-1]
        assert "--compile" not in train and "--lambda_align 0 " in train and "--init out/real/block " in train
    r, _ = dry_run(tmp_path, "repro_conversion.sh", ARM="nope", STEPS="40", SNAPS="10,20")
    assert r.returncode == 2 and "choose block0, masked0, align, opdlm or opdlm_off" in r.stderr


def test_repro_real_sweeps_only_the_arms_named(tmp_path):
    """scripts/repro_real.sh, dry: ARMS="ar-dpo" ONLY=sweep trains DPO on the teacher at each of its rates, scores
    each on the validation prompts, and runs no other arm; ARMS without ONLY=sweep is refused, with the reason."""
    (tmp_path / "out/real-arms/eval").mkdir(parents=True)
    (tmp_path / "out/real-arms/eval/ar.json").write_text("{}")
    r, calls = dry_run(tmp_path, "repro_real.sh", ARMS="ar-dpo", ONLY="sweep")
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    train = [c for c in calls if c.startswith(("align.py", "distill.py", "dpo.py"))]
    assert train and all(c.startswith("dpo.py --ar out/real-arms/ar ") for c in train)
    assert [c.split("--lr ")[1].split()[0] for c in train] == ["2e-4", "2e-5", "2e-6", "2e-7"]
    scored = [c.split("--ckpt ")[1].split()[0] for c in calls if c.startswith("-m worlds.realworld")]
    assert scored == ["out/real-arms/ar"] * 2 + [f"out/real-sweep/ar-dpo-{r}" for r in ("2e-4", "2e-5", "2e-6", "2e-7")]
    assert (tmp_path / "out/real-sweep/ar-dpo.rates").read_text().split() == ["2e-4", "2e-5", "2e-6", "2e-7"]
    r, again = dry_run(tmp_path, "repro_real.sh", ARMS="ar-dpo")
    assert r.returncode == 1 and "add ONLY=sweep" in r.stderr
    ran = [c for c in again[len(calls):] if c.startswith(("align.py", "distill.py", "dpo.py", "-m worlds"))]
    assert ran == []  # no training and no scoring (the environment's own checks aside)


def test_sweep_conversion_trains_each_rate_and_scores_it_on_validation(tmp_path):
    """scripts/sweep_conversion.sh, dry (the stand-in Python): the teacher scored on the validation prompts once, the
    arm trained once per rate at STEPS without snapshots, each run scored on the validation prompts against the
    teacher's replies (never on the test's), then conversion_sweep on the runs."""
    (tmp_path / "data/real").mkdir(parents=True)
    (tmp_path / "data/real/validation.jsonl").write_text("")
    r, calls = dry_run(tmp_path, "sweep_conversion.sh", ARM="block0", RATES="3e-5 1e-4", STEPS="12")
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    train = [c for c in calls if c.startswith("align.py")]
    assert len(train) == 2 and all("--max_iters 12" in c and "--snapshots" not in c for c in train)
    assert "--lr 3e-5" in train[0] and "--lr 1e-4" in train[1]
    runs = [f"out/conversion/sweep/block0-{lr}-12-s1337" for lr in ("3e-5", "1e-4")]
    evals = [c for c in calls if c.startswith("-m worlds.realworld")]
    assert len(evals) == 3 and all("--prompts data/real/validation.jsonl" in e for e in evals)
    assert evals[0].startswith("-m worlds.realworld --ckpt out/real/ar ")
    assert calls.index(evals[0]) < calls.index(train[0])  # the teacher first
    for run, e, t in zip(runs, evals[1:], train):
        assert e.startswith(f"-m worlds.realworld --ckpt {run} ") and "--teacher out/real/eval/ar-validation.json" in e
        assert calls.index(t) < calls.index(e)
    assert calls[-1] == (f"-m scripts.report conversion_sweep out/real/eval/ar-validation.json 3e-5={runs[0]} "
                         f"1e-4={runs[1]}")
