"""
The verdict protocol's runs in the two small worlds (docs/results.md, "The verdict protocol"): the rate each
sweep chooses, the equal-time arm's steps, and the tables of a protocol run (the sweep, the arms on the test
split, the tests named in advance with Holm's correction). The scripts call them through scripts/report.py:

    python -m scripts.report val_sweep out/tasks/repro-align p-lam0 1e-2 3e-3 1e-3 3e-4   # prints the chosen rate
    python -m scripts.report align_protocol out/tasks/repro-align 3e-3 1e-3 102 "1e-2 3e-3 1e-3 3e-4" 1 2 3 4 5

Each function takes the strings its script passes and reads the files those runs wrote.
"""
import csv
import functools
import json
import statistics
from pathlib import Path

from lib import cli
from scripts.stats import beyond_edge, chosen_rate, equal_time_steps, holm, mcnemar, paired_t, seeds_ahead


PRIMARY = "the primary test the paired t over the seeds' means (the training run as the unit)"


def pval(p):
    """A p-value in 3 significant digits; one below the floats' range (the exact computation underflows to 0) as a
    bound that holds for every test here."""
    return f"{p:.3g}" if p > 0 else "< 1e-300"


def holm_table(header, tests, pooled):
    """A markdown table of tests named in advance, rows ending in paired_row's two p-values: the per-seed p (the
    primary test), Holm's adjustment of it across the rows, and beside them the pooled test's p, Holm-adjusted the
    same way."""
    return cli.table([*header, "p (per seed)", "p (Holm)", f"p ({pooled}, pooled, Holm)"],
                     [[*row[:-2], pval(row[-2]), pval(q), pval(r)] for row, q, r in
                      zip(tests, holm([x[-2] for x in tests]), holm([x[-1] for x in tests]))])


def seed_means(values, n_seeds):
    """A (seed, item) list in seed order -> each seed's mean."""
    n = len(values) // n_seeds
    return [statistics.mean(values[j:j + n]) for j in range(0, len(values), n)]


def past_first_edge(rates, choices):
    """The rate past the first of `choices` (each route's choice over the same rates) that is the sweep's edge, or
    "" when none is: what stage.sh's sweep reads for a sweep that runs every route at each rate."""
    return next((x for x in (beyond_edge(rates, c) for c in choices) if x), "")


def paired_row(a, b, n_seeds, pooled_test, lower=False):
    """b (the arm) against a (the baseline), each over (seed, item) in seed order -> [mean a, mean b, the seeds in
    which the arm is ahead (higher; lower with `lower`, as for a -ELBO), the paired t over the seeds' means (the
    training run as the unit: the primary test), pooled_test over the (seed, item) pairs (beside it)]."""
    ma, mb = seed_means(a, n_seeds), seed_means(b, n_seeds)
    d = [y - x for x, y in zip(ma, mb)]
    return [f"{statistics.mean(a):.3f}", f"{statistics.mean(b):.3f}", seeds_ahead([-x for x in d] if lower else d),
            paired_t(ma, mb), pooled_test(a, b)]


def time_steps(*args):
    """The protocol's equal-time arm: the cheaper arm's steps in the costlier one's time, printed. args: COSTLY_RUN,
    CHEAP_RUN, STEPS: round(STEPS × their median seconds per step (results.json), costly over cheap), or STEPS when
    the costly arm is not more than 5% slower (no time arm then)."""
    a, b = (json.loads((Path(run) / "results.json").read_text())["step_seconds_median"] for run in args[:2])
    print(equal_time_steps(int(args[2]), a, b))


def val_sweep(*args):
    """The protocol's sweep (repro_align_tasks.sh, repro_tasks.sh): the rate it chooses, printed. args: [--extend] R,
    PREFIX, RATES...: the highest final validation exact match at threshold 0.9 (task_acc of R/PREFIX-RATE-s1; a tie:
    the lower rate). With --extend: the rate past the choice when it is the sweep's edge (stats.beyond_edge), or
    nothing."""
    extend = args[0] == "--extend"
    R, prefix, rates = Path(args[extend]), args[extend + 1], args[extend + 2:]
    print_choice(extend, rates, chosen_rate({
        r: json.loads((R / f"{prefix}-{r}-s1/results.json").read_text())["task_acc"] for r in rates}))


