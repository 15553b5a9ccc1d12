"""
The README's claims table, written from docs/claims/*.json by one rule. One file per row (in file-name order); per
world ("tasks", "stdlib", "real") a cell is either fixed text (a cell that compares no two arms: "text" and its
"reason") or the numbers its verdict rests on, each copied as printed from the docs/results.md section its "source"
names (checked against that section on every run). The primary test is the paired t-test over the training seeds'
means (stats.paired_t), Holm across the cell's tests; the pooled per-prompt test (results.md's Holm p) goes beside it.
verdict() turns either set of tests into the cell's words.

    python -m scripts.report claims           # print the table (paste it into README.md)
    python -m scripts.report claims --check   # exit 1 when README.md's table differs

A computed cell: "arms" {"A", "B"} (B: the paper's side), "metric", "better" ("higher" or "lower"), "seeds_run",
"source" {"section", "command"}, "not_per_seed" (why a test has no per-seed numbers), optional "pooled_over", "aside"
(a few words printed last) and "note" (not printed); "tests", each a "setting" (what a verdict names), its own
"metric", "better" or "source" where they differ, "per_seed" {"seeds", "A", "B" (" / "-separated as printed, or a
list), optional "source"}, "pooled" {"test", "A", "B", "p_holm"}.
"""
import json
import re
import sys
from pathlib import Path

from lib import cli
from scripts.stats import holm, paired_t

ROOT = Path(__file__).resolve().parents[1]
WORLDS = {"tasks": "exact-answer world", "stdlib": "standard library", "real": "SmolLM2-135M"}
SECTION = "## The papers' claims, measured here"
ALPHA = 0.05
MIN_SEEDS = 5  # the protocol's: fewer seeds give a word, marked tentative
CELL_KEYS = {"arms", "metric", "better", "seeds_run", "source", "not_per_seed", "pooled_over", "aside", "note", "tests"}
TEST_KEYS = {"setting", "metric", "better", "source", "not_per_seed", "per_seed", "pooled"}


def verdict(tests, seeds_run=2, alpha=ALPHA):
    """The one rule. tests: (setting, sign, p) each: sign +1 where the paper's arm is ahead, -1 behind, 0 equal; p
    Holm-adjusted across the cell, None where not tested. A setting is ahead (behind) where one of its tests is
    significant (p < alpha) that way and none the other way, level where tested and none is significant. Every
    setting ahead: reproduced; every one behind: contradicted (the settings tested all so, the others not tested:
    "... where tested"); every tested one level: not significant; else mixed, naming the settings each way. None
    tested: "one seed: not tested" (one seed ran) or "not tested per seed"."""
    seen = {}
    for setting, sign, p in tests:
        seen.setdefault(setting, set())
        if p is not None:
            seen[setting] |= {0} | ({sign} if p < alpha and sign else set())
    state = {s: ("untested" if not o else "split" if {1, -1} <= o else "ahead" if 1 in o else "behind" if -1 in o
                 else "level") for s, o in seen.items()}
    tested = [s for s, k in state.items() if k != "untested"]
    kinds = {state[s] for s in tested}
    if not tested:
        return "one seed: not tested" if seeds_run < 2 else "not tested per seed"
    if kinds == {"level"}:
        return "not significant"
    if kinds in ({"ahead"}, {"behind"}):
        word = "reproduced" if kinds == {"ahead"} else "contradicted"
        return word if len(tested) == len(state) else f"{word} where tested"
    return "mixed (" + "; ".join(f"{k} at {', '.join(s for s in tested if state[s] == k)}"
                                 for k in ("ahead", "behind", "split", "level") if k in kinds) + ")"


def _rel(path):
    path = Path(path).resolve()
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def _refuse(path, what):
    raise SystemExit(f"claims: {_rel(path)}: {what}")


