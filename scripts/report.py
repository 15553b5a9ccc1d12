"""
The reproduction scripts' tables (scripts/repro_*.sh, scripts/real_arms.sh), rendered from the JSON their runs write:
one function per table, each printing markdown (the scripts tee it into their results.md / table.md). The one entry
point: it also dispatches to the tables run.sh prints at the end of its worlds (scripts/world_tables.py), the real
model's conversion tables (scripts/conversion.py), the verdict protocol's sweeps and tables (scripts/protocol.py) and
README's claims table (scripts/claims.py: `claims`, `claims --check`); the statistics are in scripts/stats.py.

    python -m scripts.report tasks_world ar ar-dpo dlm align0 align ...    # what run.sh prints at its end
    python -m scripts.report repro_align out/repro lambda0 lambda10 ...

Each function takes the strings its script passes (paths, names, numbers) and reads the files those runs wrote.
tests/test_report.py renders each one from small JSON files made in the test.
"""
import contextlib
import csv
import functools
import json
import math
import shlex
import statistics
import sys
import time
from pathlib import Path

from lib import cli
from scripts import claims, conversion, protocol, world_tables
from scripts.protocol import stage_seconds
from scripts.stats import chosen_rate, holm, mcnemar, paired, paired_t


def repro_align(*args):
    """repro_align.sh: curves.csv and the table. args: OUT, then the run names."""
    argv = ["repro_align", *map(str, args)]
    out, runs = Path(argv[1]), argv[2:]
    cols = ["val_acc@0.15", "val_acc@0.5", "val_acc@0.9", "val_loss@0.5", "val_nelbo"]
    curves, results = {}, {}
    for r in runs:
        recs = [json.loads(line) for line in (out / r / "log.jsonl").read_text().splitlines()]
        curves[r] = [x for x in recs if "val_acc@0.5" in x]
        results[r] = json.loads((out / r / "results.json").read_text())
    n_cos = max((len(x.get("val_cos", [])) for r in runs for x in curves[r]), default=0)
    with open(out / "curves.csv", "w", newline="") as f:  # one row per run x evaluation
        w = csv.writer(f)
        w.writerow(["run", "lambda_align", "freeze", "scratch", "step", *cols, "cos_mean",
                    *(f"cos_{l}" for l in range(n_cos))])
        for r in runs:
            res = results[r]
            for x in curves[r]:
                cos = x.get("val_cos", [])
                w.writerow([r, res["lambda_align"], "+".join(res["freeze"]), int(res["scratch"]), x["step"],
                            *(f"{x[c]:.5f}" for c in cols), f"{sum(cos) / len(cos):.5f}" if cos else "",
                            *(f"{v:.5f}" for v in cos)])
    claim = [r for r in ("lambda0", "lambda10", "lambda0-frozen", "lambda10-frozen") if r in runs]
    print("Convergence (lr 3e-4 constant after warmup; step s = after s+1 updates): acc@0.5 (higher is better) | "
          "-ELBO in nats/token (lower is better)\n")
    print("| step | " + " | ".join(f"acc@0.5 {r}" for r in claim) + " | "
          + " | ".join(f"-ELBO {r}" for r in claim) + " |")
    print("|---" * (1 + 2 * len(claim)) + "|")
    for i, x in enumerate(curves[claim[0]]):
        row = [curves[r][i] for r in claim]
        print(f"| {x['step']} | " + " | ".join(f"{y['val_acc@0.5']:.3f}" for y in row) + " | "
              + " | ".join(f"{y['val_nelbo']:.3f}" for y in row) + " |")
    print("\nMean cosine to the teacher over all hidden states (at the aligned rows of a fixed 0.5-ratio corruption)\n")
    print("| step | " + " | ".join(claim) + " |\n" + "|---" * (1 + len(claim)) + "|")
    for i, x in enumerate(curves[claim[0]]):
        cos = [curves[r][i].get("val_cos") for r in claim]
        print(f"| {x['step']} | " + " | ".join(f"{sum(c) / len(c):.3f}" if c else "-" for c in cos) + " |")
    base = results["lambda10"]["step_seconds_median"]
    print(f"\nAll runs after step {curves[runs[0]][-1]['step']}: the cosine per hidden state (embeddings ... final "
          f"norm)\n")
    print("| run | acc@0.15 | acc@0.5 | acc@0.9 | loss@0.5 | -ELBO | cosine per hidden state | step time vs lambda10 |")
    print("|---" * 8 + "|")
    for r in runs:
        res = results[r]
        cos = " ".join(f"{v:.2f}" for v in res.get("val_cos", [])) or "-"
        print(f"| {r} | {res['val_acc@0.15']:.3f} | {res['val_acc@0.5']:.3f} | {res['val_acc@0.9']:.3f} | "
              f"{res['val_loss@0.5']:.3f} | {res['val_nelbo']:.3f} | {cos} | "
              f"{res['step_seconds_median'] / base:.2f}x |")
    print(f"\n(curves: {out / 'curves.csv'}; step times are each run's own median and move by ±10% on a shared "
          f"machine)")


def distill_untrained(*args):
    """repro_distill.sh: distill.py's evaluation of an untrained conversion. args: the results.json to write, then
    distill.py's flags."""
    argv = ["distill_untrained", *map(str, args)]
    from lib import data
    import distill
    from lib import training
    args = distill.p.parse_args(argv[2:])
    device, ctx = cli.setup(args.device, args.seed)
    student = training.load_model(args.init, device, "repro_distill: student")
    teacher = training.load_model(args.teacher, device, "repro_distill: teacher", attn="causal", like=student)
    tok = training.load_tokenizer(args.init, student.config)
    items = data.prompt_pool(tok, args.rollout_max, prompts=args.prompts, data_dir=args.data, seq_len=args.seq_len,
                             n=args.num_prompts)[:args.eval_batches * args.batch_size]  # as distill.py
    res = distill.evaluate(student, teacher, items, args.rollout_max, batch_size=args.batch_size, eos_id=tok.eos_id,
                           vocab_size=tok.vocab_size, threshold=args.threshold, temperature=args.temperature, ctx=ctx)
    open(argv[1], "w").write(json.dumps(dict(**res, eval_len=args.rollout_max, steps=0), indent=2) + "\n")