def sweep_table(R, arms, rates, steps):
    """The sweep at seed 1: each arm's final validation exact match at 0.9 (at 1.0 where the run logged it), median
    seconds per step; * the chosen rate; — a rate the arm's sweep did not run. arms: [(label, run prefix, chosen
    rate)]; rates: every rate any arm ran."""
    def cell(r, chosen, run):
        if not run.exists():
            return "—"
        x = json.loads(run.read_text())
        also = f" ({x['task_acc@1']:.3f})" if "task_acc@1" in x else ""
        return f"{x['task_acc']:.3f}{also}, {x['step_seconds_median']:.3f} s{' *' * (r == chosen)}"
    rates = sorted(set(rates), key=float, reverse=True)
    print(f"The sweep, seed 1, {steps} steps: final exact match on the validation split (100 prompts per family) at "
          "threshold 0.9 (1.0 in brackets, where logged), median seconds per step; * the chosen rate\n")
    print(cli.table(["arm", *[f"lr {r}" for r in rates]], [
        [label] + [cell(r, chosen, R / f"{prefix}-{r}-s1/results.json") for r in rates]
        for label, prefix, chosen in arms]))


def test_tables(R, arms, comparisons, thresholds, seeds):
    """The test prompts: each arm's exact match and tokens per forward (R/eval/RUN-sSEED.json, eval.py tasks), then
    each comparison at each threshold: the paired t over the seeds' means, Holm across all of them, McNemar's exact
    test over (seed, prompt) pairs beside it.
    arms: [(run, label)]; comparisons: [(label, baseline run, arm run)]."""
    ev = functools.cache(lambda m, s, t: next(x for x in json.loads((R / f"eval/{m}-s{s}.json").read_text())
                                              ["results"]["runs"] if x["threshold"] == t))
    first = ev(arms[0][0], seeds[0], thresholds[0])
    print(f"\nThe test: {len(first['correct'])} held-out prompts, seeds {', '.join(seeds)}, canvas N = "
          f"{first['canvas']}: exact match and tokens per forward, mean over seeds\n")
    mean = lambda m, t, k: statistics.mean(ev(m, s, t)[k] for s in seeds)  # noqa: E731
    print(cli.table(["run", *[f"EM {t:g}" for t in thresholds], *[f"tok/fwd {t:g}" for t in thresholds]], [
        [what, *[f"{mean(m, t, 'accuracy'):.3f}" for t in thresholds],
         *[f"{mean(m, t, 'tokens_per_forward'):.2f}" for t in thresholds]] for m, what in arms]))
    print(f"\nEach seed's exact match (seeds {', '.join(seeds)}): the numbers the per-seed tests pair\n")
    print(cli.table(["run", "threshold", "per seed"], [
        [what, f"{t:g}", " / ".join(f"{ev(m, s, t)['accuracy']:.3f}" for s in seeds)]
        for m, what in arms for t in thresholds]))
    tests = []
    for label, base, arm in comparisons:
        for t in thresholds:
            a, b = ([c for s in seeds for c in ev(m, s, t)["correct"]] for m in (base, arm))
            tests.append([label, f"{t:g}", *paired_row(a, b, len(seeds), mcnemar)])
    print(f"\nThe tests named in advance: exact match; {PRIMARY}, p adjusted by Holm across the "
          f"{len(tests)}; McNemar's exact test over (seed, prompt) pairs beside it\n")
    print(holm_table(["comparison", "threshold", "baseline", "arm", "seeds"], tests, "McNemar"))


def align_protocol(*args):
    """repro_align_tasks.sh PART=protocol: the sweep, the test at the chosen rates, the paired tests named in
    advance. args: R, λ = 0's rate, λ = 10's rate, λ = 0's steps at equal time, "SWEEP RATES", SEEDS..."""
    R, r0, r10, k, rates, seeds = Path(args[0]), args[1], args[2], args[3], args[4].split(), args[5:]
    sweep_table(R, [("λ = 0", "p-lam0", r0), ("λ = 10", "p-lam10", r10)], rates, 80)
    arms = [(f"p-lam0-{r0}", f"λ = 0, lr {r0}, 80 steps"), (f"p-lam10-{r10}", f"λ = 10, lr {r10}, 80 steps"),
            (f"p-lam0time-{r0}", f"λ = 0, lr {r0}, {k} steps (λ = 10's 80 steps of time)")]
    test_tables(R, arms, [("λ = 10 against λ = 0, equal steps", arms[0][0], arms[1][0]),
                          ("λ = 10 against λ = 0, equal time", arms[2][0], arms[1][0])], (0.9, 1.0), seeds)