def _values(path, where, v):
    """A per-seed list, as printed ("0.5 / 0.4") or as a list of printed numbers -> (strings, floats)."""
    strings = v.split(" / ") if isinstance(v, str) else v
    try:
        return list(v if isinstance(v, list) else [v]), [float(s) for s in strings]
    except (TypeError, ValueError):
        _refuse(path, f"{where}: not numbers: {v!r}")


def _p(path, where, s):
    """A p as results.md prints it ("0.00309", "< 1e-300") -> float."""
    try:
        p = float(str(s).lstrip("< "))
    except ValueError:
        _refuse(path, f"{where}: p_holm {s!r} is not a number")
    if not 0 <= p <= 1:
        _refuse(path, f"{where}: p_holm {s!r} is not in [0, 1]")
    return p


def _source(path, where, src, command=True):
    if not (isinstance(src, dict) and isinstance(src.get("section"), str)
            and (not command or isinstance(src.get("command"), str))):
        wants = '"section": results.md\'s heading' + (', "command": the command that printed it' if command else "")
        _refuse(path, f"{where}: needs a source {{{wants}}}")
    return src


def load_cell(path, world, c):
    """One cell, checked -> fixed text, or the cell with every test's inherited fields filled and numbers parsed."""
    where = world
    if not isinstance(c, dict):
        _refuse(path, f"{where}: a cell is an object")
    if "text" in c:
        if set(c) - {"text", "reason", "source"} or not isinstance(c.get("reason"), str):
            _refuse(path, f"{where}: a fixed cell has a text, a reason and optionally a source, nothing else")
        if "|" in c["text"] or "\n" in c["text"]:
            _refuse(path, f"{where}: its text holds '|' or a line break")
        if "source" in c:
            _source(path, where, c["source"], command=False)
        return dict(c, fixed=True)
    if set(c) - CELL_KEYS:
        _refuse(path, f"{where}: unknown keys {sorted(set(c) - CELL_KEYS)} (known: {sorted(CELL_KEYS)})")
    arms = c.get("arms")
    if not (isinstance(arms, dict) and set(arms) == {"A", "B"}):
        _refuse(path, f"{where}: needs arms {{\"A\": the baseline, \"B\": the paper's side}}")
    if not (isinstance(c.get("seeds_run"), int) and c["seeds_run"] >= 1):
        _refuse(path, f"{where}: needs seeds_run, the number of training seeds (>= 1)")
    if not (isinstance(c.get("tests"), list) and c["tests"]):
        _refuse(path, f"{where}: needs a non-empty list of tests")
    tests = []
    for k, t in enumerate(c["tests"]):
        w = f"{where} test {k + 1}"
        if not isinstance(t, dict) or set(t) - TEST_KEYS:
            _refuse(path, f"{w}: a test is an object with keys from {sorted(TEST_KEYS)}")
        t = {**{x: c[x] for x in ("metric", "better", "source", "not_per_seed") if x in c}, **t}
        if not isinstance(t.get("setting"), str):
            _refuse(path, f"{w}: needs a setting (\"\" for the cell's only one)")
        if not isinstance(t.get("metric"), str) or t.get("better") not in ("higher", "lower"):
            _refuse(path, f"{w}: needs a metric and better: \"higher\" or \"lower\"")
        _source(path, w, t.get("source"))
        pooled = t.get("pooled")
        if not (isinstance(pooled, dict) and set(pooled) == {"test", "A", "B", "p_holm"}):
            _refuse(path, f"{w}: needs pooled {{\"test\", \"A\", \"B\", \"p_holm\"}}: results.md's pooled test")
        pooled = dict(pooled, a=_values(path, w, pooled["A"])[1][0], b=_values(path, w, pooled["B"])[1][0],
                      p=_p(path, w, pooled["p_holm"]))
        per = t.get("per_seed")
        if per is not None:
            if not (isinstance(per, dict) and {"seeds", "A", "B"} <= set(per) <= {"seeds", "A", "B", "source"}
                    and isinstance(per["seeds"], list)):
                _refuse(path, f"{w}: per_seed is {{\"seeds\": [...], \"A\", \"B\", optional \"source\"}}")
            (sa, a), (sb, b) = _values(path, w, per["A"]), _values(path, w, per["B"])
            if not len(a) == len(b) == len(per["seeds"]) <= c["seeds_run"]:
                _refuse(path, f"{w}: per_seed has {len(per['seeds'])} seeds, {len(a)} A and {len(b)} B values "
                              f"(seeds_run {c['seeds_run']})")
            per = dict(per, a=a, b=b, strings=sa + sb, source=_source(path, w, per.get("source", t["source"])))
        if (per is None or len(per["a"]) < 2) and not isinstance(t.get("not_per_seed"), str):
            _refuse(path, f"{w}: fewer than 2 seeds' numbers: say why in not_per_seed")
        tests.append(dict(t, pooled=pooled, per_seed=per))
    return dict(c, fixed=False, tests=tests)


