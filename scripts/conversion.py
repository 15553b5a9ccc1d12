"""
The real model's conversion tables (run.sh real, and the curves of scripts/repro_real.sh's parts), read from the JSON
that worlds/realworld.py and the training scripts write. scripts/report.py dispatches to them:

    python -m scripts.report conversion out/real            # the student against its teacher: out/real/results.md
"""
import json
from pathlib import Path

from lib import cli
from scripts.protocol import pval
from scripts.stats import holm, mcnemar, paired_t, seeds_ahead


def kept(student, teacher):
    """The share of the teacher's accuracy a student keeps, as text."""
    return f"{student / teacher:.0%}" if teacher else "—"


def conversion(*args):
    """run.sh real: the chosen student against the teacher on the held-out prompts, at each threshold. args: OUT
    (holding eval/ar.json, eval/student.json and student/results.json)."""
    O = Path(args[0])
    ar, st = (json.loads((O / f"eval/{m}.json").read_text()) for m in ("ar", "student"))
    teacher = ar["runs"]["greedy"]
    fams = [k.removeprefix("accuracy_") for k in teacher if k.startswith("accuracy_")]
    train = json.loads((O / "student/results.json").read_text())
    counts = ", ".join(f"{sum(r['family'] == f for r in teacher['rows'])} {f}" for f in fams + ["open"])
    print(f"SmolLM2-135M-Instruct and the block DLM converted from it (`{O}/student`: {train['steps']} steps, "
          f"{train['train_seconds_this_run'] / 60:.1f} min of training), on {ar['prompts']} held-out prompts "
          f"({counts}; no "
          f"held-out country, sum or subject in any training prompt), greedy, in the chat template, a canvas of "
          f"N = {teacher['canvas']}. Kept: the student's accuracy over the teacher's. F1: the words' overlap with "
          f"the teacher's reply. −ELBO: the teacher's replies under the model, bits per token.\n")
    rows = [["teacher (AR)", *(f"{teacher[f'accuracy_{f}']:.2f}" for f in fams), f"{teacher['accuracy']:.2f}", "—",
             "1.00", "1.00", "1.00", "1.00", f"{ar['nelbo_bits']:.3f}" if "nelbo_bits" in ar else "—"]]
    for thr, run in st["runs"].items():
        rows.append([f"student, threshold {thr}", *(f"{run[f'accuracy_{f}']:.2f}" for f in fams),
                     f"{run['accuracy']:.2f}", kept(run["accuracy"], teacher["accuracy"]), f"{run['f1']:.2f}",
                     f"{run.get('f1_open', float('nan')):.2f}", f"{run['tokens_per_forward']:.2f}",
                     f"{checked_tpf(run):.2f}", f"{st.get('nelbo_bits', float('nan')):.3f}"])
    print(cli.table(["model", *fams, "sum and capital", "kept", "F1", "F1 (open)", "tokens per forward",
                     "tokens per forward (sums and capitals)", "−ELBO"], rows))
    thr = "0.9" if "0.9" in st["runs"] else next(iter(st["runs"]))
    picks = [next(k for k, r in enumerate(teacher["rows"]) if r["family"] == f) for f in fams + ["open"]]
    print(f"\nThe first held-out prompt of each family, the teacher's reply and the student's (threshold {thr}, its "
          f"tokens per forward):\n")
    print(cli.table(["prompt", "teacher", "student", "tokens per forward"], [[
        cell(teacher["rows"][k]["prompt"]), cell(teacher["rows"][k]["reply"]),
        cell(st["runs"][thr]["rows"][k]["reply"]), f"{st['runs'][thr]['rows'][k]['tokens_per_forward']:.2f}"]
        for k in picks]))


def checked_tpf(run):
    """Tokens per forward over the replies to the checked prompts only (sums and capitals, whose accuracy the
    goal's kept share measures): the mean over those replies, as run["tokens_per_forward"] is over all of them."""
    tpf = [r["tokens_per_forward"] for r in run["rows"] if r["right"] is not None]
    return sum(tpf) / len(tpf)


def cell(text):
    return repr(text).replace("|", "\\|")


