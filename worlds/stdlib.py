"""
The standard-library world's preference: "prefer single-quoted strings", as a rule score and as synthetic pairs cut
from a prepared corpus (chosen: every double quote made single; rejected: the reverse), for DPO and AR-MAP.

    python -m worlds.stdlib --data data/stdlib --out_dir data/pairs     # train.jsonl, heldout.jsonl
"""
import json
import random
from pathlib import Path

from tqdm import tqdm

from lib import cli
from lib.cli import atomic_write
from lib.data import documents, load_split
from lib.tokenizer import Tokenizer


def rule_score(text):
    """The stdlib world's preference, "prefer single-quoted strings", as a score: (#' − #")/max(1, #' + #"), +1 all
    single quotes, −1 all double, 0 none."""
    s, d = text.count("'"), text.count('"')
    return (s - d) / max(1, s + d)


def make_pairs(texts, n, prompt_chars, response_chars, seed):
    """n {prompt, chosen, rejected} records: windows (prompt = the preceding text, response = the continuation)
    whose response holds >= 2 quotes, drawn with a seeded RNG; chosen: every " made ', rejected: every ' made "."""
    windows = []
    for text in texts:
        for c in range(prompt_chars, len(text) - response_chars + 1, response_chars):
            y = text[c:c + response_chars]
            if y.count("'") + y.count('"') >= 2:
                windows.append((text[c - prompt_chars:c], y))
    picked = random.Random(seed).sample(windows, min(n, len(windows)))
    return [dict(prompt=x, chosen=y.replace('"', "'"), rejected=y.replace("'", '"')) for x, y in picked]


def write_pairs(data_dir, out_dir, *, n_train, n_heldout, prompt_chars, response_chars, seed, who="pairs"):
    """The synthetic preference pairs of a prepared dataset (make_pairs): out_dir/train.jsonl from its train split,
    out_dir/heldout.jsonl from its val split (seed + 1), each written atomically; a one-line exit when none fit."""
    try:
        tok = Tokenizer.from_pretrained(data_dir)
        splits = {s: load_split(data_dir, s) for s in ("train", "val")}
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"{who}: {e}")
    recs = {}
    for split, name, n in (("train", "train.jsonl", n_train), ("val", "heldout.jsonl", n_heldout)):
        texts = [tok.decode(d.tolist()) for d in tqdm(documents(splits[split], tok.eos_id), desc=f"decoding {split}",
                                                       leave=False)]
        recs[name] = make_pairs(texts, n, prompt_chars, response_chars, seed + (split == "val"))
        if not recs[name]:
            raise SystemExit(f"{who}: no window of the {split} split of {data_dir} has >= 2 quotes in its "
                             f"{response_chars}-character continuation; try other --prompt_chars/--response_chars")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)  # only now: a failed run leaves no empty directory behind
    for (name, r), split, n in zip(recs.items(), ("train", "val"), (n_train, n_heldout)):
        atomic_write(out / name, lambda f: Path(f).write_text("".join(json.dumps(x) + "\n" for x in r)))
        print(f"{out / name}: {len(r)} pairs from the {split} split" + f" (asked for {n})" * (len(r) < n))


if __name__ == "__main__":
    p = cli.parser(__doc__)
    p.add_argument("--data", default="data/stdlib", help="a directory prepared by lib/corpus.py")
    p.add_argument("--out_dir", default="data/pairs", help="train.jsonl and heldout.jsonl go here")
    for name, default, help in (("n_train", 512, "training pairs"), ("n_heldout", 128, "held-out pairs"),
                                ("prompt_chars", 192, "characters of text before the response"),
                                ("response_chars", 96, "characters of each response"),
                                ("seed", 1337, "which corpus windows are cut")):
        p.add_argument(f"--{name}", type=int, default=default, help=help)
    args = p.parse_args()
    if min(args.n_train, args.n_heldout, args.prompt_chars, args.response_chars) <= 0:
        p.error("need --n_train, --n_heldout, --prompt_chars and --response_chars > 0")
    write_pairs(args.data, args.out_dir, n_train=args.n_train, n_heldout=args.n_heldout, who="worlds.stdlib",
                prompt_chars=args.prompt_chars, response_chars=args.response_chars, seed=args.seed)