def load(folder=ROOT / "docs/claims"):
    """Every docs/claims/*.json, in file-name order, checked: a bad file is refused in one line naming it."""
    files = sorted(Path(folder).glob("*.json"))
    if not files:
        raise SystemExit(f"claims: no JSON files in {folder}")
    rows = []
    for path in files:
        try:
            obj = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            _refuse(path, f"not JSON ({e})")
        if not (isinstance(obj, dict) and isinstance(obj.get("claim"), str) and isinstance(obj.get("cells"), dict)
                and set(obj) <= {"claim", "cells"}):
            _refuse(path, "needs {\"claim\": the README's words, \"cells\": {world: cell}} and nothing else")
        if set(obj["cells"]) != set(WORLDS):
            _refuse(path, f"cells must be exactly {', '.join(WORLDS)}; got {', '.join(obj['cells'])}")
        rows.append(dict(claim=obj["claim"], path=path,
                         cells={w: load_cell(path, w, obj["cells"][w]) for w in WORLDS}))
    return rows


def section(results, heading):
    """The text of results.md's section with this heading (any level), up to the next heading; None if absent."""
    out, inside, found, fence = [], False, False, False
    for line in results.splitlines():
        fence ^= line.startswith("```")
        if not fence and re.match(r"#{1,6} ", line):
            if inside:
                break
            inside = found = line.split(" ", 1)[1].strip() == heading
        elif inside:
            out.append(line)
    return " ".join(" ".join(out).split()) if found else None


def verify(rows, results):
    """Each source's section is a heading of results.md holding its command and every number taken from it."""
    flat = " ".join(results.split())
    def check(path, where, src, strings):
        text = section(results, src["section"])
        if text is None:
            _refuse(path, f"{where}: docs/results.md has no section {src['section']!r}")
        if "command" in src and " ".join(src["command"].split()) not in flat:
            _refuse(path, f"{where}: docs/results.md does not hold the command {src['command']!r}")
        for s in strings:
            if str(s) not in text:
                _refuse(path, f"{where}: {s!r} is not in results.md's section {src['section']!r}")
    for row in rows:
        for w, c in row["cells"].items():
            if c["fixed"]:
                if "source" in c:
                    check(row["path"], w, c["source"], [])
                continue
            for k, t in enumerate(c["tests"]):
                p = t["pooled"]
                check(row["path"], f"{w} test {k + 1}", t["source"], [p["A"], p["B"], p["p_holm"]])
                if t["per_seed"]:
                    check(row["path"], f"{w} test {k + 1}", t["per_seed"]["source"], t["per_seed"]["strings"])


def _sign(t, a, b):
    d = (b - a) if t["better"] == "higher" else (a - b)
    return (d > 0) - (d < 0)