def l2_sweep(*args):
    """repro_align_tasks.sh PART=protocol: L2's λ and rate, printed "λ rate". args: [--extend] R, "LAMBDAS", "RATES":
    the highest final validation exact match at 0.9 of R/p-l2-λ-RATE-s1 (at λ = 0 λ = 0's own runs, l2_runs; a tie:
    the lower λ, then the lower rate).
    With --extend: where the choice is an edge of the grid, the axis and the value past it ("lambda 0.1", "rate
    3e-4"; λ first), or nothing."""
    extend = args[0] == "--extend"
    R, lambdas, rates = Path(args[extend]), args[extend + 1].split(), args[extend + 2].split()
    print_choice(extend, rates, lambdas=lambdas, chosen=chosen_rate({
        (lam, r): json.loads((R / f"{l2_runs(lam, 'p-')}-{r}-s1/results.json").read_text())["task_acc"]
        for lam in lambdas for r in rates}))


def print_choice(extend, rates, chosen, lambdas=None):
    """A sweep's choice, printed: its rate, or "λ rate" over L2's λ × rate grid (lambdas given, chosen a pair). With
    extend, where the choice is an edge, the value past it instead (stats.beyond_edge; over the grid the axis first,
    "lambda 0.1" or "rate 3e-4", λ before the rate), or nothing: what stage.sh's sweep and sweep2 read."""
    lam, rate = chosen if lambdas is not None else (None, chosen)
    if not extend:
        print(*[x for x in (lam, rate) if x is not None])
    elif lambdas is not None and (past := lambda_past(lambdas, lam)):
        print("lambda", f"{float(past):g}")
    elif past := beyond_edge(rates, rate):
        print(*(["rate"] if lambdas is not None else []), past)


def l2_runs(lam, prefix=""):
    """The name of L2's runs at λ, before "-RATE": PREFIX + l2-λ; at λ = 0 the L2 term vanishes and its runs are
    λ = 0's own, PREFIX + lam0 (the λ = 0 arm's sweep and seeds): the lower bound of L2's λ grid."""
    return f"{prefix}lam0" if float(lam) == 0 else f"{prefix}l2-{lam}"


def lambda_past(lambdas, lam):
    """The λ past L2's choice when it is an edge of the λ grid (stats.beyond_edge), or None. λ = 0 is the bound of
    λ ≥ 0: a choice there is not an edge, and in a grid that holds 0 the least λ above it has 0 below it (the gap
    between them unswept, as between any two grid points), so only the grid's top goes on (one positive λ alone: a
    half-decade step up)."""
    if float(lam) == 0:
        return None  # the bound of λ ≥ 0
    above = sorted((x for x in lambdas if float(x) > 0), key=float)
    if len(above) == len(lambdas):
        return beyond_edge(above, lam)  # no 0 in the grid: either edge goes on
    if lam != above[-1]:
        return None  # 0 below the least λ: only the top goes on
    below = above[-2] if len(above) > 1 else f"{float(lam) / 3:g}"  # one λ above 0: a half-decade step
    return beyond_edge([below, lam], lam)


def l2_label(lam):
    """The sweep tables' name of L2 at λ (at 0: λ = 0's own runs)."""
    return "L2, λ = 0 (λ = 0's runs)" if float(lam) == 0 else f"L2, λ = {lam}"


def l2_protocol(*args):
    """repro_align_tasks.sh PART=protocol: cosine (λ = 10) against L2, each at its chosen setting. args: R, cosine's
    rate, L2's λ, L2's rate, "L2 LAMBDAS", "SWEEP RATES", SEEDS..."""
    R, r10, l2, rl2, lambdas, rates, seeds = Path(args[0]), *args[1:4], args[4].split(), args[5].split(), args[6:]
    sweep_table(R, [(l2_label(lam), l2_runs(lam, "p-"), rl2 if lam == l2 else None)
                    for lam in sorted(lambdas, key=float)], rates, 80)
    arms = [(f"{l2_runs(l2, 'p-')}-{rl2}", f"{l2_label(l2)}, lr {rl2}, 80 steps"),
            (f"p-lam10-{r10}", f"cosine, λ = 10, lr {r10}, 80 steps")]
    test_tables(R, arms, [("cosine against L2", arms[0][0], arms[1][0])], (0.9, 1.0), seeds)


