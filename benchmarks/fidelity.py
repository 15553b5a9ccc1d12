"""
The fidelity run (`bash fidelity.sh`, docs/scale.md "One fidelity run"): the methods' claims at a teacher ~40x the
embedded default's, in at most 6 minutes on one H200, by subprocesses of the scripts themselves: lib/corpus.py (this
Python's standard library) -> pretrain.py (a Qwen3-shaped teacher, written at FIDELITY's shape by this driver and
passed as --init) -> convert.py (bidirectional for REPR-ALIGN, block 4 shifted for OPDLM, as run.sh) -> align.py
at λ = 0 and λ = 10, evaluated every few steps -> distill.py on- and off-policy. Ends with one markdown table: per
run, its quality number (validation loss, −ELBO, KL to the teacher), tokens per forward (REPR-ALIGN: eval.py
generate at threshold 0.9; OPDLM: its rollouts'), step time and MFU (from each run's results.json and log.jsonl). No
stage starts after the budget (its row says skipped); each has its own wall-clock limit. `--device cpu --tiny` runs
the same chain at a micro shape in seconds (the test's).

The GPU estimate (H200, bf16 autocast by lib/training.py on CUDA): the teacher has ~50M parameters (hidden 640, 10
layers, MLP 1920, 10 heads of 64, 5 KV heads, vocabulary 1088 tied). Pretraining: batch 64 x 512 tokens = 32,768
tokens a step, 6·N·tokens ~ 1.0e13 FLOPs a step; at ~10% of the ~990 TFLOP/s bf16 peak (a model this small
reaches a fraction of the 30-40% that large ones do) ~ 0.1 s a step, so 800 steps ~ 80 s, 26M tokens, ~0.5
tokens per parameter (the stdlib corpus, 11 MB = 4.1M BPE training tokens on Python 3.12, is seen ~6 times;
the 180 s limit leaves room for an MFU half the assumed one). The DLM runs: 100 align
steps each (batch 32 x 512, the teacher's forward too) ~ 20 s plus evaluations; 60 distill iterations each
(rollouts are sequential forwards) ~ 40 s. About 4-5 minutes in all, the corpus and BPE (~25 s) included.
"""
import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

from lib import cli

ROOT = Path(__file__).resolve().parent.parent

# shape: the teacher's (model.preset("tiny", **shape)); pretrain/align/distill: their flags; limits: each stage's
# wall-clock seconds; budget: no stage starts later (seconds since the start)
FIDELITY = {
    "gpu": dict(data=[],
                shape=dict(hidden_size=640, intermediate_size=1920, num_hidden_layers=10, num_attention_heads=10,
                           num_key_value_heads=5, head_dim=64),
                pretrain=["--batch_size", "64", "--seq_len", "512", "--max_iters", "800", "--eval_interval", "200",
                          "--lr", "1e-3", "--min_lr", "1e-4", "--warmup", "50", "--samples", "0"],
                align=["--batch_size", "32", "--seq_len", "512", "--max_iters", "100", "--eval_interval", "20",
                       "--eval_batches", "4", "--ckpt_interval", "100", "--samples", "0"],
                distill=["--batch_size", "16", "--max_iters", "60", "--eval_interval", "20", "--curriculum_steps",
                         "40", "--eval_batches", "2"],
                generate=["--num_prompts", "16", "--max_new_tokens", "64"],
                limits=dict(data=90, pretrain=180, convert=60, align=60, generate=30, distill=60), budget=300),
    "tiny": dict(data=["--tokenizer", "byte", "--max_mb", "0.2"],
                 shape=dict(vocab_size=320, bos_token_id=256, eos_token_id=256, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16),
                 pretrain=["--batch_size", "2", "--seq_len", "32", "--max_iters", "3", "--eval_interval", "2",
                           "--eval_batches", "1", "--samples", "0"],
                 align=["--batch_size", "2", "--seq_len", "32", "--max_iters", "3", "--eval_interval", "2",
                        "--eval_batches", "1", "--ckpt_interval", "3", "--samples", "0"],
                 distill=["--batch_size", "2", "--max_iters", "3", "--eval_interval", "2", "--rollout_min", "8",
                          "--rollout_max", "8", "--curriculum_steps", "0", "--eval_batches", "1", "--num_prompts", "8"],
                 generate=["--num_prompts", "2", "--max_new_tokens", "16", "--prompt_len", "8"],
                 limits=dict(data=120, pretrain=120, convert=60, align=120, generate=120, distill=120), budget=None),
}

