"""
Training curves from one or several runs' log.jsonl (training.Log: pretrain.py, align.py, distill.py,
dpo.py), as one PNG with one panel per quantity and one line per run.

    python -m lib.plot out/align out/align0 --out fig.png                 # legend labels: align, align0
    python -m lib.plot out/align --keys loss grad_norm 'val_acc@*' --out acc.png    # a panel per key or pattern

What is notable: a run is a directory holding log.jsonl (or the file itself); a list-valued key, such as
align.py's per-layer alignment, becomes one series per index (`align_per_layer[3]`); a resumed run's log
repeats the steps after its last checkpoint, and the last value logged for a step wins. The default panels
are those of DEFAULT_PANELS that some run has a key for, so one command serves every script. matplotlib is
needed only to draw (`choose_panels` and `series` are pure, and tested without it).
"""
import fnmatch
import json
import math
import os
import re
from pathlib import Path

from lib import cli

# (title, key patterns): a panel is drawn when some run has a key matching one of its patterns
DEFAULT_PANELS = (
    ("loss (train; val_*: validation)", ("loss", "val_loss", "heldout_loss")),
    ("REPR-ALIGN: diffusion and alignment loss", ("diff_loss", "align_loss")),
    ("validation CE of masked tokens at mask ratio r; −ELBO (nats/token)", ("val_loss@*", "val_nelbo")),
    ("masked-token accuracy at mask ratio r", ("val_acc@*",)),
    ("REPR-ALIGN per layer, training (cos; l2 with --align_metric l2)", ("align_per_layer*", "cos_layer*")),
    ("cosine to the teacher per hidden state (validation)", ("val_cos*",)),
    ("OPDLM: KL(teacher ‖ student) per masked token", ("kl", "val_kl")),
    ("OPDLM: rollout length (tokens)", ("max_len", "rollout_len")),
    ("tokens per forward", ("tokens_per_forward", "val_tokens_per_forward")),
    ("exact match on held-out tasks (task_acc: all families)", ("task_acc*",)),
    ("tasks: tokens per forward per row; share answered with a full stop", ("task_tpf", "task_pref")),
    ("DPO: reward accuracy", ("reward_acc", "heldout_reward_acc")),
    ("DPO: reward margin r(y_w) − r(y_l)", ("margin", "heldout_margin")),
)
NOT_PLOTTED = {"step", "time"}


def read_log(run):
    """A run directory (or its log.jsonl) -> the list of records, in file order."""
    path = Path(run) / "log.jsonl" if Path(run).is_dir() else Path(run)
    if not path.is_file():
        raise SystemExit(f"plot: {path} not found; pass a run directory holding log.jsonl (or the file itself)")
    records = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                raise SystemExit(f"plot: {path}:{n} is not JSON; is this a training.Log file?")
    return records


def series(records):
    """records -> {key: (steps, values)} sorted by step. Lists become one key per index ("k[i]"); non-numbers
    (None, strings, bools) are skipped; a step logged twice (a resumed run) keeps its last value."""
    by_key = {}
    for rec in records:
        if "step" not in rec:
            continue
        for k, v in rec.items():
            items = [(f"{k}[{i}]", x) for i, x in enumerate(v)] if isinstance(v, list) else [(k, v)]
            for name, x in items:
                if name not in NOT_PLOTTED and isinstance(x, (int, float)) and not isinstance(x, bool):
                    by_key.setdefault(name, {})[rec["step"]] = float(x)
    return {k: (sorted(d), [d[s] for s in sorted(d)]) for k, d in by_key.items()}


def natural(key):
    """Sort key in which numbers sort by value: val_acc@0.15 before val_acc@0.5, layer[9] before layer[10]."""
    parts = re.split(r"(\d+(?:\.\d+)?)", key)  # odd indices: the numbers
    return [(1, float(s), "") if i % 2 else (0, 0.0, s) for i, s in enumerate(parts)]


