"""
The end-of-sequence trap measured: every DLM of a task-world run decodes the same held-out prompts under each
end-token rule (free, last, penalty 1 and 3), at thresholds 0.5 / 0.7 / 0.9 / 1.0, with a semi-AR block of the whole
canvas and of 4 (masked diffusion; a block DLM keeps its own block), on canvases of 6 and 16 slots; the AR teacher
decodes the same prompts once. Each rule is paired per prompt against free in the same setting.

    python -m scripts.eos_grid --run out/tasks --data data/tasks --models align0 align distill distill-off
    python -m scripts.eos_grid --world real --run out/real --models align distill   # bash run.sh real's DLMs

The real world (SmolLM2-135M-Instruct, run.sh real): its held-out prompts judged by realworld.check, at the run's
canvas of 16 and at 32 (its answers need more than 6 slots), with the run's KV cache (dual: approximate); the
teacher's figure is its greedy replies' accuracy from RUN/eval/ar.json.

The tests, named before the runs: exact match, McNemar's exact test (two-sided binomial on the prompts where the two
disagree); answer tokens per forward (each prompt's tokens up to and including its end token over the forwards it
needed), the paired t-test over prompts; Holm's correction across the six tests of a row (three rules x two
metrics). Writes OUT/eos_grid.json (every row, every prompt's outcome) and prints the tables (markdown).
"""
import json
import sys
import time
from pathlib import Path

from lib import cli
from worlds import realworld
from scripts.stats import holm, mcnemar, paired_t

RULES = [("free", 0.0), ("last", 0.0), ("penalty", 1.0), ("penalty", 3.0)]
THRESHOLDS = (0.5, 0.7, 0.9, 1.0)
CANVASES = (6, 16)


def name(rule):
    return rule[0] if rule[0] != "penalty" else f"penalty {rule[1]:g}"


def summary(rows):
    n = len(rows)
    return dict(accuracy=sum(r["correct"] for r in rows) / n,
                tokens_per_forward=sum(r["tokens"] / r["forwards"] for r in rows) / n,
                forwards_answer=sum(r["forwards_answer"] for r in rows) / n,
                forwards_after=sum(r["forwards_after"] for r in rows) / n,
                rows_after=sum(r["forwards_after"] > 0 for r in rows) / n)


