"""
The end-of-sequence trap measured: every DLM of a task-world run decodes the same held-out prompts under each
end-token rule (free, last, penalty 1 and 3), at thresholds 0.5 / 0.7 / 0.9 / 1.0, with a semi-AR block of the whole
canvas and of 4 (masked diffusion; a block DLM keeps its own block), on canvases of 6 and 16 slots; the AR teacher
decodes the same prompts once. Each rule is paired per prompt against free in the same setting.

    python scripts/eos_grid.py --run out/tasks --data data/tasks --models align0 align distill distill-off

The tests, named before the runs: exact match, McNemar's exact test (two-sided binomial on the prompts where the two
disagree); answer tokens per forward (each prompt's tokens up to and including its end token over the forwards it
needed), the paired t-test over prompts; Holm's correction across the six tests of a row (three rules x two
metrics). Writes OUT/eos_grid.json (every row, every prompt's outcome) and prints the tables (markdown).
"""
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's modules
import cli  # noqa: E402
from scripts.report import holm, mcnemar, paired_t  # noqa: E402

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


def grid(run_dir, data_dir, models, per_family, batch_size):
    import tasks
    import training
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
        for N in CANVASES:
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
    p.add_argument("--run", default="out/tasks", help="run.sh's task-world output (ar/ and the DLMs)")
    p.add_argument("--data", default="data/tasks", help="tasks.py's output (heldout.jsonl)")
    p.add_argument("--models", nargs="+", default=["align0", "align", "distill", "distill-off"])
    p.add_argument("--num_prompts", type=int, default=100, help="held-out prompts per family")
    p.add_argument("--batch_size", type=int, default=100)
    p.add_argument("--out", default=None, help="default: RUN/eos_grid.json")
    p.add_argument("--report", action="store_true", help="only print the tables of an existing --out")
    args = p.parse_args()
    path = Path(args.out or Path(args.run) / "eos_grid.json")
    if not args.report:
        out = grid(args.run, args.data, args.models, args.num_prompts, args.batch_size)
        path.write_text(json.dumps(out))
    tables(json.loads(path.read_text()))


if __name__ == "__main__":
    main()