def cell_text(c):
    """A computed cell: the per-seed verdict (tentative on fewer than MIN_SEEDS seeds) and its figures, then the
    pooled test's verdict by the same rule."""
    tests = c["tests"]
    label = {id(t): t["setting"] + (f" ({t['metric']})" if len({x["metric"] for x in tests}) > 1 else "")
             for t in tests}
    tested = [t for t in tests if t["per_seed"] and len(t["per_seed"]["a"]) >= 2]
    ps = dict(zip(map(id, tested), holm([paired_t(t["per_seed"]["a"], t["per_seed"]["b"]) for t in tested])))
    word = verdict([(t["setting"], _sign(t, sum(t["per_seed"]["a"]), sum(t["per_seed"]["b"])) if id(t) in ps else 0,
                     ps.get(id(t))) for t in tests], c["seeds_run"])
    if word.startswith(("reproduced", "contradicted")) and c["seeds_run"] < MIN_SEEDS:
        word += f", tentatively ({c['seeds_run']} seeds; a verdict needs {MIN_SEEDS})"
    figures = []
    for k, t in enumerate(tested):
        signs = [_sign(t, a, b) for a, b in zip(t["per_seed"]["a"], t["per_seed"]["b"])]
        tied = f", {signs.count(0)} tied" if 0 in signs else ""
        at = f" at {label[id(t)]}" if label[id(t)] else ""
        figures.append(f"{'' if k else c['arms']['B'] + ' ahead '}in {signs.count(1)}/{len(signs)} seeds{tied}{at}, "
                       f"p = {ps[id(t)]:.2g}")
    untested = [label[id(t)] for t in tests if id(t) not in ps]
    if untested and tested:
        figures.append(", ".join(dict.fromkeys(untested)) + " untested")
    pooled = verdict([(t["setting"], _sign(t, t["pooled"]["a"], t["pooled"]["b"]), t["pooled"]["p"]) for t in tests])
    over = f" ({c['pooled_over']})" if c.get("pooled_over") else ""
    aside = f"; {c['aside']}" if c.get("aside") else ""
    figures = f" ({'; '.join(figures)})" if tested else ""
    return f"{word}{figures}; pooled per prompt{over}: {pooled}{aside}"


def table(rows):
    """The README's claims table, as markdown."""
    return cli.table(["claim", *WORLDS.values()],
                     [[row["claim"], *(c["text"] if c["fixed"] else cell_text(c) for c in row["cells"].values())]
                      for row in rows])


def readme_table(text):
    """The table lines of README.md's claims section (None when the section is missing)."""
    if SECTION not in text:
        return None
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return [line for line in body.splitlines() if line.startswith("|")]


def check(readme, printed):
    """SystemExit (one line) unless README.md's claims table is the printed one, naming the first row that differs."""
    have, readme = readme_table(Path(readme).read_text()), _rel(readme)
    if have is None:
        raise SystemExit(f"claims --check: {readme} has no section {SECTION!r}")
    want = printed.splitlines()
    for k in range(max(len(have), len(want))):
        h, w = (have[k] if k < len(have) else None), (want[k] if k < len(want) else None)
        if h != w:
            name = (w or h).split("|")[1].strip()
            raise SystemExit(f"claims --check: {readme}'s claims table differs from docs/claims/ at line {k + 1} "
                             f"({name!r}{', missing' if h is None else ', extra' if w is None else ''}): run "
                             f"`python -m scripts.report claims` and paste its table")


def claims(*args):
    """The README's claims table from docs/claims/*.json. args: [--check] [--readme PATH] [--dir FOLDER]."""
    args, opts = list(args), {"--readme": ROOT / "README.md", "--dir": ROOT / "docs/claims"}
    do_check = "--check" in args
    args = [a for a in args if a != "--check"]
    while args:
        if args[0] not in opts or len(args) < 2:
            raise SystemExit("usage: python -m scripts.report claims [--check] [--readme PATH] [--dir FOLDER]")
        opts[args[0]] = Path(args[1])
        args = args[2:]
    rows = load(opts["--dir"])
    verify(rows, (ROOT / "docs/results.md").read_text())
    printed = table(rows)
    if do_check:
        check(opts["--readme"], printed)
        print(f"claims --check: {_rel(opts['--readme'])}'s claims table is the one docs/claims/ gives", file=sys.stderr)
    else:
        print(printed)


COMMANDS = (claims,)