def grid(run_dir, data_dir, models, per_family, batch_size, canvases=CANVASES):
    from worlds import tasks
    from lib import training
    from model import Qwen3
    out = {"teacher": None, "rows": []}
    teacher = Qwen3.from_pretrained(Path(run_dir) / "ar").eval()
    tok = training.load_tokenizer(Path(run_dir) / "ar", teacher.config)
    items = tasks.heldout_items(data_dir, teacher.config, run_dir, "eos_grid", per_family)
    res = tasks.exact_match(teacher, tok, items, batch_size=batch_size)
    out["teacher"] = dict(accuracy=res["accuracy"], correct=[r["correct"] for r in res["rows"]])
    for m in models:
        model = Qwen3.from_pretrained(Path(run_dir) / m).eval()
        blocks = [None, 4] if model.config.attn == "bidirectional" else [model.config.block_size]
        for N in canvases:
            for block in blocks:
                for thr in THRESHOLDS:
                    t0, per_rule = time.perf_counter(), {}
                    for rule in RULES:
                        r = tasks.exact_match(model, tok, items, batch_size=batch_size, max_new_tokens=N,
                                              threshold=thr, eos_rule=rule[0], eos_penalty=rule[1],
                                              block_length=block if model.config.attn == "bidirectional" else None)
                        per_rule[name(rule)] = [{k: row[k] for k in ("correct", "tokens", "forwards", "forwards_answer",
                                                                    "forwards_after")} for row in r["rows"]]
                    canvas = r["canvas"]
                    out["rows"].append(dict(model=m, attn=model.config.attn, canvas=canvas,
                                            block=block or canvas, threshold=thr, rules=per_rule))
                    print(f"eos_grid: {m} N={canvas} block={block or canvas} threshold={thr}: "
                          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return out


def grid_real(run_dir, models, families, per_family, canvases, cache="dual"):
    """grid() for run.sh real: its held-out prompts (realworld.build, the run's seed) and checker."""
    from lib import training
    from model import Qwen3
    teacher = json.loads((Path(run_dir) / "eval" / "ar.json").read_text())
    right = [r["right"] for r in next(iter(teacher["runs"].values()))["rows"]]
    items = realworld.build(n_heldout=per_family, families=families)[1]
    if len(items) != len(right):
        raise SystemExit(f"eos_grid: {run_dir}/eval/ar.json answered {len(right)} prompts, not these {len(items)}: "
                         "give the run's --families and --num_prompts")
    out = {"teacher": dict(accuracy=sum(right) / len(right), correct=right), "rows": []}
    for m in models:
        model = Qwen3.from_pretrained(Path(run_dir) / m).eval()
        tok = training.load_tokenizer(Path(run_dir) / m, model.config)
        blocks = [None, 4] if model.config.attn == "bidirectional" else [model.config.block_size]
        for N in canvases:
            for block in blocks:
                t0, per_thr = time.perf_counter(), {thr: {} for thr in THRESHOLDS}
                for rule in RULES:
                    blocked = dict(block_length=block) if block and model.config.attn == "bidirectional" else {}
                    runs = realworld.evaluate(model, tok, items, thresholds=THRESHOLDS, max_new_tokens=N, cache=cache,
                                              eos_rule=rule[0], eos_penalty=rule[1], **blocked)
                    for thr in THRESHOLDS:  # a row's answer tokens (up to and including its end token) and forwards
                        per_thr[thr][name(rule)] = [
                            dict(correct=r["right"], forwards=r["forwards_answer"] + r["forwards_after"],
                                 tokens=round(r["tokens_per_forward"] * (r["forwards_answer"] + r["forwards_after"])),
                                 forwards_answer=r["forwards_answer"], forwards_after=r["forwards_after"])
                            for r in runs[f"{thr:g}"]["rows"]]
                for thr in THRESHOLDS:
                    out["rows"].append(dict(model=m, attn=model.config.attn, canvas=N, block=block or N,
                                            threshold=thr, rules=per_thr[thr]))
                print(f"eos_grid: {m} N={N} block={block or N}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return out


def tables(out):
    """The markdown tables: per row (model, N, block, threshold) each rule's exact match and answer tokens per
    forward, with the forwards split (answer + after), and the Holm-adjusted p of each rule against free; then
    per model the rule and threshold with the most answer tokens per forward within 2 points of the AR teacher."""
    ar = out["teacher"]["accuracy"]
    print(f"AR teacher, greedy, the same {len(out['teacher']['correct'])} held-out prompts: exact match {ar:.3f}\n")
    head = ["model", "N", "block", "threshold"] + [name(r) for r in RULES]
    lines, best, own, top = [], {}, {}, {}
    for row in out["rows"]:  # each model's best exact match on each canvas, over every rule and setting
        key = (row["model"], row["canvas"])
        top[key] = max([top.get(key, 0.0)] + [summary(rs)["accuracy"] for rs in row["rules"].values()])
    for row in out["rows"]:
        free = row["rules"]["free"]
        ps = []
        for r in RULES[1:]:
            rows = row["rules"][name(r)]
            ps += [mcnemar([x["correct"] for x in free], [x["correct"] for x in rows]),
                   paired_t([x["tokens"] / x["forwards"] for x in free], [x["tokens"] / x["forwards"] for x in rows])]
        adj = holm(ps)
        cells = []
        for i, r in enumerate(RULES):
            s = summary(row["rules"][name(r)])
            cell = (f"{s['accuracy']:.3f} / {s['tokens_per_forward']:.2f} "
                    f"({s['forwards_answer']:.2f} + {s['forwards_after']:.2f})")
            if i:
                cell += f" p {adj[2 * i - 2]:.2g} / {adj[2 * i - 1]:.2g}"
            cells.append(cell)
            key = (row["model"], row["canvas"])
            cand = (s["tokens_per_forward"], name(r), row["threshold"], row["block"], s["accuracy"])
            if s["accuracy"] >= ar - 0.02:
                best[key] = max(best.get(key, cand), cand)
            if s["accuracy"] >= top[key] - 0.02:
                own[key] = max(own.get(key, cand), cand)
        lines.append([row["model"], row["canvas"], row["block"], f"{row['threshold']:g}"] + cells)
    print("Each cell: exact match / answer tokens per forward (forwards a row: answer + after the answer); against "
          "free, the Holm-adjusted p of McNemar's test on exact match / of the paired t-test on tokens per forward\n")
    print(cli.table(head, lines))
    head = ["model", "N", "rule", "threshold", "block", "exact match", "answer tokens per forward"]
    print(f"\nWithin 2 points of the AR teacher's exact match ({ar:.3f}): the most answer tokens per forward\n")
    print(cli.table(head, [[m, n, c[1], f"{c[2]:g}", c[3], f"{c[4]:.3f}", f"{c[0]:.2f}"] if c else
                           [m, n, "none within 2 points", "", "", f"best {top[m, n]:.3f}", ""]
                           for (m, n), c in ((k, best.get(k)) for k in sorted(top))]))
    print("\nWithin 2 points of the DLM's own best exact match on that canvas (any rule, threshold, block): the most "
          "answer tokens per forward\n")
    print(cli.table(head, [[m, n, c[1], f"{c[2]:g}", c[3], f"{c[4]:.3f} (best {top[m, n]:.3f})", f"{c[0]:.2f}"]
                           for (m, n), c in sorted(own.items())]))


def main():
    p = cli.parser(__doc__)
    p.add_argument("--world", default="tasks", choices=("tasks", "real"), help="the task world (run.sh) or the real "
                   "model (run.sh real)")
    p.add_argument("--run", default=None, help="run.sh's output (ar/ and the DLMs; default out/tasks, out/real)")
    p.add_argument("--data", default="data/tasks", help="the task world: worlds/tasks.py's output (heldout.jsonl)")
    p.add_argument("--models", nargs="+", default=None, help="default: align0 align distill distill-off (tasks), "
                   "align distill (real)")
    p.add_argument("--num_prompts", type=int, default=None, help="held-out prompts per family (default: 100 (tasks), "
                   "20, run.sh real's (real))")
    p.add_argument("--families", type=cli.comma_list(choices=realworld.FAMILIES, what="families"),
                   default=["sum", "capital"], help="the real world: run.sh real's families")
    p.add_argument("--canvases", type=cli.comma_list(int, what="canvases"), default=None,
                   help="canvas sizes N (default: 6,16 (tasks), 16,32 (real))")
    p.add_argument("--batch_size", type=int, default=100)
    p.add_argument("--out", default=None, help="default: RUN/eos_grid.json")
    p.add_argument("--report", action="store_true", help="only print the tables of an existing --out")
    args = p.parse_args()
    real = args.world == "real"
    run = args.run or f"out/{args.world}"
    path = Path(args.out or Path(run) / "eos_grid.json")
    if not args.report:
        out = grid_real(run, args.models or ["align", "distill"], args.families, args.num_prompts or 20,
                        args.canvases or (16, 32)) if real else \
            grid(run, args.data, args.models or ["align0", "align", "distill", "distill-off"],
                 args.num_prompts or 100, args.batch_size, args.canvases or CANVASES)
        path.write_text(json.dumps(out))
    tables(json.loads(path.read_text()))


if __name__ == "__main__":
    main()