def curve_points(R, teacher=None):
    """A run's snapshots (scripts/repro_conversion.sh) -> [(step, training minutes, {threshold: realworld run},
    −ELBO bits)], in step order; teacher: its greedy run, for the kept share."""
    R, out = Path(R), []
    for f in sorted((R / "eval").glob("step-*.json"), key=lambda f: int(f.stem.split("-")[1])):
        snap = json.loads((R / f.stem / "snapshot.json").read_text())
        res = json.loads(f.read_text())
        out.append((snap["step"], snap["train_seconds"] / 60, res["runs"], res.get("nelbo_bits")))
    return out


def conversion_curve(*args):
    """scripts/repro_conversion.sh: one arm's curve: each snapshot at threshold 0.9 against the minutes it trained,
    then the last snapshot at every threshold it was scored at (the frontier). args: RUN [TEACHER_EVAL]."""
    R = Path(args[0])
    teacher = json.loads(Path(args[1] if len(args) > 1 else "out/real/eval/ar.json").read_text())["runs"]["greedy"]
    points = curve_points(R)
    print(f"{R}: the held-out prompts at threshold 0.9, against minutes of training (2-core CPU; the compiled "
          f"step's first call included). Teacher: sum {teacher['accuracy_sum']:.2f}, capital "
          f"{teacher['accuracy_capital']:.2f}, both {teacher['accuracy']:.2f}.\n")
    rows = []
    for step, minutes, runs, nelbo in points:
        r = runs.get("0.9") or next(iter(runs.values()))
        rows.append([step, f"{minutes:.1f}", f"{r['accuracy_sum']:.2f}", f"{r['accuracy_capital']:.2f}",
                     f"{r['accuracy']:.2f}", kept(r["accuracy"], teacher["accuracy"]), f"{r['f1']:.2f}",
                     f"{r.get('f1_open', float('nan')):.2f}", f"{nelbo:.3f}" if nelbo is not None else "—",
                     f"{r['tokens_per_forward']:.2f}"])
    print(cli.table(["step", "minutes", "sum", "capital", "both", "kept", "F1", "F1 (open)", "−ELBO",
                     "tokens per forward"], rows))
    step, minutes, runs, _ = points[-1]
    print(f"\nThe last snapshot (step {step}, {minutes:.1f} min) at each threshold: accuracy on sums and capitals "
          f"against tokens per forward, over all the replies and over the sums' and capitals' alone\n")
    print(cli.table(["threshold", "both", "kept", "F1", "tokens per forward",
                     "tokens per forward (sums and capitals)"], [
        [t, f"{r['accuracy']:.2f}", kept(r["accuracy"], teacher["accuracy"]), f"{r['f1']:.2f}",
         f"{r['tokens_per_forward']:.2f}", f"{checked_tpf(r):.2f}"] for t, r in runs.items()]))