def opdlm_protocol(*args):
    """repro_tasks.sh PART=protocol: OPDLM on against off policy. args: R, on's rate, off's rate, off's steps at
    on's 200 steps of time (200: the same cost, no time arm), "SWEEP RATES", SEEDS..."""
    R, ron, roff, k, rates, seeds = Path(args[0]), args[1], args[2], int(args[3]), args[4].split(), args[5:]
    sweep_table(R, [("on-policy", "on", ron), ("off-policy", "off", roff)], rates, 200)
    arms = [(f"off-{roff}", f"off-policy, lr {roff}, 200 steps"), (f"on-{ron}", f"on-policy, lr {ron}, 200 steps")]
    comparisons = [("on against off, equal steps", arms[0][0], arms[1][0])]
    if k != 200:
        arms.append((f"offtime-{roff}", f"off-policy, lr {roff}, {k} steps (on-policy's 200 steps of time)"))
        comparisons.append(("on against off, equal time", arms[2][0], arms[1][0]))
    test_tables(R, arms, comparisons, (0.5, 0.7, 0.9, 0.95, 1.0), seeds)


def mark_sweep(*args):
    """repro_mark.sh PART=protocol: the DPO rate a route's sweep chooses, printed. args: P, ROUTE, RATES...: the
    highest share of validation prompts answered right and with the full stop at 0.9 (a tie: the lower rate). Or
    --extend P RATES...: the rate past a route's choice that is the sweep's edge (AR-MAP's first; both routes run
    each rate), or nothing."""
    extend = args[0] == "--extend"
    P, rates = Path(args[extend]), args[2:]  # --extend P RATES..., or P ROUTE RATES...

    def choice(route):
        return chosen_rate({r: json.loads((P / f"eval/val-{route}-{r}.json").read_text())["results"]["runs"][0][
            "preferred"] for r in rates})
    print(past_first_edge(rates, map(choice, ("ar-map", "dlm-dpo"))) if extend else choice(args[1]))


def stage_seconds(P):
    """{stage name: seconds} of a script's STAGE_LOG (P/seconds.tsv; scripts/stage.sh writes it)."""
    return {row[0]: int(row[1]) for row in csv.reader((Path(P) / "seconds.tsv").open(), delimiter="\t")}


def dlm_dpo_steps(*args):
    """repro_mark.sh and repro_dlm_dpo.sh PART=protocol: DPO on the DLM's steps in AR-MAP's seconds at the sweep's
    seed, printed (STEPS when DPO on the DLM is not more than 5% cheaper). args: P, AR-MAP's rate, DLM-only's rate,
    STEPS, SEED: the stages "ar-dpo RATE SEED" + "merge RATE SEED" against "dlm-dpo RATE SEED" in P/seconds.tsv."""
    P, ra, rd, steps, seed = args[0], args[1], args[2], int(args[3]), args[4]
    sec = stage_seconds(P)
    print(equal_time_steps(steps, sec[f"ar-dpo {ra} {seed}"] + sec[f"merge {ra} {seed}"], sec[f"dlm-dpo {rd} {seed}"]))


