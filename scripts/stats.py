"""
The statistics of the reproduction scripts' tables, in plain Python (no numpy, no scipy): Student's t
distribution, McNemar's exact test, the paired t-test, Holm's correction, the sweeps' rate rule and the seeds'
ahead/tied count. scripts/report.py and scripts/protocol.py print them; tests/test_report.py checks them against
the tables' critical values and by-hand computations.
"""
import math
import statistics


def t_two_sided(t, df):
    """P(|T| >= t) for Student's t with df degrees of freedom: 1 - 2 ∫_0^t f, Simpson's rule on the density
    f(x) = Γ((df+1)/2) / (√(df π) Γ(df/2)) · (1 + x²/df)^(-(df+1)/2)."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    def f(x):
        return c * (1 + x * x / df) ** (-(df + 1) / 2)
    n, h = 2000, abs(t) / 2000
    area = h / 3 * (f(0) + f(abs(t)) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, n)))
    return max(0.0, 1 - 2 * area)


def mcnemar(a, b):
    """Two-sided exact McNemar p of paired booleans a, b (lists): the binomial test on the discordant pairs."""
    n01 = sum(x and not y for x, y in zip(a, b))
    n10 = sum(y and not x for x, y in zip(a, b))
    n, k = n01 + n10, min(n01, n10)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def paired_t(a, b):
    """Two-sided p of the paired t-test of b - a (lists of numbers); 1 when every difference is 0."""
    d = [y - x for x, y in zip(a, b)]
    n, m = len(d), sum(d) / len(d)
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    if sd == 0:
        return 1.0 if m == 0 else 0.0
    return t_two_sided(m / (sd / math.sqrt(n)), n - 1)


def holm(ps):
    """Holm-adjusted p-values, in the order given."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, run = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        run = max(run, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = run
    return out


def paired(a, b):
    """b against a, seed by seed (the same seeds in the same order) -> "mean ± sd of b - a, t, p (two-sided, paired
    t-test), ahead in k/n" (ahead: b > a)."""
    d = [y - x for x, y in zip(a, b, strict=True)]
    n, m = len(d), statistics.mean(d)
    if n < 2:
        return f"{m:+.3f} (one seed: no test)"
    sd = statistics.stdev(d)
    if sd == 0:
        t, p = (0.0, 1.0) if m == 0 else (math.copysign(math.inf, m), 0.0)
    else:
        t = m / (sd / math.sqrt(n))
        p = t_two_sided(t, n - 1)
    return f"{m:+.3f} ± {sd:.3f}, t = {t:.2f}, p = {p:.3f}, ahead in {sum(x > 0 for x in d)}/{n}"


def seeds_ahead(diffs):
    """Per-seed differences (arm − baseline) -> "k ahead, t tied of n": a tie is counted as a tie, never a win."""
    return f"{sum(d > 0 for d in diffs)} ahead, {sum(d == 0 for d in diffs)} tied of {len(diffs)}"


def chosen_rate(acc):
    """{rate (text), or a tuple of settings such as (λ, rate): validation score} -> the sweeps' rule: the highest
    score, a tie going to the lower rate (for a tuple: the lower first setting, then the next)."""
    return max(acc, key=lambda k: (acc[k], *(-float(x) for x in (k if isinstance(k, tuple) else (k,)))))


def equal_time_steps(steps, costly, cheap):
    """The protocol's equal-time arm: the cheaper arm's steps in the time the costlier one takes for `steps`
    (costly, cheap: seconds per step, or per run), or `steps` when it is not more than 5% slower (no time arm)."""
    return round(steps * costly / cheap) if costly > 1.05 * cheap else steps