COLUMNS = ("run", "params", "steps", "quality", "value", "tokens/forward", "step s", "MFU", "status")


def write_teacher(path, shape, tok, seed):
    """A random Qwen3 checkpoint of `shape` (pretrain.py --init starts from it), its vocabulary pretrain.py's own
    for the data's tokenizer (pretrain.vocab_of) unless `shape` sets one."""
    from model import Qwen3, preset
    from pretrain import vocab_of
    config = preset("tiny", **{**vocab_of(tok), **shape})
    model = Qwen3(config).init_weights(seed)
    model.save_pretrained(path)
    return model.num_params()


def read_run(out_dir):
    """results.json and log.jsonl of a training run -> (results, median step seconds, median MFU or None)."""
    res = json.loads((out_dir / "results.json").read_text())
    recs = [json.loads(line) for line in (out_dir / "log.jsonl").read_text().splitlines() if line.strip()]
    recs = [r for r in recs if "step" in r and "lr" in r]  # the optimizer steps' records
    mfus = [r["mfu"] for r in recs[1:] or recs if r.get("mfu") is not None]  # the first step compiles / warms up
    return res, res["step_seconds_median"], statistics.median(mfus) if mfus else None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--tiny", action="store_true", help="a micro teacher and a few steps of each (a CPU, seconds)")
    p.add_argument("--out_dir", default=None, help="default: out/fidelity (out/fidelity-tiny with --tiny)")
    p.add_argument("--seed", type=int, default=1337)
    args = p.parse_args()
    cfg = FIDELITY["tiny" if args.tiny else "gpu"]
    out = Path(args.out_dir or ("out/fidelity-tiny" if args.tiny else "out/fidelity"))
    out.mkdir(parents=True, exist_ok=True)
    t0, failed = time.perf_counter(), []
    dev = ["--device", args.device, "--seed", str(args.seed)]

    def stage(name, kind, cmd):
        """Run one script as a subprocess (its output to OUT/NAME.log) -> True if it finished."""
        if cfg["budget"] is not None and time.perf_counter() - t0 > cfg["budget"]:
            print(f"== {name}: skipped (time budget: {cfg['budget']} s)", flush=True)
            return "skipped (time budget)"
        t = time.perf_counter()
        with open(out / f"{name}.log", "w") as log:
            try:
                rc = subprocess.run([sys.executable, *cmd], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                    timeout=cfg["limits"][kind]).returncode
            except subprocess.TimeoutExpired:
                rc = f"timeout ({cfg['limits'][kind]} s)"
        status = "ok" if rc == 0 else f"FAILED ({rc}; {out / name}.log)"
        print(f"== {name}: {status} in {time.perf_counter() - t:.0f} s", flush=True)
        if rc != 0:
            failed.append(name)
        return status

    data_dir = out / "data"
    st = "ok" if (data_dir / "meta.json").exists() else stage("data", "data", ["-m", "lib.corpus", "--out_dir",
                                                                              str(data_dir), *cfg["data"]])
    teacher = out / "ar"
    if st == "ok":
        meta = json.loads((data_dir / "meta.json").read_text())
        from lib.tokenizer import Tokenizer
        tok = Tokenizer.from_pretrained(data_dir)
        n = write_teacher(out / "ar-init", cfg["shape"], tok, args.seed)
        def flag(f):
            return int(cfg["pretrain"][cfg["pretrain"].index(f) + 1])
        seen = flag("--batch_size") * flag("--seq_len") * flag("--max_iters")
        print(f"teacher: {n / 1e6:.2f}M parameters; {seen:,} training tokens = {seen / n:.2f} tokens per parameter; "
              f"corpus {meta['splits']['train']['tokens']:,} tokens", flush=True)
        st = stage("pretrain", "pretrain", ["pretrain.py", "--data", str(data_dir), "--out_dir", str(teacher),
                                            "--init", str(out / "ar-init"), *cfg["pretrain"], *dev])
    runs = [("teacher (AR)", teacher, st, "val_loss", "val loss (nats)")]
    if st == "ok":
        st_bi = stage("convert-bi", "convert", ["convert.py", "--ar", str(teacher), "--out_dir", str(out / "dlm"),
                                                "--attn", "bidirectional", "--overwrite"])
        st_bl = stage("convert-block", "convert", ["convert.py", "--ar", str(teacher), "--out_dir",
                                                   str(out / "block"), "--attn", "block", "--block_size", "4",
                                                   "--shift", "true", "--overwrite"])
    else:
        st_bi = st_bl = "skipped (no teacher)"
    for lam in ("0", "10"):
        name, d = f"align λ={lam}", out / f"align{lam}"
        s = st_bi if st_bi != "ok" else stage(f"align{lam}", "align", [
            "align.py", "--init", str(out / "dlm"), "--data", str(data_dir), "--out_dir", str(d), "--lambda_align",
            lam, *cfg["align"], *dev])
        if s == "ok":  # its tokens per forward: eval.py generate at threshold 0.9 (Fast-dLLM), as run.sh stdlib
            s = stage(f"generate{lam}", "generate", ["eval.py", "generate", "--ckpt", str(d), "--ref", str(teacher),
                                                     "--data", str(data_dir), "--threshold", "0.9", "--out",
                                                     str(d / "generate.json"), *cfg["generate"], *dev])
        runs.append((name, d, s, "val_nelbo", "−ELBO"))
    for policy in ("on", "off"):
        name, d = f"OPDLM {policy}-policy", out / f"distill-{policy}"
        s = st_bl if st_bl != "ok" else stage(f"distill-{policy}", "distill", [
            "distill.py", "--init", str(out / "block"), "--teacher", str(teacher), "--data", str(data_dir),
            "--out_dir", str(d), "--policy", policy, *cfg["distill"], *dev])
        runs.append((name, d, s, "val_kl", "KL to teacher (own rollouts)"))

    rows = []
    for name, d, s, key, label in runs:
        cells = [name] + ["-"] * (len(COLUMNS) - 2) + [s]
        if s == "ok":
            try:
                res, step_s, mfu = read_run(d)
                val = res.get(key)
                gen = d / "generate.json"  # align: eval.py generate's; OPDLM: its own rollouts'; AR: 1
                tpf = (json.loads(gen.read_text())["results"]["tokens_per_forward"] if gen.exists() else
                       res.get("val_tokens_per_forward", 1.0 if key == "val_loss" else None))
                cells = [name, f"{n / 1e6:.2f}M", str(res.get("steps", "-")),  # every run has the teacher's shape
                         label, "-" if val is None else f"{val:.4f}", "-" if tpf is None else f"{tpf:.2f}",
                         "-" if step_s is None else f"{step_s:.3f}", "-" if mfu is None else f"{mfu:.1%}", "ok"]
                if val is None or not math.isfinite(val):
                    failed.append(name)
            except (OSError, ValueError, KeyError) as e:
                cells[-1] = f"FAILED (reading {d}: {e})"
                failed.append(name)
        rows.append(cells)
    print("\n" + cli.table(COLUMNS, rows))
    print(f"\nfidelity: {time.perf_counter() - t0:.0f} s; device {args.device}; logs in {out}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