def conversion_plot(*args):
    """The arms' curves as one PNG: accuracy on the held-out sums and capitals, and F1 with the teacher's replies to
    the open prompts, at threshold 0.9, against minutes of training; the teacher as a line. args: PNG TEACHER_EVAL
    RUN [RUN...]; a RUN may be several seeds' runs, comma-separated: their last snapshots drawn as the mean, with
    the seeds' range as its bar (matplotlib needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    png, runs = args[0], args[2:]
    teacher = json.loads(Path(args[1]).read_text())["runs"]["greedy"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for arg in runs:
        seeds = arg.split(",")
        at = [[(m, r.get("0.9") or next(iter(r.values()))) for _, m, r, _ in curve_points(R)] for R in seeds]
        if len(seeds) > 1:  # the seeds' last points: the mean, and the range as an error bar
            last = [points[-1] for points in at]
            label = f"{Path(seeds[0]).name.rsplit('-s', 1)[0]} ({len(seeds)} seeds)"
            for ax, key in zip(axes, ("accuracy", "f1_open")):
                v = [r.get(key, float("nan")) for _, r in last]
                mean = sum(v) / len(v)
                ax.errorbar([sum(m for m, _ in last) / len(last)], [mean], yerr=[[mean - min(v)], [max(v) - mean]],
                            marker="s", capsize=4, ls="none", label=label)
            continue
        at = at[0]
        for ax, key in zip(axes, ("accuracy", "f1_open")):
            ax.plot([m for m, _ in at], [r.get(key, float("nan")) for _, r in at], marker="o", label=Path(arg).name)
    axes[0].axhline(teacher["accuracy"], color="k", ls="--", label="teacher")
    axes[1].axhline(1.0, color="k", ls="--", label="teacher")
    for ax, title in zip(axes, ("held-out sums and capitals: accuracy", "held-out open prompts: F1 with the teacher")):
        ax.set(title=title, xlabel="minutes of training (2-core CPU)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    print(f"wrote {png}")


def last_rows(R, threshold="0.9"):
    """A run's last snapshot on the held-out prompts at `threshold` -> its rows (one per prompt, in order). R: a run
    directory (scripts/repro_conversion.sh) or a worlds/realworld.py result (run.sh real's eval/student.json)."""
    if str(R).endswith(".json"):
        return json.loads(Path(R).read_text())["runs"][threshold]["rows"]
    return curve_points(R)[-1][2][threshold]["rows"]


def conversion_verdicts(*args):
    """Two arms at their longest budget, seed by seed: the training run is the unit. args: A_RUNS B_RUNS, each a
    comma-separated list of runs (directories of scripts/repro_conversion.sh, or worlds/realworld.py results), the
    same seeds in the same order. Per metric (accuracy on the held-out sums and capitals; F1 with the teacher on
    every prompt; both at threshold 0.9, from each run's last snapshot): the primary test, named in advance, is the
    paired t-test over seeds of each run's mean, Holm-adjusted across the row's metrics; beside it, the per-prompt
    test over each prompt's mean across seeds (every seed answers the same held-out prompts, so this one pairs by
    prompt): the paired t-test, or McNemar's exact test on accuracy where each arm has one run. B is ahead or behind
    where the primary Holm p < 0.05, otherwise level; with one run each there is no primary test and no verdict,
    and the per-prompt tests (Holm across the metrics) say how sure the comparison is for these two runs alone."""
    A, B = ([Path(r) for r in arg.split(",")] for arg in args[:2])
    if len(A) != len(B):
        raise SystemExit("conversion_verdicts: give the same number of seeds for each arm")
    one = len(A) == 1
    metrics = {"accuracy (sums and capitals)": lambda r: None if r["right"] is None else float(r["right"]),
               "F1 with the teacher": lambda r: r["f1"]}
    tests, per_seed = [], []
    for name, value in metrics.items():
        per = [[[value(r) for r in last_rows(R)] for R in arm] for arm in (A, B)]  # arm -> seed -> prompt
        keep = [k for k, v in enumerate(per[0][0]) if v is not None]
        per = [[[run[k] for k in keep] for run in arm] for arm in per]
        seed_a, seed_b = ([sum(run) / len(run) for run in arm] for arm in per)
        prompt_a, prompt_b = ([sum(run[k] for run in arm) / len(arm) for k in range(len(keep))] for arm in per)
        per_seed += [seed_a, seed_b]
        prompt_test = mcnemar if one and name.startswith("accuracy") else paired_t  # one run: right/wrong a prompt
        tests.append([name, f"{sum(seed_a) / len(A):.3f}", f"{sum(seed_b) / len(B):.3f}",
                      seeds_ahead([b - a for a, b in zip(seed_a, seed_b)]), None if one else paired_t(seed_a, seed_b),
                      prompt_test(prompt_a, prompt_b), len(keep)])
    names = f"{', '.join(map(str, B))} against {', '.join(map(str, A))}"
    if one:
        print(f"{names}: one run each, threshold 0.9. No verdict: the training run is the unit, and one run a side "
              f"has no test over runs. Beside it, the per-prompt tests (McNemar's exact test on accuracy, the paired "
              f"t-test on F1; Holm across the two) say how sure the difference is for these two runs alone.\n")
        print(cli.table(["metric", "A", "B", "p (prompts)", "p (prompts, Holm)", "prompts"],
                        [[name, a, b, pval(pp), pval(q), n] for (name, a, b, _, _, pp, n), q in
                         zip(tests, holm([t[5] for t in tests]))]))
        return
    adjusted = holm([t[4] for t in tests])
    print(f"{names}: {len(A)} seeds, the last snapshot of each, threshold 0.9. Primary: the paired t-test over seeds "
          f"(Holm across the metrics); beside it the paired t-test over prompts (each prompt's mean over seeds; every "
          f"seed answers the same prompts).\n")
    rows = [[name, a, b, ahead, pval(p), pval(q), pval(pp), pval(qq), n,
             "level" if q >= 0.05 else "ahead" if float(b) > float(a) else "behind"]
            for (name, a, b, ahead, p, pp, n), q, qq in zip(tests, adjusted, holm([t[5] for t in tests]))]
    print(cli.table(["metric", "A", "B", "seeds B ahead", "p (seeds)", "p (seeds, Holm)", "p (prompts)",
                     "p (prompts, Holm)", "prompts", "B against A"], rows))
    print("\nThe runs, pair by pair (the units of the primary test):\n")
    print(cli.table(["A", "B", "accuracy A", "accuracy B", "F1 A", "F1 B"],
                    [[*(f"{R.parent.name}/{R.name}" if R.suffix == ".json" else R.name for R in (a, b)),
                      *(f"{v[k]:.3f}" for v in per_seed)] for k, (a, b) in enumerate(zip(A, B))]))


def goal_verdict(p_holm, mean, goal):
    """A goal's verdict over runs: "met" or "short" (by the mean's side of the goal) where the Holm p < 0.05, else
    "not settled"; "—" without a test (one run)."""
    if p_holm is None:
        return "—"
    return "not settled" if p_holm >= 0.05 else "met" if mean >= goal else "short"


def conversion_goal(*args):
    """Does an arm meet the conversion's goal, over its runs? args: TEACHER_EVAL RUNS [KEPT [TPF]]: the teacher's
    worlds/realworld.py result; the arm's runs, one per seed, comma-separated (directories of repro_conversion.sh or
    realworld.py results, each at its last snapshot, threshold 0.9); the goal's share of the teacher's accuracy on
    the held-out sums and capitals (default 0.9) and its tokens per forward on them (default 1.5). Per goal, the
    primary test is the one-sample t-test over the runs of value − goal, Holm across the two goals (runs that all
    score the same, off the goal, give p = 0); beside it the same over prompts: each checked prompt's mean over the
    runs against KEPT × the teacher's right (0 or 1) or TPF. Verdicts: goal_verdict."""
    if not 2 <= len(args) <= 4:
        raise SystemExit("conversion_goal: give TEACHER_EVAL RUNS [KEPT [TPF]]")
    teacher = json.loads(Path(args[0]).read_text())["runs"]["greedy"]
    runs = [Path(r) for r in args[1].split(",")]
    goal_kept = float(args[2]) if len(args) > 2 else 0.9
    goal_tpf = float(args[3]) if len(args) > 3 else 1.5
    t_rows = [r for r in teacher["rows"] if r["right"] is not None]
    t_right = [float(bool(r["right"])) for r in t_rows]
    if not sum(t_right):
        raise SystemExit(f"conversion_goal: the teacher ({args[0]}) answers none of the checked prompts: no share")
    t_acc = sum(t_right) / len(t_rows)
    per_run = []  # run -> its checked rows, in the teacher's order
    for R in runs:
        rows = [r for r in last_rows(R) if r["right"] is not None]
        if [r.get("prompt") for r in rows] != [r.get("prompt") for r in t_rows]:
            raise SystemExit(f"conversion_goal: {R} did not answer the teacher's held-out prompts, in its order")
        per_run.append(rows)
    n, m = len(runs), len(t_rows)
    right = [[float(bool(r["right"])) for r in rows] for rows in per_run]  # run -> prompt
    tpf = [[r["tokens_per_forward"] for r in rows] for rows in per_run]

    def over_runs(v):  # each prompt's mean over the runs
        return [sum(col) / n for col in zip(*v)]
    goals = {  # name: (goal, format, each run's value, the prompt test's p)
        "kept share of the teacher's accuracy": (goal_kept, "{:.0%}", [sum(v) / m / t_acc for v in right],
                                                 paired_t([goal_kept * t for t in t_right], over_runs(right))),
        "tokens per forward (sums and capitals)": (goal_tpf, "{:.2f}", [sum(v) / m for v in tpf],
                                                   paired_t([goal_tpf] * m, over_runs(tpf)))}
    p_runs = [paired_t([goal] * n, vals) if n > 1 else None for goal, _, vals, _ in goals.values()]
    q_runs = holm(p_runs) if n > 1 else [None] * len(goals)
    q_prompts = holm([pp for *_, pp in goals.values()])
    print(f"{', '.join(map(str, runs))}: {n} run{'s' * (n > 1)} on {m} held-out sums and capitals (the teacher "
          f"answers {t_acc:.2f}){'' if n > 1 else '; one run: no test over runs, no verdict'}.\n")
    print(cli.table(["goal", "target", "mean", "runs at or past it", "p (runs)", "p (runs, Holm)", "p (prompts)",
                     "p (prompts, Holm)", "verdict"],
                    [[name, fmt.format(goal), fmt.format(sum(vals) / n), f"{sum(v >= goal for v in vals)} of {n}",
                      "—" if p is None else pval(p), "—" if q is None else pval(q), pval(pp), pval(qq),
                      goal_verdict(q, sum(vals) / n, goal)]
                     for (name, (goal, fmt, vals, pp)), p, q, qq in zip(goals.items(), p_runs, q_runs, q_prompts)]))
    (kept_runs, tpf_runs) = (vals for _, _, vals, _ in goals.values())
    print("\nThe runs (the units of the primary test):\n")
    print(cli.table(["run", "accuracy", "kept", "tokens per forward (sums and capitals)"],
                    [[f"{R.parent.name}/{R.name}" if R.suffix == ".json" else R.name, f"{k * t_acc:.3f}",
                      f"{k:.0%}", f"{t:.2f}"] for R, k, t in zip(runs, kept_runs, tpf_runs)]))


def conversion_sweep(*args):
    """scripts/sweep_conversion.sh: the arm's runs at each rate -> a table of their scores on the validation prompts
    (eval/validation.json: −ELBO of the teacher's replies, accuracy on sums and capitals, F1 with the teacher, at
    threshold 0.9), align.py's −ELBO of the corpus's validation conversations (val_nelbo) and training minutes; the
    chosen rate (the rule: the lowest validation −ELBO of the teacher's replies; a tie goes to the lower rate) and
    whether it is an edge of the sweep; beside the accuracy, the share of the teacher's it keeps and the tokens per
    forward on the sums and capitals (the goal's columns). args: TEACHER_EVAL RATE=RUN... (the teacher's
    worlds/realworld.py result on the validation prompts; each run with results.json and eval/validation.json)."""
    teacher = json.loads(Path(args[0]).read_text())["runs"]["greedy"]
    rows = []
    for arg in args[1:]:
        rate, _, R = arg.partition("=")
        res = json.loads((Path(R) / "results.json").read_text())
        val = json.loads((Path(R) / "eval/validation.json").read_text())
        run = val["runs"].get("0.9") or next(iter(val["runs"].values()))
        rows.append((float(rate), val["nelbo_bits"], run["accuracy"], run["f1"], res["val_nelbo"], res["steps"],
                     res["train_seconds_this_run"] / 60, Path(R).name, checked_tpf(run)))
    rows.sort()
    best = min(rows, key=lambda r: (r[1], r[0]))
    print(f"The teacher on the validation prompts: accuracy {teacher['accuracy']:.2f} on the sums and capitals.\n")
    print(cli.table(["rate", "steps", "minutes of training", "−ELBO (validation prompts)", "accuracy", "kept", "F1",
                     "tokens per forward (sums and capitals)", "−ELBO (corpus validation)", "run"],
                    [[f"{lr:g}{' *' * (r is best)}", steps, f"{m:.1f}", f"{nelbo:.3f}", f"{acc:.2f}",
                      kept(acc, teacher["accuracy"]), f"{f1:.2f}", f"{tpf:.2f}", f"{corpus:.3f}", name]
                     for r in rows for lr, nelbo, acc, f1, corpus, steps, m, name, tpf in [r]]))
    edge = len(rows) > 1 and best in (rows[0], rows[-1])
    print(f"\nchosen: {best[0]:g}" + (" (an edge of the sweep: extend it past this rate)" if edge else
                                       " (inside the sweep)" if len(rows) > 2 else ""))


COMMANDS = (conversion, conversion_curve, conversion_plot, conversion_verdicts, conversion_goal,
            conversion_sweep)