def mark_protocol(*args):
    """repro_mark.sh PART=protocol: the sweep, the routes on the test prompts, the tests named in advance. args: P,
    AR-MAP's rate, DLM-only's rate, DLM-only's steps at equal time (100: no time arm), "SWEEP RATES", SEEDS..."""
    P, ra, rd, k, rates, seeds = Path(args[0]), args[1], args[2], int(args[3]), args[4].split(), args[5:]
    rates = sorted(rates, key=float, reverse=True)  # the sweep's, with any rates past its first edge
    read = functools.cache(lambda name: json.loads((P / f"eval/{name}.json").read_text())["results"]["runs"][0])
    gamma = functools.cache(lambda r, s: json.loads((P / f"ar-map-{r}-s{s}/merge.json").read_text())["best_gamma"])
    sec = stage_seconds(P)
    chosen = {"ar-map": ra, "dlm-dpo": rd}
    print("The sweep, seed 1, 100 DPO steps: the share of the validation prompts (100 per family) answered right with "
          "the full stop at threshold 0.9 (right in either form in brackets); AR-MAP's γ by merge.py's rule; * the "
          "chosen rate\n")
    print(cli.table(["route", *[f"lr {r}" for r in rates]], [
        [route] + [f"{read(f'val-{route}-{r}')['preferred']:.3f} ({read(f'val-{route}-{r}')['right']:.3f})"
                   + (f", γ {gamma(r, '1'):g}" if route == "ar-map" else "") + " *" * (r == chosen[route])
                   for r in rates] for route in ("ar-map", "dlm-dpo")]))
    arms = [("align", "the REPR-ALIGN DLM (the start)", []),  # (run, label, its stages' names in seconds.tsv)
            (f"ar-map-{ra}", f"AR-MAP, DPO lr {ra}", [f"ar-dpo {ra} {{s}}", f"merge {ra} {{s}}"]),
            (f"dlm-dpo-{rd}", f"DPO on the DLM, lr {rd}, 100 steps", [f"dlm-dpo {rd} {{s}}"])]
    if k != 100:
        arms.append((f"dlm-dpo-time-{rd}", f"DPO on the DLM, lr {rd}, {k} steps (AR-MAP's seconds)",
                     [f"dlm-dpo-time {rd} {{s}}"]))

    def runs(m):  # the arm's eval run per seed (the start: the same run for every seed)
        return [read("align-s0") if m == "align" else read(f"{m}-s{s}") for s in seeds]

    def flags(m, key):  # per (seed, prompt): right (either form) or preferred (right with the full stop)
        return [c or p if key == "right" else p for r in runs(m) for c, p in zip(r["correct"], r["preferred_rows"])]
    rows = []
    for m, what, stages in arms:
        wall = [sum(sec.get(st.format(s=s), 0) for st in stages) for s in seeds]
        rows.append([what, f"{statistics.mean(flags(m, 'right')):.3f}", f"{statistics.mean(flags(m, 'preferred')):.3f}",
                     *(" / ".join(f"{r[key]:.3f}" for r in runs(m)) for key in ("right", "preferred")),
                     f"{statistics.mean(r['tokens_per_forward'] for r in runs(m)):.2f}",
                     ", ".join(f"{gamma(ra, s):g}" for s in seeds) if m.startswith("ar-map") else "—",
                     f"{statistics.mean(wall):.0f}" if stages else "—"])
    first = runs("align")[0]
    print(f"\nThe test: {len(first['correct'])} held-out prompts, seeds {', '.join(seeds)}, threshold 0.9, canvas N = "
          f"{first['canvas']}: right in either form, right with the full stop (mean over seeds; then per seed), "
          "tokens per forward, AR-MAP's γ per seed, seconds per route (process starts included; mean over seeds)\n")
    print(cli.table(["model", "right", "with the full stop", "right, per seed", "with the full stop, per seed",
                     "tok/fwd", "γ", "seconds"], rows))

    def test(label, base, arm, key):
        return [label, key, *paired_row(flags(base, key), flags(arm, key), len(seeds), mcnemar)]
    transfer = test("the transfer: AR-MAP against the start", "align", arms[1][0], "preferred")
    print(f"\nThe transfer, one test: {PRIMARY}; McNemar's exact test over (seed, prompt) pairs beside it\n")
    print(holm_table(["comparison", "outcome", "baseline", "arm", "seeds"], [transfer], "McNemar"))
    bases = [("equal steps", arms[2][0])] + ([("equal time", arms[3][0])] if k != 100 else [])
    tests = [test(f"AR-MAP against DPO on the DLM, {label}", base, arms[1][0], key) for label, base in bases
             for key in ("preferred", "right")]
    print(f"\nAR-MAP against DPO on the DLM: {PRIMARY}, p adjusted by Holm across the {len(tests)}; McNemar's exact "
          "test over (seed, prompt) pairs beside it\n")
    print(holm_table(["comparison", "outcome", "baseline", "arm", "seeds"], tests, "McNemar"))


def nelbo_sweep(*args):
    """The standard library's protocol sweeps: the rate chosen, printed. args: [--extend] P, PREFIX, RATES...: the
    lowest -ELBO of P/eval/PREFIX-RATE.json (eval.py likelihood on the validation split's first half; a tie: the
    lower rate). With --extend: the rate past the choice when it is the sweep's edge, or nothing."""
    extend = args[0] == "--extend"
    P, prefix, rates = Path(args[extend]), args[extend + 1], args[extend + 2:]
    print_choice(extend, rates, chosen_rate({
        r: -json.loads((P / f"eval/{prefix}-{r}.json").read_text())["results"]["nelbo_bits_per_token"] for r in rates}))