def eval_jobs(*args):
    """repro_distill.sh: the queued eval.py commands in one process. args: the jobs file, the seconds so far."""
    argv = ["eval_jobs", *map(str, args)]
    import eval as E
    jobs, t0 = [shlex.split(line) for line in open(argv[1]) if line.strip()], time.time() - float(argv[2])
    for k, job in enumerate(jobs):
        out = job[job.index("--out") + 1]
        sys.argv = ["eval.py", *job]  # eval.py's main reads its flags from sys.argv
        try:
            with open(out[:-len(".json")] + ".log", "w") as f, contextlib.redirect_stdout(f), \
                    contextlib.redirect_stderr(f):
                E.main()
        except SystemExit as e:
            raise SystemExit(f"scripts/repro_distill.sh: eval.py {shlex.join(job)} failed ({e.code}); see its .log")
        print(f"== eval {k + 1}/{len(jobs)}: {out} ({time.time() - t0:.0f} s)", flush=True)


def repro_distill(*args):
    """repro_distill.sh: the table. args: OUT, SEEDS, ITERS, ITERS_UNSHIFTED."""
    argv = ["repro_distill", *map(str, args)]
    out, seeds, iters, iters_un = Path(argv[1]), argv[2].split(), argv[3], argv[4]
    def ev(name, f):
        return json.loads((out / "eval" / f"{name}-{f}.json").read_text())["results"]
    GEN = ("gen_perplexity", "unigram_entropy_bits", "repetition_4gram")


    def metrics(name):
        """One model's numbers, in the table's column order (None: not measured)."""
        thr = "ar" if name == "teacher" else "0.9"  # the AR sampler has no threshold
        t1, t0 = ev(name, f"gen-T1.0-{thr}"), ev(name, f"gen-T0-{thr}")
        if name == "teacher":
            return [None] * 3 + [t1[k] for k in GEN] + [t0[k] for k in GEN] + [None] * 2
        tpf = [ev(name, f"gen-T1.0-{t}")["tokens_per_forward"] for t in ("0.9", "0.7")]
        lik = ev(name, "lik")["nelbo_bits_per_token"]
        r = json.loads((out / name / "results.json").read_text())  # distill.py's evaluation
        return [r["val_kl_data"], r["val_kl"], lik] + [t1[k] for k in GEN] + [t0[k] for k in GEN] + tpf


    def cell(i, v):
        if v is None:
            return "—"
        return f"{v:.3f}" if i < 3 else f"{v:.2f}"  # the KLs and the bound: three decimals


    def row(label, vals):
        print(f"| {label} | " + " | ".join(cell(i, v) for i, v in enumerate(vals)) + " |")


    print("| model | KL real text | KL own rollouts | BD3-LM −ELBO bits/tok | T=1 gen. ppl | T=1 entropy | T=1 rep. "
          "4-grams | greedy gen. ppl | greedy entropy | greedy rep. 4-grams | tok/fwd per row @0.9 | @0.7 |")
    print("|---" * 12 + "|")  # the 12 columns above
    row("teacher (AR)", metrics("teacher"))
    row("shifted block student, untrained", metrics("shift-untrained"))
    row("unshifted block student, untrained", metrics("noshift-untrained"))
    for name, what in (("shift-on", f"shifted, on-policy (OPDLM), {iters} steps"),
                       ("shift-off", f"shifted, off-policy (random masks of its rollouts), {iters} steps"),
                       ("shift-data", f"shifted, random masks of data, {iters} steps"),
                       ("noshift-on", f"unshifted (as published), on-policy, {iters_un} steps")):
        per = [metrics(f"{name}-s{s}") for s in seeds]
        row(f"**{what}**: mean of {len(seeds)} seeds", [sum(c) / len(c) for c in zip(*per)])
        for s, vals in zip(seeds, per):
            row(f"  seed {s}", vals)


def repro_merge(*args):
    """repro_merge.sh: the tables. args: OUT."""
    argv = ["repro_merge", *map(str, args)]
    out = Path(argv[1])
    def load(f):
        return json.loads((out / f).read_text())
    dpo, spec = load("ar-dpo/results.json"), load("spectrum.json")
    names = ["linear", "ties", "dare", "linear-independent"]
    runs = {m: load(f"merged-{m}/merge.json") for m in names}
    lin, ind = runs["linear"], runs["linear-independent"]
    def f3(x):
        return "—" if x is None else f"{x:.3f}"
    def f4(x):
        return "—" if x is None else f"{x:.4f}"
    print(f"DPO on {spec['ar']} ({dpo['steps']} steps, β = {dpo['beta']}): held-out reward accuracy "
          f"{dpo['heldout_reward_acc']:.3f} on {dpo['heldout_pairs']} pairs; held-out pairs with log π(y_w|x) > "
          f"log π(y_l|x): {dpo['heldout_pref_acc_before']:.3f} before, {dpo['heldout_pref_acc']:.3f} after\n")
    print(f"Linear merge into {spec['dlm']}, γ chosen on {lin['train']['n_pairs']} training pairs, reported on "
          f"{lin['heldout']['n_pairs']} held-out pairs, {lin['n_masks']} ELBO draws per pair. Held-out: margin = the "
          f"mean "
          f"r_γ(y_w) − r_γ(y_l); same sign = the pairs whose margin has its sign at the smallest γ > 0; chosen, "
          f"rejected = "
          f"the mean r_γ(y_w), r_γ(y_l) (β × the ELBO change). Win rate against the DLM: {lin['samples']} samples "
          f"per γ "
          f"(the same for both mask settings: sampling draws no masks)\n")
    print("| γ | masks | train acc | train DPO loss | held-out acc | margin | margin / γ | same sign | chosen | "
          "rejected "
          "| win rate |\n" + "|---" * 11 + "|")
    for k, g in enumerate(lin["gammas"]):
        for r in (lin, ind):
            t, h = r["train"], r["heldout"]
            print(f"| {g:g} | {r['masks']} | {f3(t['reward_accuracy'][k])} | {f4(t['dpo_loss'][k])} | "
                  f"{f3(h['reward_accuracy'][k])} | {f4(h['margin'][k])} | {f4(h['margin_per_gamma'][k])} | "
                  f"{f3(h['same_sign'][k])} | {f4(h['reward_chosen'][k])} | {f4(h['reward_rejected'][k])} | "
                  f"{f3(lin['win_rates'][k])} |")
    print("\nHeld-out reward accuracy per γ, and the γ each run chose on its training pairs\n")
    head = {"linear": "linear", "ties": f"TIES (density {runs['ties']['density']})",
            "dare": f"DARE (drop {runs['dare']['drop']})", "linear-independent": "linear, independent masks"}
    print("| γ | " + " | ".join(head.values()) + " |\n" + "|---" * (len(runs) + 1) + "|")
    for k, g in enumerate(lin["gammas"]):
        print(f"| {g:g} | " + " | ".join(f"{r['heldout']['reward_accuracy'][k]:.3f}" for r in runs.values()) + " |")
    for rule in lin["chosen_by"]:
        print(f"| γ by --select {rule} | " + " | ".join(f"{r['chosen_by'][rule]:g}" for r in runs.values()) + " |")
    print("| win rate vs the DLM at the --select accuracy γ | " + " | ".join(f3(r["win_rate"]) for r in runs.values())
          + " |")
    spectrum_table(spec)


