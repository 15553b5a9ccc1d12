"""
The statistics of the reproduction scripts' tables, in plain Python (no numpy, no scipy): Student's t distribution
(through the regularized incomplete beta function), McNemar's exact test, the paired t-test, Holm's correction, the
sweeps' rate rule and the seeds' ahead/tied count. scripts/report.py and scripts/protocol.py print them;
tests/test_report.py checks them against scipy.stats' values, fixed as constants, and by-hand computations.
"""
import math
import statistics


def t_two_sided(t, df):
    """P(|T| >= |t|) for Student's t with df > 0 degrees of freedom: the regularized incomplete beta function
    I_x(df/2, 1/2) at x = df / (df + t²), to about 1e-12 relative (tested against scipy's constants), down to
    the smallest positive float (below it: 0.0, a true bound of a smaller p)."""
    if not df > 0:
        raise ValueError(f"t_two_sided: df must be positive, got {df}")
    t2 = float(t) * float(t)
    if math.isinf(t2):
        return 0.0
    return betainc(df / 2, 0.5, df / (df + t2), t2 / (df + t2))


def betainc(a, b, x, y=None):
    """The regularized incomplete beta function I_x(a, b) = B(x; a, b) / B(a, b), y = 1 - x (pass it when it is
    known more exactly than 1 - x): the continued fraction of Numerical Recipes §6.4 (modified Lentz), on the
    side of (a+1)/(a+b+2) where it converges fast, its prefactor x^a y^b / (a B(a, b)) taken in logs so that
    neither a large a + b nor a tiny result overflows."""
    y = 1.0 - x if y is None else y
    if x <= 0.0 or y <= 0.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1) / (a + b + 2):  # I_x(a, b) = 1 - I_y(b, a)
        return 1.0 - betainc(b, a, y, x)
    log_front = a * math.log(x) + b * math.log(y) + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    return math.exp(log_front - math.log(a) + math.log(_beta_fraction(a, b, x)))


def _beta_fraction(a, b, x, tiny=1e-300, tol=1e-15, max_terms=100_000):
    """The continued fraction 1 / (1 + d1 / (1 + d2 / (1 + ...))) of I_x(a, b), d_{2m+1} = -(a+m)(a+b+m) x /
    ((a+2m)(a+2m+1)), d_{2m} = m (b-m) x / ((a+2m-1)(a+2m)), by the modified Lentz method."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, max_terms):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < tol:
            return h
    raise ArithmeticError(f"betainc: the continued fraction did not converge (a={a}, b={b}, x={x})")


def mcnemar(a, b):
    """Two-sided exact McNemar p of paired booleans a, b (lists; 0/1 numbers too): the binomial test on the
    discordant pairs."""
    n01 = sum(bool(x) and not y for x, y in zip(a, b))
    n10 = sum(bool(y) and not x for x, y in zip(a, b))
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


def next_rate(rate, up):
    """The neighbour of a rate on the sweeps' half-decade grid (..., 1e-4, 3e-4, 1e-3, ...), as text: 1e-4 -> 3e-5
    down, 3e-4 up; 3e-5 -> 1e-5 down, 1e-4 up."""
    m, e = (int(x) for x in f"{float(rate):.0e}".split("e"))
    if m not in (1, 3):
        raise ValueError(f"{rate}: not on the half-decade grid (1 or 3 times a power of ten)")
    m, e = ((3, e) if m == 1 else (1, e + 1)) if up else ((1, e) if m == 3 else (3, e - 1))
    return f"{m}e{e}"


def beyond_edge(rates, chosen):
    """A sweep that chose its edge goes on: the rate past the chosen one (the lowest: one step down the grid; the
    highest: one step up; a sweep off the half-decade grid, such as 6e-4, 2e-4, 6e-5: its own last step again), or
    None when the choice is inside the sweep."""
    xs = sorted(rates, key=float)
    if len(xs) < 2 or chosen not in (xs[0], xs[-1]):
        return None
    inner, up = (xs[1], False) if chosen == xs[0] else (xs[-2], True)
    m = int(f"{float(chosen):.0e}"[0])
    for f in (1, m, m / 3):  # the grid scaled by f (6e-4, 2e-4, 6e-5: f = 2), where both edge and neighbour lie on it
        try:
            next_rate(float(inner) / f, up)
            return f"{float(next_rate(float(chosen) / f, up)) * f:.0e}".replace("e-0", "e-")
        except ValueError:
            continue
    return f"{float(chosen) ** 2 / float(inner):.0e}".replace("e-0", "e-")  # no such grid: the sweep's last ratio


def equal_time_steps(steps, costly, cheap):
    """The protocol's equal-time arm: the cheaper arm's steps in the time the costlier one takes for `steps`
    (costly, cheap: seconds per step, or per run), or `steps` when it is not more than 5% slower (no time arm)."""
    return round(steps * costly / cheap) if costly > 1.05 * cheap else steps