def nelbo_tables(P, sweep, rates, steps, arms, comparisons, seeds):
    """The standard library's protocol tables. sweep: [(label, prefix, chosen)]: P/eval/val-PREFIX-RATE.json's -ELBO
    and P/PREFIX-RATE-sSEED0's median step time; arms: [(run, label)], P/eval/RUN-sSEED.json on the other half;
    comparisons: [(label, baseline run, arm run)]: the paired t over the seeds' means, Holm across them, the paired
    t-test over (seed, sequence) beside it."""
    lik = functools.cache(lambda name: json.loads((P / f"eval/{name}.json").read_text())["results"])
    step = functools.cache(lambda run: json.loads((P / f"{run}/results.json").read_text())["step_seconds_median"])
    print(f"The sweep, seed {seeds[0]}, {steps} steps: -ELBO (bits/token) on the validation split's first half, "
          "median seconds per step; * the chosen rate\n")
    def cell(prefix, r, chosen):  # — : a rate this arm's sweep did not run
        if not (P / f"eval/val-{prefix}-{r}.json").exists():
            return "—"
        return (f"{lik(f'val-{prefix}-{r}')['nelbo_bits_per_token']:.3f}, {step(f'{prefix}-{r}-s{seeds[0]}'):.3f} s"
                + " *" * (r == chosen))
    rates = sorted(set(rates), key=float, reverse=True)
    print(cli.table(["arm", *[f"lr {r}" for r in rates]],
                    [[label] + [cell(prefix, r, chosen) for r in rates] for label, prefix, chosen in sweep]))
    first = lik(f"{arms[0][0]}-s{seeds[0]}")
    print(f"\nThe test: -ELBO (bits/token) of {len(first['per_sequence'])} sequences of the validation split's other "
          f"half, {first['n_draws']} draws each; seeds {', '.join(seeds)} (mean; per seed)\n")
    print(cli.table(["run", "-ELBO", "per seed"], [
        [what, f"{statistics.mean(lik(f'{m}-s{s}')['nelbo_bits_per_token'] for s in seeds):.3f}",
         " / ".join(f"{lik(f'{m}-s{s}')['nelbo_bits_per_token']:.3f}" for s in seeds)] for m, what in arms]))
    tests = []
    for label, base, arm in comparisons:
        a, b = ([x for s in seeds for x in lik(f"{m}-s{s}")["per_sequence"]] for m in (base, arm))
        mean_a, mean_b, ahead, p, pooled = paired_row(a, b, len(seeds), paired_t, lower=True)
        tests.append([label, mean_a, mean_b, f"{statistics.mean(y - x for x, y in zip(a, b)):+.3f}", ahead, p, pooled])
    print(f"\nThe tests named in advance: -ELBO (ahead: lower); {PRIMARY}, p adjusted by Holm across the {len(tests)}; "
          "the paired t-test over (seed, sequence) pairs beside it\n")
    print(holm_table(["comparison", "baseline", "arm", "arm - baseline", "seeds"], tests, "paired t"))


def stdlib_align_protocol(*args):
    """repro_align.sh ONLY=protocol. args: P, λ = 0's rate, λ = 10's rate, λ = 0's steps at λ = 10's time, "SWEEP
    RATES", SEEDS..."""
    P, r0, r10, k, rates, seeds = Path(args[0]), args[1], args[2], args[3], args[4].split(), args[5:]
    arms = [(f"lam0-{r0}", f"λ = 0, lr {r0}, 100 steps"), (f"lam10-{r10}", f"λ = 10, lr {r10}, 100 steps"),
            (f"lam0time-{r0}", f"λ = 0, lr {r0}, {k} steps (λ = 10's 100 steps of time)")]
    nelbo_tables(P, [("λ = 0", "lam0", r0), ("λ = 10", "lam10", r10)], rates, 100, arms,
                 [("λ = 10 against λ = 0, equal steps", arms[0][0], arms[1][0]),
                  ("λ = 10 against λ = 0, equal time", arms[2][0], arms[1][0])], seeds)


def nelbo_l2_sweep(*args):
    """repro_align.sh ONLY=protocol: L2's λ and rate, printed "λ rate". args: [--extend] P, "LAMBDAS", "RATES": the
    lowest -ELBO of P/eval/val-l2-λ-RATE.json (at λ = 0 λ = 0's own runs, l2_runs; a tie: the lower λ, then the lower
    rate); --extend: print_choice."""
    extend = args[0] == "--extend"
    P, lambdas, rates = Path(args[extend]), args[extend + 1].split(), args[extend + 2].split()
    print_choice(extend, rates, lambdas=lambdas, chosen=chosen_rate({
        (lam, r): -json.loads((P / f"eval/{l2_runs(lam, 'val-')}-{r}.json").read_text())["results"][
            "nelbo_bits_per_token"]
        for lam in lambdas for r in rates}))