def repro_dlm_dpo(*args):
    """repro_dlm_dpo.sh: AR-MAP against DPO on the DLM itself, per world and seed, then DLM-only against AR-MAP
    paired by seed. args: OUT SEED... (the DLM before either route: run.sh's out/tasks/eval/align.json and
    out/eval/align.likelihood.json, when present)."""
    out, seeds = Path(str(args[0])), [str(s) for s in args[1:]]
    def load(f):
        return json.loads((out / f).read_text())
    secs = {}
    for line in (out / "seconds.tsv").read_text().splitlines():
        name, s = line.split("\t")
        secs[name] = secs.get(name, 0) + int(s)
    def cost(w, s, *stages):
        return sum(secs.get(f"{w} {s} {x}", 0) for x in stages)
    print("Two routes from the same pairs, steps and DPO settings (AR-MAP: dpo.py on the AR teacher, then merge.py "
          "merge into the REPR-ALIGN DLM, γ chosen on training pairs; DLM-only: dpo.py --dlm on that DLM). Held-out "
          "reward accuracy: β × the ELBO change against the DLM (AR-MAP: merge.py's draws; DLM-only: dpo.py's "
          "4 fixed draws). Seconds: wall clock of the route's stages, process start included.\n")
    print("Exact-answer world (100 held-out prompts per family, greedy, threshold 0.9)\n")
    rows, per = [], {"AR-MAP": [], "DLM-only": []}
    before = Path("out/tasks/eval/align.json")
    if before.exists():
        r = next(x for x in json.loads(before.read_text())["results"]["runs"] if x["threshold"] == 0.9)
        rows.append(["—", "the REPR-ALIGN DLM (before)", "—", f"{r['right']:.2f}", f"{r['preferred']:.2f}",
                     f"{r['tokens_per_forward']:.2f}", "—"])
    for s in seeds:
        m, d = load(f"tasks/{s}/merged/merge.json"), load(f"tasks/{s}/dlm-dpo/results.json")
        em, ed = (load(f"tasks/{s}/eval/{x}.json")["results"]["runs"][0] for x in ("merged", "dlm-dpo"))
        k = m["gammas"].index(m["best_gamma"])
        for route, acc, e, sec in (("AR-MAP", m["heldout"]["reward_accuracy"][k], em,
                                    cost("tasks", s, "ar-dpo", "merge")),
                                   ("DLM-only", d["heldout_reward_acc"], ed, cost("tasks", s, "dlm-dpo"))):
            per[route].append(dict(acc=acc, right=e["right"], pref=e["preferred"], tpf=e["tokens_per_forward"]))
            name = f"AR-MAP (γ = {m['best_gamma']:g})" if route == "AR-MAP" else route
            rows.append([s, name, f"{acc:.3f}", f"{e['right']:.2f}", f"{e['preferred']:.2f}",
                         f"{e['tokens_per_forward']:.2f}", str(sec)])
    print(cli.table(["seed", "route", "held-out reward accuracy", "exact match", "with the full stop",
                     "tokens per forward", "seconds"], rows))
    def col(route, key):
        return [r[key] for r in per[route]]
    print("\nDLM-only against AR-MAP, paired by seed: " + "; ".join(
        f"{label} {paired(col('AR-MAP', key), col('DLM-only', key))}" for label, key in (
            ("with the full stop", "pref"), ("exact match", "right"), ("held-out reward accuracy", "acc"))))
    n_samples = load(f"stdlib/{seeds[0]}/winrate.json")["results"]["samples"]
    print(f"\nStandard library (win rate: 'prefer single quotes' against the REPR-ALIGN DLM, {n_samples} samples "
          "each; −ELBO on the validation batches)\n")
    rows, per = [], {"AR-MAP": [], "DLM-only": []}
    before = Path("out/eval/align.likelihood.json")
    if before.exists():
        lk = json.loads(before.read_text())["results"]
        rows.append(["—", "the REPR-ALIGN DLM (before)", "—", "—",
                     f"{lk['nelbo_bits_per_token']:.3f} ± {lk['stderr']:.3f}", "—"])
    for s in seeds:
        m, d, w = (load(f"stdlib/{s}/{f}") for f in ("merged/merge.json", "dlm-dpo/results.json", "winrate.json"))
        k = m["gammas"].index(m["best_gamma"])
        for j, (route, acc, name, sec) in enumerate((
                ("AR-MAP", m["heldout"]["reward_accuracy"][k], "merged", cost("stdlib", s, "ar-dpo", "merge")),
                ("DLM-only", d["heldout_reward_acc"], "dlm-dpo", cost("stdlib", s, "dlm-dpo")))):
            lk = load(f"stdlib/{s}/{name}.likelihood.json")["results"]
            win = w["results"]["win_rates"][j]
            per[route].append(dict(acc=acc, win=win, nelbo=lk["nelbo_bits_per_token"]))
            label = f"AR-MAP (γ = {m['best_gamma']:g})" if route == "AR-MAP" else route
            rows.append([s, label, f"{acc:.3f}", f"{win:.3f}",
                         f"{lk['nelbo_bits_per_token']:.3f} ± {lk['stderr']:.3f}", str(sec)])
    print(cli.table(["seed", "route", "held-out reward accuracy", "win rate", "−ELBO bits/token", "seconds"], rows))
    print("\nDLM-only against AR-MAP, paired by seed: " + "; ".join(
        f"{label} {paired(col('AR-MAP', key), col('DLM-only', key))}" for label, key in (
            ("win rate", "win"), ("held-out reward accuracy", "acc"), ("−ELBO (bits/token)", "nelbo"))))


def repro_mark(*args):
    """repro_mark.sh: the preference the teacher already produces, against γ. args: OUT MODEL..."""
    out, models = Path(str(args[0])), [str(m) for m in args[1:]]
    def load(f):
        return json.loads((out / f).read_text())
    what = {"ar": "AR teacher", "ar-dpo": "AR after DPO", "align": "REPR-ALIGN DLM (γ = 0)",
            "dlm-dpo": "DLM-only: dpo.py --dlm on the REPR-ALIGN DLM"}
    rows = []
    for m in models:
        r = load(f"eval/{m}.json")["results"]["runs"][0]
        if m.startswith("merged-"):
            mj = load(f"{m}/merge.json")
            name, acc = f"AR-MAP, γ = {mj['best_gamma']:g}", mj["heldout"]["reward_accuracy"][0]
        else:
            name = what[m]
            acc = load(f"{m}/results.json").get("heldout_reward_acc") if m in ("ar-dpo", "dlm-dpo") else None
        rows.append([name, f"{r['right']:.2f}", f"{r['preferred']:.2f}", f"{r['tokens_per_forward']:.2f}",
                     "—" if acc is None else f"{acc:.3f}"])
    print("Held-out prompts of every family, greedy, DLMs at threshold 0.9: exact match (the full stop allowed), the "
          "share of answers ending with the full stop, tokens per forward; held-out reward accuracy of DPO and of "
          "each merge (β × the log-likelihood change; the DLMs' by the ELBO)\n")
    print(cli.table(["model", "exact match", "with the full stop", "tokens per forward", "held-out reward accuracy"],
                    rows))