def labels(runs):
    """Legend labels: the run paths as given, less the folder they all share (out/align, out/align0 -> align,
    align0); a log.jsonl path stands for its folder."""
    paths = [Path(r).parent if Path(r).name == "log.jsonl" else Path(r) for r in runs]
    common = Path(os.path.commonpath([p.absolute() for p in paths])) if len(paths) > 1 else None
    if common is None or any(p.absolute() == common for p in paths):
        return [str(p) for p in paths]
    return [str(p.absolute().relative_to(common)) for p in paths]


def choose_panels(keys, wanted=None):
    """keys: every key some run has -> [(title, [keys])], in panel order, without empty panels.
    wanted=None: DEFAULT_PANELS; else one panel per pattern (fnmatch: 'val_acc@*'), titled by it."""
    panels = DEFAULT_PANELS if wanted is None else [(w, (w,)) for w in wanted]
    out = []
    for title, patterns in panels:
        found = []
        for pat in patterns:  # pattern order first (train before val), natural order within a pattern
            found += [k for k in sorted(keys, key=natural) if fnmatch.fnmatchcase(k, pat) and k not in found]
        if found:
            out.append((title, found))
    return out


def main(argv=None):
    p = cli.parser(__doc__)
    p.add_argument("runs", nargs="+", help="run directories holding log.jsonl (or log.jsonl files)")
    p.add_argument("--out", default="curves.png", help="the PNG to write")
    p.add_argument("--keys", nargs="+", default=None,
                   help="one panel per key or fnmatch pattern (e.g. loss 'val_acc@*'); None: DEFAULT_PANELS")
    p.add_argument("--cols", type=int, default=3, help="panels per row")
    p.add_argument("--log_y", action="store_true", help="logarithmic y axes")
    args = p.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plot: needs matplotlib; pip install matplotlib")

    runs = {label: series(read_log(r)) for label, r in zip(labels(args.runs), args.runs)}
    if len(runs) < len(args.runs):
        raise SystemExit("plot: two runs have the same label; pass each run once")
    keys = set().union(*(s.keys() for s in runs.values()))
    panels = choose_panels(keys, args.keys)
    for w in args.keys or ():
        if not any(w == title for title, _ in panels):
            print(f"plot: no run has a key matching {w!r}; skipped")
    if not panels:
        raise SystemExit(f"plot: nothing to plot; the runs' keys are: {', '.join(sorted(keys, key=natural))}")

    cols = min(args.cols, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.6 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ("-", "--", ":", "-.")
    for ax, (title, panel_keys) in zip(axes.flat, panels):
        many = len(panel_keys) > len(styles)  # per-layer panels: a colour scale over the layers
        for r, (run, s) in enumerate(runs.items()):
            for k, key in enumerate(panel_keys):
                if key not in s:
                    continue
                steps, vals = s[key]
                # one key: a colour per run; several: a colour per key and a line style per run
                if len(panel_keys) == 1:
                    color = colors[r % len(colors)]
                elif many:
                    color = plt.cm.viridis(k / (len(panel_keys) - 1))
                else:
                    color = colors[k % len(colors)]
                style = styles[r % len(styles)] if len(panel_keys) > 1 else "-"
                label = key if len(runs) == 1 else f"{run}: {key}"
                if many and k not in (0, len(panel_keys) // 2, len(panel_keys) - 1):
                    label = "_nolegend_"  # the colour scale speaks for the layers in between
                marker = "o" if len(steps) <= 30 else None  # validation keys are logged every eval_interval
                ax.plot(steps, vals, style, color=color, marker=marker, ms=3, lw=1.2, label=label)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if args.log_y:
            ax.set_yscale("log")
        ax.legend(fontsize=6)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    if len(runs) == 1:
        fig.suptitle(next(iter(runs)), fontsize=10)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}: {len(panels)} panels ({', '.join(t for t, _ in panels)}) from {len(runs)} runs")


if __name__ == "__main__":
    main()