def stdlib_l2_protocol(*args):
    """repro_align.sh ONLY=protocol: cosine (λ = 10) against L2 at its chosen λ and rate. args: P, cosine's rate, L2's
    λ, L2's rate, "L2 LAMBDAS", "SWEEP RATES", SEEDS..."""
    P, r10, l2, rl2, lambdas, rates, seeds = Path(args[0]), *args[1:4], args[4].split(), args[5].split(), args[6:]
    arms = [(f"{l2_runs(l2)}-{rl2}", f"{l2_label(l2)}, lr {rl2}, 100 steps"),
            (f"lam10-{r10}", f"cosine, λ = 10, lr {r10}")]
    sweep = [(l2_label(lam), l2_runs(lam), rl2 if lam == l2 else None) for lam in sorted(lambdas, key=float)]
    nelbo_tables(P, sweep, rates, 100, arms, [("cosine against L2", arms[0][0], arms[1][0])], seeds)


def stdlib_opdlm_protocol(*args):
    """repro_distill.sh PART=protocol. args: P, on's rate, off's rate, off's steps at on's time (= STEPS: the same
    cost, no time arm), STEPS, "SWEEP RATES", SEEDS..."""
    P, ron, roff, k, steps, rates, seeds = Path(args[0]), args[1], args[2], args[3], args[4], args[5].split(), args[6:]
    arms = [(f"off-{roff}", f"off-policy, lr {roff}, {steps} steps"),
            (f"on-{ron}", f"on-policy, lr {ron}, {steps} steps")]
    comparisons = [("on against off, equal steps", arms[0][0], arms[1][0])]
    if k != steps:
        arms.append((f"offtime-{roff}", f"off-policy, lr {roff}, {k} steps (on-policy's {steps} steps of time)"))
        comparisons.append(("on against off, equal time", arms[2][0], arms[1][0]))
    nelbo_tables(P, [("on-policy", "on", ron), ("off-policy", "off", roff)], rates, steps, arms, comparisons, seeds)


def winrate_sweep(*args):
    """repro_dlm_dpo.sh PART=protocol: a route's DPO rate, printed. args: P, the route's index among winrate's --ckpt
    (0 AR-MAP, 1 DLM-only), RATES...: the highest win rate in P/eval/val-RATE.json (a tie: the lower rate). Or
    --extend P RATES...: the rate past a route's choice that is the sweep's edge (AR-MAP's first; both routes run
    each rate), or nothing."""
    if args[0] == "--extend":
        P, rates = Path(args[1]), args[2:]
        win = [json.loads((P / f"eval/val-{r}.json").read_text())["results"]["win_rates"] for r in rates]
        print(past_first_edge(rates, (chosen_rate({r: w[i] for r, w in zip(rates, win)}) for i in (0, 1))))
        return
    P, i, rates = Path(args[0]), int(args[1]), args[2:]
    print(chosen_rate({r: json.loads((P / f"eval/val-{r}.json").read_text())["results"]["win_rates"][i]
                       for r in rates}))