def spectrum_table(spec):
    """merge.py spectrum's summary (spectrum.json) as a markdown table, printed."""
    print("\nSpectral shadowing: ‖τ_diff‖₂ / ‖τ_pref‖₂ per layer type (τ_diff = W_AR − W_DLM)\n")
    print("| layer type | count | median ‖τ_diff‖₂ | median ‖τ_pref‖₂ | median ratio | min ratio "
          "|\n" + "|---" * 6 + "|")
    for t, v in spec["summary"].items():
        print(f"| {t} | {v['count']} | {v['diff']:.4g} | {v['pref']:.4g} | {v['ratio']:.4g} | {v['min_ratio']:.4g} |")


def repro_tasks(*args):
    """repro_tasks.sh: the tables. args: SEEDS, GAMMAS, and optionally EXTRA_SEEDS (the rollout-setting runs)."""
    argv = ["repro_tasks", *map(str, args)]
    R, seeds, gammas = Path("out/tasks/repro"), argv[1].split(), argv[2].split()
    extra = argv[3].split() if len(argv) > 3 else []
    def runs(name):
        return json.loads(Path(name).read_text())["results"]["runs"]
    def fmt(xs):
        return f"{statistics.mean(xs):.2f} ± {statistics.stdev(xs):.2f}" if len(xs) > 1 else f"{xs[0]:.2f}"
    print(f"Exact match (all families, 200 held-out prompts each) / tokens per forward, mean ± sd over seeds "
          f"{', '.join(seeds)}"
          " (200 training steps each)\n")
    ts = [r["threshold"] for r in runs(R / f"eval-align-s{seeds[0]}.json")]
    print("| model | " + " | ".join(f"threshold {t:g}" for t in ts) + " | add at 0.9 |")
    print("|---|" + "---|" * (len(ts) + 1))
    for m, what in [("align0", "masked diffusion, λ = 0"), ("align", "REPR-ALIGN, λ = 10"),
                    ("distill-off", "OPDLM, off-policy ablation"), ("distill", "OPDLM, on-policy")]:
        rs = [runs(R / f"eval-{m}-s{s}.json") for s in seeds]
        cells = [f"{fmt([r[k]['accuracy'] for r in rs])} / {fmt([r[k]['tokens_per_forward'] for r in rs])}"
                 for k in range(len(ts))]
        add = fmt([r[ts.index(0.9)]["families"]["add"]["accuracy"] for r in rs])
        print(f"| {what} | " + " | ".join(cells) + f" | {add} |")
    print(f"\nPaired by seed ({', '.join(seeds)}): the difference in exact match, mean ± sd over seeds, the paired "
          "t-test's t and two-sided p, and in how many seeds the method is ahead\n")
    print("| comparison | threshold | exact match: method − baseline |\n|---|---|---|")
    for m, base, what in [("align", "align0", "REPR-ALIGN λ = 10 − λ = 0"),
                          ("distill", "distill-off", "OPDLM on-policy − off-policy")]:
        a, b = ([runs(R / f"eval-{x}-s{s}.json") for s in seeds] for x in (base, m))
        for k, t in enumerate(ts):
            print(f"| {what} | {t:g} | {paired([r[k]['accuracy'] for r in a], [r[k]['accuracy'] for r in b])} |")
    for t in (0.9, 1.0):
        if t not in ts:
            continue
        k = ts.index(t)
        ms = ["align0", "align", "distill-off", "distill"]
        lengths = runs(R / f"eval-align-s{seeds[0]}.json")[k].get("lengths", {})
        print(f"\nBy the answer's length (digits), threshold {t:g}: tokens per forward, mean over seeds (rows per seed "
              "in n)\n")
        print("| family | digits | n | " + " | ".join(ms) + " |\n|---|---|---|" + "---|" * len(ms))
        for key, r0 in lengths.items():
            cells = [statistics.mean(runs(R / f"eval-{m}-s{s}.json")[k]["lengths"][key]["tokens_per_forward"]
                                     for s in seeds) for m in ms]
            print(f"| {key.replace('/', ' | ')} | {r0['n']} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    if extra:
        print(f"\nOPDLM's rollout settings, seeds {', '.join(extra)}: exact match / tokens per forward (mean ± sd)\n")
        print("| rollouts (training) | " + " | ".join(f"judged at {t:g}" for t in ts) + " |")
        print("|---|" + "---|" * len(ts))
        for m, what in [("distill", "on-policy, temperature 1, threshold 0.9 (run.sh's)"),
                        ("distill-T0", "on-policy, temperature 0, threshold 0.9"),
                        ("distill-off", "off-policy, temperature 1, threshold 0.9"),
                        ("distill-t05", "on-policy, temperature 1, threshold 0.5"),
                        ("distill-off-t05", "off-policy, temperature 1, threshold 0.5")]:
            rs = [runs(R / f"eval-{m}-s{s}.json") for s in extra]
            print(f"| {what} | " + " | ".join(f"{fmt([r[k]['accuracy'] for r in rs])} / "
                                              f"{fmt([r[k]['tokens_per_forward'] for r in rs])}"
                                              for k in range(len(ts))) + " |")
    print("\nDPO on the AR teacher (greedy, 200 held-out prompts per family): exact match / with a full stop\n")
    print("| model | sort | rev | add | held-out reward accuracy |\n|---|---|---|---|---|")
    for m, what in [("ar", "the teacher"), ("ar-dpo-plain", "plain DPO (--sft_weight 0)"),
                    ("ar-dpo", "DPO + the chosen answers' NLL (--sft_weight 1, run.sh)")]:
        f = runs(R / f"eval-{m}.json")[0]["families"]
        res = Path("out/tasks" + ("/repro/" if m == "ar-dpo-plain" else "/") + m) / "results.json"
        acc = json.loads(res.read_text()).get("heldout_reward_acc") if m != "ar" else None
        print(f"| {what} | " + " | ".join(f"{f[k]['accuracy']:.2f} / "
                                          f"{f[k]['preferred']:.2f}" for k in ("sort", "rev", "add"))
              + f" | {'—' if acc is None else f'{acc:.3f}'} |")
    print("\nAR-MAP: out/tasks/ar-dpo's task vector merged into out/tasks/align at each γ (threshold 0.9, 200 "
          "prompts per "
          "family)\n")
    print("| γ | held-out reward accuracy | exact match | right, with or without the full stop | answered with a "
          "full stop "
          "| tokens per forward |\n|---|---|---|---|---|---|")
    for g in gammas:
        r = runs(R / f"eval-merged-g{g}.json")[0]
        m = json.loads((R / f"merged-g{g}/merge.json").read_text())
        print(f"| {g} | {m['heldout']['reward_accuracy'][0]:.3f} | {r['accuracy']:.2f} | {r['right']:.2f} | "
              f"{r['preferred']:.2f} | {r['tokens_per_forward']:.2f} |")
    grids = {k: R / f"merged-{k}/merge.json" for k in ("shared", "independent")}
    if all(p.exists() for p in grids.values()):
        grids = {k: json.loads(p.read_text()) for k, p in grids.items()}
        print("\nThe γ search over the whole grid, with shared masks (every γ and the reference on the same draws: a "
              "tie at γ = 0, counted half) and independent ones: reward accuracy on the training pairs / held-out pairs"
              "\n")
        print("| γ | shared | independent |\n|---|---|---|")
        for k, g in enumerate(grids["shared"]["gammas"]):
            cells = [f"{m['train']['reward_accuracy'][k]:.3f} / {m['heldout']['reward_accuracy'][k]:.3f}"
                     for m in grids.values()]
            print(f"| {g:g} | " + " | ".join(cells) + " |")
        print("| γ chosen (accuracy; dpo) | " + " | ".join(
            f"{m['chosen_by']['accuracy']:g}; {m['chosen_by']['dpo']:g}" for m in grids.values()) + " |")
    if (R / "spectrum.json").exists():
        spectrum_table(json.loads((R / "spectrum.json").read_text()))


def repro_align_tasks(*args):
    """repro_align_tasks.sh: the tables. args: OUT, SEEDS, L2_SEEDS."""
    argv = ["repro_align_tasks", *map(str, args)]
    R, seeds, l2_seeds = Path(argv[1]), argv[2].split(), argv[3].split()

    def evals(name, s):  # {step: record} of the run's evaluations with exact match
        recs = [json.loads(line) for line in (R / f"{name}-s{s}" / "log.jsonl").read_text().splitlines()]
        return {r["step"]: r for r in recs if "task_acc" in r}
    last = max(evals("lam0", seeds[0]))
    cols = [("task_acc@1", 40), ("task_acc@1", 60), ("task_acc", 40), ("task_acc", 60), ("task_acc", last),
            ("task_tpf", last)]
    head = {"task_acc@1": "exact match @1.0", "task_acc": "exact match @0.9", "task_tpf": "tok/fwd @0.9"}
    def fmt(xs):
        return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"
    parts = [("lam0", "λ = 0", None), ("lam10", "λ = 10, every hidden state", "lam0"),
             ("lam10-below-final", "λ = 10, all but the final norm's output", "lam0"),
             ("lam10-final", "λ = 10, the final norm's output only", "lam0"),
             ("lam0-lr3e-4", "λ = 0, lr 3e-4", None), ("lam10-lr3e-4", "λ = 10, lr 3e-4", "lam0-lr3e-4")]
    print(f"Which part of the alignment does the work: mean ± sd over seeds {', '.join(seeds)} (80 steps, 50 held-out "
          "prompts per family; step s = after s+1 updates)\n")
    print("| run | " + " | ".join(f"{head[k]}, step {st}" for k, st in cols) + " |\n|---|" + "---|" * len(cols))
    for name, what, _ in parts:
        ev = [evals(name, s) for s in seeds]
        print(f"| {what} | " + " | ".join(fmt([e[st][k] for e in ev]) for k, st in cols) + " |")
    print("\nPaired by seed against λ = 0 at the same lr: exact match difference (mean ± sd, paired t-test, "
          "seeds ahead)\n")
    print("| run | threshold | step | run − λ = 0 |\n|---|---|---|---|")
    for name, what, base in parts:
        if base is None:
            continue
        a, b = [evals(base, s) for s in seeds], [evals(name, s) for s in seeds]
        for k, st in cols[:4]:
            print(f"| {what} | {'1.0' if k.endswith('@1') else '0.9'} | {st} | "
                  f"{paired([e[st][k] for e in a], [e[st][k] for e in b])} |")
    metric = [("lam0", "λ = 0"), ("cos1", "cosine, λ = 1"), ("lam10", "cosine, λ = 10")]
    metric += [(f"l2-{l}", f"L2, λ = {l}") for l in ("0.3", "1", "3", "10")]
    print(f"\nCosine against L2: mean over seeds {', '.join(l2_seeds)} at step {last} (cosine: the mean over hidden "
          "states of val_cos, the alignment both losses aim at)\n")
    print("| run | final cosine to the teacher | exact match @0.9, step 40 | step 60 | step "
          f"{last} | exact match @1.0, step {last} | −ELBO |\n|---|---|---|---|---|---|---|")
    for name, what in metric:
        ev = [evals(name, s) for s in l2_seeds]
        cos = [statistics.mean(e[last]["val_cos"]) for e in ev]
        print(f"| {what} | {fmt(cos)} | " + " | ".join(fmt([e[st]["task_acc"] for e in ev]) for st in (40, 60, last))
              + f" | {fmt([e[last]['task_acc@1'] for e in ev])} | {fmt([e[last]['val_nelbo'] for e in ev])} |")


def real_world(*args):
    """run.sh real: the real model's tables (out/real/results.md). args: OUT, then the model names."""
    O, models = Path(args[0]), args[1:]
    what = {"ar": "AR teacher (SmolLM2-135M-Instruct)", "ar-dpo": "AR after DPO (`dpo.py`)",
            "dlm": "bidirectional conversion, untrained", "align0": "masked diffusion, λ = 0 (`align.py`)",
            "align0-time": "masked diffusion, λ = 0, as long as λ = 10 takes", "align": "REPR-ALIGN, λ = 10",
            "block": "block conversion, untrained", "distill-off": "OPDLM, off-policy (`distill.py --policy off`)",
            "distill": "OPDLM (`distill.py`)", "merged": "REPR-ALIGN + AR-MAP (`merge.py merge`)",
            "dlm-dpo": "REPR-ALIGN + DPO on its ELBO (`dpo.py --dlm`)"}
    res = {m: json.loads((O / f"eval/{m}.json").read_text()) for m in models}
    runs = {m: r["runs"] for m, r in res.items()}
    fams = sorted(k.removeprefix("accuracy_") for k in next(iter(runs["ar"].values())) if k.startswith("accuracy_"))
    canvas = next(iter(runs["ar"].values()))["canvas"]
    n = res["ar"]["prompts"]

    def at(m, thr="0.9"):  # an AR model's greedy run, a DLM's at thr
        return runs[m].get("greedy") or runs[m][thr]

    def trained(m):  # steps and seconds of a training run, when there was one
        f = O / m / "results.json"
        if not f.exists():
            return "—"
        r = json.loads(f.read_text())
        return f"{r.get('steps', r.get('max_iters', '?'))} / {r['train_seconds_this_run']:.0f} s"

    print(f"{n} held-out prompts ({', '.join(fams)}), each answered in the chat template, greedy, at threshold "
          f"0.9 for the DLMs; a checker judges each reply; agreement: the reply equals the teacher's, F1: their "
          f"words' overlap; tokens per forward on a canvas of N = {canvas} slots, each row's forwards split into "
          f"those that committed its answer and those spent only on slots after it; −ELBO: the teacher's replies "
          f"under the model, bits per token (exact for the AR models, the bound for DLMs).\n")

    def row(m):
        r = at(m)
        return [what[m], *(f"{r[f'accuracy_{f}']:.2f}" for f in fams), f"{r['accuracy']:.2f}",
                f"{r.get('agree', 1.0):.2f}", f"{r.get('f1', 1.0):.2f}", f"{r['full_stop']:.2f}",
                f"{r['tokens_per_forward']:.2f} ({r['forwards_answer']:.2f} + {r['forwards_after']:.2f})",
                f"{res[m]['nelbo_bits']:.3f}" if "nelbo_bits" in res[m] else "—", trained(m)]
    print(cli.table(["model", *fams, "all", "agree", "F1", "full stop", "tokens per forward (answer + after)",
                     "−ELBO", "steps / train time"], [row(m) for m in models]))
    dlms = [m for m in models if "greedy" not in runs[m]]
    ts = list(runs[dlms[0]]) if dlms else []
    print("\nAccuracy against parallelism: accuracy / tokens per forward at each threshold\n")
    print(cli.table(["model", *(f"threshold {t}" for t in ts)],
                    [[m, *(f"{runs[m][t]['accuracy']:.2f} / {runs[m][t]['tokens_per_forward']:.2f}" for t in ts)]
                     for m in dlms]))
    picks = [0, n // 2, 1]  # three held-out prompts: the first of each family, and the second of the first
    prompts = [at("ar")["rows"][k]["prompt"] for k in picks]
    print("\nThree held-out prompts, every model's reply (threshold 0.9 for the DLMs): " +
          "; ".join(f"({i + 1}) {q!r}" for i, q in enumerate(prompts)) + "\n")
    def cell(text):
        return repr(text).replace("|", "\\|")
    print(cli.table(["model", "(1)", "(2)", "(3)"], [[m, *(cell(at(m)["rows"][k]["reply"]) for k in picks)]
                                                   for m in models]))
    if (O / "merged/merge.json").exists():
        merge = json.loads((O / "merged/merge.json").read_text())
        k = merge["gammas"].index(merge["best_gamma"])
        print(f"\nAR-MAP: γ = {merge['best_gamma']:g} chosen on {merge['train']['n_pairs']} training pairs (reward "
              f"accuracy {merge['train']['reward_accuracy'][k]:.3f}); held-out reward accuracy "
              f"{merge['heldout']['reward_accuracy'][k]:.3f}")

SWEEP_ARMS = {"align0": "nelbo", "align": "nelbo", "distill": "nelbo", "distill-off": "nelbo", "ar-dpo": "stop",
              "dlm-dpo": "stop"}  # each arm's rule, named before the sweep ran (scripts/repro_real.sh)


def sweep_choice(S, arm, rates, start=None):
    """The rate a sweep chooses: "nelbo", the lowest −ELBO of the teacher's validation replies; "stop", the highest
    full-stop share among the rates whose −ELBO is at most 0.5 bits per token above the start model's (ties: the
    lower −ELBO; none within: the lowest −ELBO). -> (rate, {rate: validation results})."""
    val = {r: json.loads((Path(S) / f"eval/{arm}-{r}.json").read_text()) for r in rates}
    nelbo = {r: v["nelbo_bits"] for r, v in val.items()}
    ok = [r for r in rates if start is not None and nelbo[r] <= start + 0.5]
    if SWEEP_ARMS[arm] == "stop" and ok:
        stop = {r: next(iter(val[r]["runs"].values()))["full_stop"] for r in ok}
        return max(ok, key=lambda r: (stop[r], -nelbo[r])), val
    return min(rates, key=nelbo.get), val


def sweep_rates(S, arm, given=None):
    """The rates an arm's sweep ran: given (space-separated), else its ARM.rates file (repro_real.sh writes it)."""
    f = Path(S) / f"{arm}.rates"
    return (given or (f.read_text() if f.exists() else "")).split()


def real_sweep(*args):
    """repro_real.sh: the rate an arm's sweep chooses, printed. args: [--extend] S, ARM, START (an eval/ file's stem:
    the model DPO starts from; - for none), and RATES (words or one space-separated word; default the arm's
    ARM.rates). With --extend: the rate past the choice when it is the sweep's edge (stats.beyond_edge), or nothing."""
    extend = args[0] == "--extend"
    S, arm, start, given = args[extend], args[extend + 1], args[extend + 2], " ".join(args[extend + 3:])
    rates = sweep_rates(S, arm, given or None)
    start = None if start == "-" else json.loads((Path(S) / f"eval/{start}.json").read_text())["nelbo_bits"]
    protocol.print_choice(extend, rates, sweep_choice(S, arm, rates, start)[0])


def real_sweep_table(*args):
    """repro_real.sh: the sweep's table. args: S (each arm's rates from its ARM.rates; else RATES, DPO_RATES)."""
    S = Path(args[0])
    starts = {"ar-dpo": "ar-self", "dlm-dpo": "dlm-dpo-start"}
    print("Validation prompts (worlds.realworld --split validation), seed 1337: −ELBO of the teacher's replies (bits "
          "per token), accuracy, full-stop share (threshold 0.9 for DLMs, dual cache); * the chosen rate.\n")
    rows = []
    for arm, rule in SWEEP_ARMS.items():
        rates = sweep_rates(S, arm, None if len(args) < 3 else args[2] if rule == "stop" else args[1])
        if not rates or not all((S / f"eval/{arm}-{r}.json").exists() for r in rates):
            continue
        start = starts.get(arm)
        start = start and S / f"eval/{start}.json"
        start = json.loads(start.read_text())["nelbo_bits"] if start and start.exists() else None
        best, val = sweep_choice(S, arm, rates, start)
        for r in rates:
            run = next(iter(val[r]["runs"].values()))
            rows.append([arm, rule + ("" if start is None else f" (start {start:.3f})"), r + " *" * (r == best),
                         f"{val[r]['nelbo_bits']:.3f}", f"{run['accuracy']:.2f}", f"{run['full_stop']:.2f}",
                         f"{run['f1']:.2f}"])
    print(cli.table(["arm", "rule", "rate", "−ELBO", "accuracy", "full stop", "F1"], rows))


# The real world's tests, named before the seeds ran (docs/results.md, "The verdict protocol"): per claims row, the
# comparisons (baseline, arm) and per comparison the metrics, each at threshold 0.9 over every held-out prompt.
VERDICT_ROWS = [("REPR-ALIGN converges faster than λ = 0", [("align0", "align"), ("align0-time", "align")],
                 ["right", "f1"]),
                ("OPDLM: on-policy beats off-policy", [("distill-off", "distill")], ["right", "f1"]),
                ("AR-MAP: the preference transfers to the DLM", [("align", "merged")], ["full_stop"]),
                ("AR-MAP beats DPO on the DLM itself", [("dlm-dpo", "merged")], ["full_stop", "right", "f1"])]


def real_verdicts(*dirs):
    """repro_real.sh: the claims rows' tests, the training run as the unit. args: the seeds' real_arms.sh output
    folders (a comparison whose models one of them lacks is left out: REAL_ARMS ran some models alone). Primary: the
    paired t-test over the seeds' means (none with one seed); beside it the pooled test over (seed, prompt) pairs:
    McNemar's exact test on right / full stop, the paired t-test on F1. Each kind Holm-adjusted across the row's tests.
    Every seed answers the same held-out prompts, so the pooled test counts each prompt once per seed. Then each seed's
    means: the numbers the primary test compares."""
    @functools.cache
    def rows(d, m):  # one row per held-out prompt: the DLM's run at threshold 0.9, an AR model's greedy one (read once)
        runs = json.loads((Path(d) / f"eval/{m}.json").read_text())["runs"]
        return (runs.get("greedy") or runs["0.9"])["rows"]

    def have(m):
        return all((Path(d) / f"eval/{m}.json").exists() for d in dirs)

    n = len(dirs)
    print(f"{n} seeds ({', '.join(Path(d).name for d in dirs)}), every held-out prompt of each (the same prompts in "
          f"every seed), threshold 0.9. Primary: the paired t-test over the seeds' means (the training run as the "
          f"unit); beside it the pooled test over (seed, prompt) pairs (McNemar's exact test on right and full stop, "
          f"the paired t-test on F1); each Holm-adjusted across the row's tests; ahead: seeds whose mean is higher for "
          f"the arm\n")
    out = []
    for claim, pairs, metrics in VERDICT_ROWS:
        tests = []
        for a, b in (pair for pair in pairs if have(pair[0]) and have(pair[1])):
            for k in metrics:
                xa, xb = ([r[k] for d in dirs for r in rows(d, m)] for m in (a, b))
                row = protocol.paired_row(xa, xb, n, mcnemar if isinstance(xa[0], bool) else paired_t)
                tests.append([claim, f"{b} against {a}", k, *row[:3], row[3] if n > 1 else None, row[4]])
        per_seed = holm([t[-2] for t in tests]) if n > 1 else [None] * len(tests)
        for t, q, r in zip(tests, per_seed, holm([t[-1] for t in tests])):
            out.append([*t[:-2], "—" if q is None else protocol.pval(t[-2]), "—" if q is None else protocol.pval(q),
                        protocol.pval(r)])
    print(cli.table(["claim", "comparison", "metric", "baseline", "arm", "seeds", "p (per seed)", "p (Holm)",
                     "p (pooled, Holm)"], out))
    metrics = ["right", "full_stop", "f1"]
    used = [m for m in dict.fromkeys(m for _, pairs, _ in VERDICT_ROWS for pair in pairs for m in pair) if have(m)]
    print("\nEach seed's means (held-out prompts, threshold 0.9):\n")
    print(cli.table(["seed", "model", *metrics],
                    [[Path(d).name, m, *(f"{statistics.mean(r[k] for r in rows(d, m)):.3f}" for k in metrics)]
                     for d in dirs for m in used]))


RL_ARMS = {"rl": "diffu-GRPO (rl.py)", "dlm-dpo": "DPO on the DLM (judged pairs)",
           "ar-map": "AR-MAP (DPO on the teacher's judged pairs, merged)"}
RL_STAGES = {"rl": ["rl {s} {r}"], "dlm-dpo": ["pairs dlm {s}", "dlm-dpo {s} {r}"],
             "ar-map": ["pairs ar {s}", "ar-dpo {s} {r}", "merge {s} {r}"]}  # an arm's wall time: its stages


def rl_steps(out, arm, seed, rate):
    """repro_rl.sh's early stopping: the validation exact match (threshold 0.9) of each kept weights of a run
    (eval/ARM-SEED-RATE-STEPS.val.json: a DPO arm's quarters and its end; RL's end) -> (the steps chosen: the highest,
    a tie going to fewer steps; {steps: accuracy})."""
    pre = f"{arm}-{seed}-{rate}-"
    acc = {int(p.name[len(pre):-len(".val.json")]): json.loads(p.read_text())["results"]["runs"][0]["accuracy"]
           for p in (Path(out) / "eval").glob(pre + "*.val.json") if p.name[len(pre):-len(".val.json")].isdigit()}
    if not acc:
        raise SystemExit(f"report.py: no {Path(out) / 'eval' / pre}STEPS.val.json: the run's validation scores")
    return max(acc, key=lambda k: (acc[k], -k)), acc


def rl_choice(out, arm, rates):
    """repro_rl.sh's rule, named before the sweep: the highest validation exact match at threshold 0.9 of a rate's
    chosen steps (rl_steps), seed 1337 (a tie: the lower rate). -> (rate, {rate: accuracy})."""
    acc = {}
    for r in rates:
        k, by_steps = rl_steps(out, arm, 1337, r)
        acc[r] = by_steps[k]
    return chosen_rate(acc), acc


def rl_sweep(*args):
    """repro_rl.sh: the rate an arm's sweep chooses, printed; with --extend first, the rate past it when it is the
    sweep's edge (stats.beyond_edge), or nothing. args: [--extend] OUT ARM RATES..."""
    extend = args[0] == "--extend"
    out, arm, rates = args[extend], args[extend + 1], args[extend + 2:]
    protocol.print_choice(extend, rates, rl_choice(out, arm, rates)[0])


def rl_pick(*args):
    """repro_rl.sh: the steps early stopping chooses for a run, printed. args: OUT ARM SEED RATE."""
    print(rl_steps(*args)[0])


def repro_rl(*args):
    """repro_rl.sh's tables: the sweep, the arms on the held-out prompts, the paired tests (per seed first, the pooled
    per-prompt test beside it), RL's reward curve. args: OUT, SEEDS... (the sweep's rates from each arm's val files)."""
    out, seeds = Path(args[0]), args[1:]
    read = functools.cache(lambda name: json.loads((out / f"eval/{name}.json").read_text()))
    secs = {}
    with contextlib.suppress(FileNotFoundError):
        secs = stage_seconds(out)
    rates = {arm: sorted({p.name[len(f"{arm}-1337-"):-len(".val.json")].rsplit("-", 1)[0] for p in (out / "eval").glob(
        f"{arm}-1337-*-*.val.json")}, key=float, reverse=True) for arm in RL_ARMS}
    chosen = {arm: rl_choice(out, arm, rates[arm]) for arm in RL_ARMS}
    val = read('start.val')['results']['runs'][0]
    print(f"Validation exact match (validation.jsonl's {len(val['correct'])} prompts: the test's mix of lengths, "
          f"none a prompt an arm trains on, none a test prompt; threshold 0.9; seed 1337; a DPO arm's at the steps "
          f"early stopping chose); start {val['accuracy']:.3f}; * the chosen rate\n")
    print(cli.table(["arm", *[f"rate {i + 1}" for i in range(max(map(len, rates.values())))]],
                    [[arm] + [f"{r}: {acc[r]:.3f}{' *' * (r == rate)}" for r in rates[arm]]
                     for arm, (rate, acc) in chosen.items()]))

    def run(name, t):  # the eval file's run at threshold t
        return next(x for x in read(name)["results"]["runs"] if x["threshold"] == t)

    start = {t: run("start.test", t) for t in (0.9, 1.0)}
    families = list(start[0.9]["families"])
    rows = [["start (REPR-ALIGN DLM)", "-", "-", "-", "-", f"{start[0.9]['accuracy']:.3f}",
             *[f"{start[0.9]['families'][f]['accuracy']:.3f}" for f in families], f"{start[1.0]['accuracy']:.3f}",
             f"{start[0.9]['tokens_per_forward']:.2f}", f"{start[1.0]['tokens_per_forward']:.2f}"]]
    for arm, (rate, _) in chosen.items():
        r9 = [run(f"{arm}-{s}.test", 0.9) for s in seeds]
        r1 = [run(f"{arm}-{s}.test", 1.0) for s in seeds]
        steps = [f"{rl_steps(out, arm, s, rate)[0]}" for s in seeds]
        wall = [sum(secs.get(st.format(s=s, r=rate), 0) for st in RL_STAGES[arm]) for s in seeds]
        mean = lambda rs, k: statistics.mean(x[k] for x in rs)  # noqa: E731
        rows.append([RL_ARMS[arm], rate, f"{statistics.mean(wall):.0f}", " / ".join(steps),
                     " / ".join(f"{x['accuracy']:.3f}" for x in r9), f"{mean(r9, 'accuracy'):.3f}",
                     *[f"{statistics.mean(x['families'][f]['accuracy'] for x in r9):.3f}" for f in families],
                     f"{mean(r1, 'accuracy'):.3f}", f"{mean(r9, 'tokens_per_forward'):.2f}",
                     f"{mean(r1, 'tokens_per_forward'):.2f}"])
    N = start[0.9].get("canvas")
    print(f"\nHeld-out exact match ({len(start[0.9]['correct'])} prompts; seeds {', '.join(seeds)}; canvas N = {N}); "
          f"wall: each arm's seconds on this machine, pairs and merge included (mean over seeds); steps: the ones "
          f"early stopping chose per seed (RL: all of them)\n")
    print(cli.table(["arm", "rate", "wall s", "steps per seed", "EM 0.9 per seed", "EM 0.9",
                     *[f"{f} 0.9" for f in families], "EM 1.0", "tok/fwd 0.9", "tok/fwd 1.0"], rows))

    def pooled(name):  # the correct flags at 0.9 over (seed, prompt); the start's repeated for each seed
        return [c for s in seeds for c in run(name.format(s=s), 0.9)["correct"]]
    tests = [(f"{arm} against the start", "start.test", f"{arm}-{{s}}.test") for arm in RL_ARMS] + \
        [(f"rl against {arm}", f"{arm}-{{s}}.test", "rl-{s}.test") for arm in ("dlm-dpo", "ar-map")]
    res = [[what, *protocol.paired_row(pooled(a), pooled(b), len(seeds), mcnemar)] for what, a, b in tests]
    print(f"\nPaired tests, named before the runs: exact match at threshold 0.9; {protocol.PRIMARY}, p adjusted by "
          f"Holm across the five; beside it McNemar's exact test over (seed, prompt) pairs\n")
    print(protocol.holm_table(["comparison", "baseline", "arm", "seeds"], res, "McNemar"))

    curve = {}  # RL's rollouts: mean reward per step (each batch's first step logs it), over the seeds
    for s in seeds:
        for line in (out / s / f"rl-{chosen['rl'][0]}" / "log.jsonl").open():
            rec = json.loads(line)
            if "reward" in rec:
                curve.setdefault(rec["step"], []).append((rec["reward"], rec.get("tokens_per_forward", math.nan)))
    steps = sorted(curve)
    k = min(8, len(steps))  # eight bins of equal size (their sizes differ by one at most)
    bins = [steps[len(steps) * j // k:len(steps) * (j + 1) // k] for j in range(k)]
    print("\nRL's reward curve: the rollouts' mean reward (temperature 1, threshold 0.9) and tokens per forward, "
          "by steps, mean over seeds\n")
    print(cli.table(["steps", "reward", "tok/fwd"], [
        [f"{b[0]}-{b[-1]}", f"{statistics.mean(x[0] for st in b for x in curve[st]):.3f}",
         f"{statistics.mean(x[1] for st in b for x in curve[st]):.2f}"] for b in bins]))


TABLES = {f.__name__: f for f in (*world_tables.COMMANDS, repro_align, distill_untrained, eval_jobs, repro_distill,
                                  repro_merge, repro_tasks, repro_align_tasks, repro_dlm_dpo, repro_mark, real_world,
                                  real_sweep, real_sweep_table, real_verdicts, rl_sweep, rl_pick, repro_rl,
                                  *protocol.COMMANDS, *conversion.COMMANDS, *claims.COMMANDS)}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in TABLES:
        raise SystemExit(f"usage: python -m scripts.report {{{'|'.join(TABLES)}}} ARGS...")
    TABLES[sys.argv[1]](*sys.argv[2:])