def stdlib_armap_protocol(*args):
    """repro_dlm_dpo.sh PART=protocol: the sweep, the routes on the test prompts and sequences, the transfer's test
    and AR-MAP against DPO on the DLM. args: P, AR-MAP's rate, DLM-only's rate, DLM-only's steps at AR-MAP's time
    (30: no time arm), "SWEEP RATES", SEEDS..."""
    P, ra, rd, k, rates, seeds = Path(args[0]), args[1], args[2], int(args[3]), args[4].split(), args[5:]
    rates = sorted(rates, key=float, reverse=True)
    res = functools.cache(lambda name: json.loads((P / f"eval/{name}.json").read_text())["results"])
    gamma = functools.cache(lambda r, s: json.loads((P / f"ar-map-{r}-s{s}/merge.json").read_text())["best_gamma"])
    sec = stage_seconds(P)
    print(f"The sweep, seed {seeds[0]}, dpo.py's 30 steps: the win rate against the REPR-ALIGN DLM on the first half "
          "of the held-out prompts (32 completions each, 'prefer single quotes'; a tie half); AR-MAP's γ by "
          "merge.py's rule; * the chosen rate\n")
    print(cli.table(["route", *[f"lr {r}" for r in rates]], [
        ["AR-MAP"] + [f"{res(f'val-{r}')['win_rates'][0]:.3f}, γ {gamma(r, seeds[0]):g}" + " *" * (r == ra)
                      for r in rates],
        ["DPO on the DLM"] + [f"{res(f'val-{r}')['win_rates'][1]:.3f}" + " *" * (r == rd) for r in rates]]))
    arms = [(f"ar-map-{ra}", f"AR-MAP, DPO lr {ra}", [f"ar-dpo {ra} {{s}}", f"merge {ra} {{s}}"]),
            (f"dlm-dpo-{rd}", f"DPO on the DLM, lr {rd}, 30 steps", [f"dlm-dpo {rd} {{s}}"])]
    if k != 30:
        arms.append((f"dlm-dpo-time-{rd}", f"DPO on the DLM, lr {rd}, {k} steps (AR-MAP's seconds)",
                     [f"dlm-dpo-time {rd} {{s}}"]))

    def scores(i):  # the arm's rule score per (seed, prompt); -1: the REPR-ALIGN DLM's own completions
        return [x for s in seeds for x in (res(f"test-s{s}")["scores_ref"] if i < 0 else
                                           res(f"test-s{s}")["scores"][i])]

    def nelbo(m):  # each validation sequence's -ELBO (second half), per (seed, sequence)
        return [x for s in seeds for x in res(f"lik-{m}-s{s}")["per_sequence"]]
    def per_seed(values):  # a (seed, item) list -> each seed's mean, " / "-separated
        return " / ".join(f"{m:.3f}" for m in seed_means(values, len(seeds)))
    rows = [["the REPR-ALIGN DLM (the start)", "—", f"{statistics.mean(scores(-1)):.3f}", per_seed(scores(-1)),
             f"{res('lik-align')['nelbo_bits_per_token']:.3f}", "—", "—", "—"]]
    for i, (m, what, stages) in enumerate(arms):
        rows.append([what, " / ".join(f"{res(f'test-s{s}')['win_rates'][i]:.3f}" for s in seeds),
                     f"{statistics.mean(scores(i)):.3f}", per_seed(scores(i)), f"{statistics.mean(nelbo(m)):.3f}",
                     per_seed(nelbo(m)), ", ".join(f"{gamma(ra, s):g}" for s in seeds) if i == 0 else "—",
                     f"{statistics.mean(sum(sec.get(st.format(s=s), 0) for st in stages) for s in seeds):.0f}"])
    print(f"\nThe test, seeds {', '.join(seeds)}: 32 completions of the other half's prompts (win rate against the "
          "DLM's own, per seed; the mean rule score, +1 all single quotes, -1 all double), -ELBO (bits/token) of "
          "the validation split's second half, AR-MAP's γ per seed, seconds per route (mean over seeds)\n")
    print(cli.table(["model", "win rate per seed", "rule score", "per seed", "-ELBO", "per seed", "γ", "seconds"],
                    rows))

    def test(label, a, b, lower=False):  # b (the arm) against a over (seed, item); ahead: higher, or lower -ELBO
        return [label, *paired_row(a, b, len(seeds), paired_t, lower)]
    transfer = test("the transfer: AR-MAP against the start, rule score", scores(-1), scores(0))
    print(f"\nThe transfer, one test: {PRIMARY}; the paired t-test over (seed, prompt) pairs beside it\n")
    print(holm_table(["comparison", "baseline", "arm", "seeds"], [transfer], "paired t"))
    tests = []
    for j, label in [(1, "equal steps")] + ([(2, "equal time")] if k != 30 else []):
        tests.append(test(f"AR-MAP against DPO on the DLM, {label}: rule score", scores(j), scores(0)))
        tests.append(test(f"AR-MAP against DPO on the DLM, {label}: -ELBO", nelbo(arms[j][0]), nelbo(arms[0][0]),
                          lower=True))
    print(f"\nAR-MAP against DPO on the DLM (-ELBO: ahead is lower): the primary test the paired t over the seeds' "
          f"means (the training run as the unit), p adjusted by Holm across the {len(tests)}; beside it the paired "
          "t-test over (seed, prompt) pairs for the rule score and (seed, sequence) pairs for the -ELBO\n")
    print(holm_table(["comparison", "baseline", "arm", "seeds"], tests, "paired t"))


COMMANDS = (time_steps, val_sweep, align_protocol, l2_sweep, l2_protocol, opdlm_protocol, mark_sweep, dlm_dpo_steps,
            mark_protocol, nelbo_sweep, stdlib_align_protocol, nelbo_l2_sweep, stdlib_l2_protocol,
            stdlib_opdlm_protocol, winrate_sweep, stdlib_armap_protocol)  # scripts/report.py's commands
