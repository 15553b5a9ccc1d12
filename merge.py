"""
AR-MAP (docs/methods.md §4), step 2: carry the preference the AR model learnt with DPO (dpo.py) into the DLM
converted from that AR model, by adding the preference task vector τ_pref = W_AR_aligned − W_AR to its weights.

    python -m worlds.stdlib  --data data/stdlib --out_dir data/pairs          # the synthetic preference data
    python dpo.py            --ar out/ar-tiny --pairs data/pairs/train.jsonl --heldout data/pairs/heldout.jsonl \\
                             --out_dir out/ar-dpo                               # step 1: DPO on the AR model
    python merge.py spectrum --ar out/ar-tiny --ar_aligned out/ar-dpo --dlm out/repro/lambda10
    python merge.py merge    --ar out/ar-tiny --ar_aligned out/ar-dpo --dlm out/repro/lambda10 \\
                             --pairs data/pairs/train.jsonl --heldout data/pairs/heldout.jsonl \\
                             --out_dir out/dlm-merged --method ties

merge: W = W_DLM + γ·Δ, γ chosen on training pairs by the implicit reward r_γ(x, y) = β (ELBO_γ(y|x) − ELBO_DLM(y|x)).
"""
import contextlib
import json
import math
import random
import shutil
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

import diffusion
from model import Qwen3Config
from lib import cli
from lib import data
from lib import runner
from lib import training
from lib.hf import open_weights, read_tensor

TYPES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens", "lm_head",
         "norms")  # spectrum's rows, in this order
SEQ_LEN = 512  # merge: max tokens of prompt + response (dpo.py: --seq_len)
BATCH = 16  # merge: pairs per forward (ELBOs)
SELECTORS = ("accuracy", "dpo")  # merge --select: see pick_gamma


def checkpoint_args(parser):
    """The three checkpoints both commands read (W_AR, W_AR_aligned, W_DLM) and the device."""
    parser.add_argument("--ar", default="out/ar-tiny", help="the AR checkpoint (W_AR)")
    parser.add_argument("--ar_aligned", default="out/ar-dpo", help="the AR checkpoint after DPO (W_AR_aligned)")
    parser.add_argument("--dlm", default="out/repro/lambda10", help="the DLM converted from --ar and trained (W_DLM)")
    parser.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    return parser


p = cli.parser(__doc__)
sub = p.add_subparsers(dest="cmd", required=True)
sp = checkpoint_args(sub.add_parser("spectrum", formatter_class=cli.HelpFormatter,
                                    help="spectral norms of τ_diff and τ_pref per weight, by layer type"))
sp.add_argument("--out", default=None, help="default: spectrum.json in the --ar_aligned directory")
s = checkpoint_args(sub.add_parser("merge", formatter_class=cli.HelpFormatter,
                                   help="W = W_DLM + γ·Δ, γ chosen on training pairs, reported on held-out pairs"))
s.add_argument("--pairs", default="data/pairs/train.jsonl", help="training pairs: a sample of them chooses γ")
s.add_argument("--heldout", default="data/pairs/heldout.jsonl", help="held-out pairs: reported, and the win rate's")
s.add_argument("--n_select", type=int, default=128, help="training pairs (a seeded sample) that score each γ")
s.add_argument("--out_dir", default="out/dlm-merged", help="the merged DLM at the chosen γ, and merge.json")
s.add_argument("--method", default="linear", choices=["linear", "ties", "dare"], help="how Δ is formed from τ_pref")
s.add_argument("--density", type=float, default=0.2, help="ties: the fraction of entries kept")
s.add_argument("--drop", type=float, default=0.9, help="dare: the drop probability p")
s.add_argument("--gammas", type=cli.comma_list(float, what="numbers, e.g. 0,1,2,4", distinct=True),
               default="0,0.5,1,2,3,4,6,8", help="the γ grid (one value: no search)")
s.add_argument("--select", default="accuracy", choices=SELECTORS, help="how the training pairs choose γ (pick_gamma)")
s.add_argument("--masks", default="shared", choices=["shared", "independent"], help="the ELBO draws: the reference's")
s.add_argument("--beta", type=float, default=0.1, help="β of the implicit reward β(ELBO_γ − ELBO_DLM)")
s.add_argument("--n_masks", type=int, default=diffusion.N_DRAWS, help="ELBO draws (t, mask) per pair")
s.add_argument("--samples", type=int, default=32, help="win rate (eval.py winrate): completions per model (0: none)")
s.add_argument("--win_rate_at", default="chosen", choices=["chosen", "all"], help="at the chosen γ, or at every γ")
s.add_argument("--seed", type=int, default=1337, help="the training-pair sample, masks, DARE, samples")


# ---- task vectors: spectrum ------------------------------------------------------------------------

def spectral_norm(x):
    """‖x‖₂: a matrix's largest singular value (no SVD: from the Gram matrix of the shorter side), a vector's norm."""
    if x.dim() != 2:
        return x.norm().item()
    g = x.T @ x if x.shape[0] >= x.shape[1] else x @ x.T  # (k, k), k = min(m, n)
    return torch.linalg.eigvalsh(g)[-1].clamp(min=0).sqrt().item()  # σ₁ = √λ_max(XᵀX), relative error ~1e-6


def layer_type(name):
    kind = name.rsplit(".", 2)[-2]  # model.layers.3.self_attn.q_proj.weight -> q_proj
    return "norms" if kind.endswith("norm") else kind


def spectrum(ar, aligned, dlm, device="cpu"):
    """Per tensor: ‖τ_diff‖₂, ‖τ_pref‖₂ and their ratio, one tensor of each checkpoint in memory at a time."""
    h_ar, h_al, h_dlm = open_weights([ar, aligned, dlm], Qwen3Config)
    rows = []
    for name in tqdm(sorted(h_ar), desc="spectrum", leave=False):
        w = read_tensor(h_ar, name, device)
        pref = spectral_norm(read_tensor(h_al, name, device) - w)  # τ_pref = W_AR_aligned − W_AR
        diff = spectral_norm(w - read_tensor(h_dlm, name, device)[:len(w)])  # τ_diff = W_AR − W_DLM, the AR's rows
        rows.append(dict(name=name, type=layer_type(name), diff=diff, pref=pref,
                         ratio=diff / pref if pref else math.inf))
    return rows


def summarise(rows):
    """Per layer type: count, median ‖τ_diff‖₂, median ‖τ_pref‖₂, median and min ratio."""
    types = sorted({r["type"] for r in rows}, key=lambda t: (TYPES + (t,)).index(t))
    def med(t, k):
        return statistics.median(r[k] for r in rows if r["type"] == t)
    return {t: dict(count=sum(r["type"] == t for r in rows), diff=med(t, "diff"), pref=med(t, "pref"),
                    ratio=med(t, "ratio"), min_ratio=min(r["ratio"] for r in rows if r["type"] == t)) for t in types}


def cmd_spectrum(args):
    device, _ = cli.setup(args.device)
    out = Path(args.ar_aligned) / "spectrum.json" if args.out is None else Path(args.out)
    summary = summarise(rows := spectrum(args.ar, args.ar_aligned, args.dlm, device))
    print(cli.table(["layer type", "count", "median ‖τ_diff‖₂", "median ‖τ_pref‖₂", "median ratio", "min ratio"],
                    [[t, v["count"], *(f"{v[k]:.4g}" for k in ("diff", "pref", "ratio", "min_ratio"))]
                     for t, v in summary.items()]))
    out.write_text(json.dumps(dict(ar=args.ar, ar_aligned=args.ar_aligned, dlm=args.dlm, summary=summary,
                                   tensors=rows), indent=2) + "\n")
    print(f"wrote {out}")


# ---- task vectors: merge ---------------------------------------------------------------------------

def ties(deltas, density):
    """TIES: each delta trimmed to its top-`density` entries, a sign elected per entry, the agreeing ones averaged."""
    trimmed = []
    for d in deltas:
        keep = torch.zeros(d.numel(), dtype=torch.bool, device=d.device)
        keep[d.abs().flatten().topk(max(1, round(density * d.numel()))).indices] = True
        trimmed.append(d * keep.view(d.shape))  # τ̂_t = τ_t on its top-k |entries|, 0 elsewhere
    T = torch.stack(trimmed)
    sign = torch.sign(T.sum(0))  # γ = sgn(Σ_t τ̂_t)
    agree = (torch.sign(T) == sign) & (T != 0)  # A = {t : sgn(τ̂_t) = γ}
    return (T * agree).sum(0) / agree.sum(0).clamp(min=1)  # τ = (1/|A|) Σ_{t∈A} τ̂_t


def dare(delta, drop, generator):
    """DARE: drop each entry with probability p, rescale the survivors by 1/(1−p) (the expectation is kept)."""
    keep = torch.rand(delta.shape, generator=generator, device=generator.device).to(delta.device) >= drop
    return delta * keep / (1 - drop)  # τ̃ = m ⊙ τ / (1 − p), m_i ~ Bernoulli(1 − p)


def task_deltas(handles, shapes, *, method, density, drop, seed, device):
    """{name: Δ} of τ_pref = W_AR_aligned − W_AR per DLM tensor (shapes): linear, ties or dare; 0 on its mask rows."""
    (h_ar, h_al), g, delta = handles, torch.Generator().manual_seed(seed), {}
    for name, shape in tqdm(shapes.items(), desc=f"task vector ({method})", leave=False):
        tau = read_tensor(h_al, name) - read_tensor(h_ar, name)  # τ_pref = W_AR_aligned − W_AR
        tau = torch.cat([tau, tau.new_zeros(shape[0] - len(tau), *shape[1:])])  # 0 on the appended rows, if any
        delta[name] = (ties([tau], density) if method == "ties" else dare(tau, drop, g)
                       if method == "dare" else tau).to(device)  # linear: Δ = τ_pref
    return delta


@torch.no_grad()
def apply(model, W0, delta, gamma):
    for name, q in model.named_parameters():
        torch.add(W0[name], delta[name], alpha=gamma, out=q)  # W = W_DLM + γ·Δ, in place


@torch.no_grad()
def revert(model, W0):
    for name, q in model.named_parameters():
        q.copy_(W0[name])  # W = W_DLM, bit for bit


def rewards(model, W0, delta, items, gammas, *, beta, n_masks, seed, masks="shared", ctx=contextlib.nullcontext()):
    """-> (G, n, 2): r_γ(x, y) = β (ELBO_γ(y|x) − ELBO_DLM(y|x)) of each pair's chosen and rejected response at each
    γ; the model left at W0. masks "shared": the reference's draws (r_0 = 0); "independent": their own (seed + 1)."""
    T = max(len(x) + max(len(yw), len(yl)) for x, yw, yl in items)
    ref_masks = diffusion.draw_masks(len(items), n_masks, T, seed)
    own_masks = ref_masks if masks == "shared" else diffusion.draw_masks(len(items), n_masks, T, seed + 1)
    ref = diffusion.all_logps(model, items, ref_masks, BATCH, ctx)  # ELBO_DLM, computed once
    out = []
    for gamma in tqdm(gammas, desc=f"γ grid, {len(items)} pairs", leave=False):
        apply(model, W0, delta, gamma)
        e = ref if gamma == 0 and masks == "shared" else diffusion.all_logps(model, items, own_masks, BATCH, ctx)
        revert(model, W0)
        out.append(beta * (e - ref))  # r_γ(x, y) = β (ELBO_γ(y|x) − ELBO_DLM(y|x))
    return torch.stack(out)


def reward_stats(r, gammas):
    """Per γ, of rewards (G, n, 2): reward accuracy (a tie counts half), mean margin (and / γ), DPO loss, mean rewards,
    and the share of margins with the sign they have at the smallest γ > 0."""
    m = r[..., 0] - r[..., 1]  # (G, n) margins
    first = min((k for k, g in enumerate(gammas) if g > 0), key=lambda k: gammas[k], default=None)
    mean = m.mean(1).tolist()
    return dict(reward_accuracy=((m > 0) + (m == 0) / 2).mean(1).tolist(), margin=mean,
                margin_per_gamma=[x / g if g else None for x, g in zip(mean, gammas)],
                dpo_loss=(-F.logsigmoid(m)).mean(1).tolist(),  # −log σ(r_γ(x, y_w) − r_γ(x, y_l))
                reward_chosen=r[..., 0].mean(1).tolist(), reward_rejected=r[..., 1].mean(1).tolist(),
                same_sign=None if first is None else (torch.sign(m) == torch.sign(m[first])).float().mean(1).tolist())


def pick_gamma(gammas, stats, *, select="accuracy"):
    """The γ the training pairs' reward_stats choose, ties to the smallest: the highest reward accuracy (the paper's
    rule) or the lowest DPO loss along W_DLM + γ·Δ (dpo: this project's)."""
    key = {"accuracy": [-a for a in stats["reward_accuracy"]], "dpo": stats["dpo_loss"]}[select]
    return min(zip(gammas, key), key=lambda gk: (gk[1], gk[0]))[0]


def cmd_merge(args):
    if not 0 < args.density <= 1 or not 0 <= args.drop < 1 or min(args.n_masks, args.n_select) <= 0 or args.samples < 0:
        p.error("need 0 < --density <= 1, 0 <= --drop < 1, --n_masks > 0, --n_select > 0, --samples >= 0")
    if Path(args.pairs).resolve() == Path(args.heldout).resolve():
        raise SystemExit(f"merge: --pairs and --heldout are the same file ({args.pairs}): γ is chosen on training "
                         f"pairs and reported on held-out ones; pass both")
    device, ctx = cli.setup(args.device, args.seed)
    handles = open_weights([args.ar, args.ar_aligned, args.dlm], Qwen3Config)
    model = training.load_model(args.dlm, device, "merge: --dlm").requires_grad_(False).eval()
    training.require_dlm(model.config, f"--dlm {args.dlm}", "merge")
    tok = training.load_tokenizer(args.dlm, model.config)
    train, heldout = (data.tokenized_pairs(f, tok, SEQ_LEN, "merge") for f in (args.pairs, args.heldout))
    train = random.Random(args.seed).sample(train, min(args.n_select, len(train)))  # the γ search's sample
    delta = task_deltas(handles[:2], {n: q.shape for n, q in model.named_parameters()}, method=args.method,
                        density=args.density, drop=args.drop, seed=args.seed, device=device)
    W0 = {n: q.detach().clone() for n, q in model.named_parameters()}  # W_DLM, the one saved copy
    gammas = args.gammas
    def score(items):
        return reward_stats(rewards(model, W0, delta, items, gammas, beta=args.beta, n_masks=args.n_masks,
                                    seed=args.seed, masks=args.masks, ctx=ctx), gammas)
    sel = score(train) if len(gammas) > 1 else None  # the selection sees the training pairs only
    best = gammas[0] if sel is None else pick_gamma(gammas, sel, select=args.select)
    held = score(heldout)  # reported per γ; never read by the selection
    print(f"\n{args.method}, {args.masks} masks ({args.n_masks} draws per pair): γ chosen by {args.select} on "
          f"{len(train)} training pairs, reported on {len(heldout)} held-out pairs")
    f3, f4, rows = (lambda x: "—" if x is None else f"{x:.3f}"), (lambda x: "—" if x is None else f"{x:.4f}"), []
    def mark(g):
        return f"{g:g}{' (chosen)' * (g == best)}"
    for k, g in enumerate(gammas):
        tr = [f3(sel["reward_accuracy"][k]), f4(sel["margin"][k]), f4(sel["dpo_loss"][k])] if sel else ["—"] * 3
        rows.append([mark(g), *tr, f3(held["reward_accuracy"][k]), f4(held["margin"][k]),
                     f4(held["margin_per_gamma"][k])])
    print(cli.table(["γ", "train: reward accuracy", "train: mean margin", "train: DPO loss",
                     "held-out: reward accuracy", "held-out: mean margin", "held-out: margin / γ"], rows))
    if sel is not None:
        print("γ by each rule: " + ", ".join(f"{k} {pick_gamma(gammas, sel, select=k):g}" for k in SELECTORS))

    def save_at(gamma, d):  # the merged DLM (the DLM's config: attn, shift, mask token, converted_from)
        apply(model, W0, delta, gamma)
        model.save_pretrained(d)
        tok.save_pretrained(d)
        revert(model, W0)

    out_dir = Path(args.out_dir)
    save_at(best, out_dir)
    wins = {}  # γ -> (win rate against the DLM, mean rule score), by eval.py winrate in a child process
    if args.samples:
        grid = gammas if args.win_rate_at == "all" else [best]  # the chosen γ's model is out_dir's, saved above
        dirs = {g: out_dir if g == best else out_dir / f"gamma-{g:g}" for g in grid}
        for g in [g for g, d in dirs.items() if d != out_dir]:  # removed after
            save_at(g, dirs[g])
        runner.run_script("eval.py", "winrate", "--ckpt", *dirs.values(), "--ref", args.dlm, "--pairs", args.heldout,
                            "--samples", args.samples, "--seed", args.seed, "--device", device,
                            "--out", out_dir / "winrate.json", quiet=True)
        w = json.loads((out_dir / "winrate.json").read_text())["results"]
        wins = {g: (w["win_rates"][k], w["rule_scores"][k]) for k, g in enumerate(dirs)}
        for d in set(dirs.values()) - {out_dir}:
            shutil.rmtree(d)
        print(f"win rate against the DLM by rule_score (mean score of the DLM {w['rule_score_ref']:+.3f}), "
              f"{args.samples} held-out prompts, temperature 1.0, threshold 0.9:")
        print(cli.table(["γ", "win rate", "mean score"],
                        [[mark(g), f"{wr:.3f}", f"{sc:+.3f}"] for g, (wr, sc) in wins.items()]))
    res = dict(vars(args), best_gamma=best, win_rate=wins[best][0] if wins else None,  # every flag, then the results
               chosen_by=None if sel is None else {k: pick_gamma(gammas, sel, select=k) for k in SELECTORS},
               train=dict(pairs=args.pairs, n_pairs=len(train), **(sel or {})),
               heldout=dict(pairs=args.heldout, n_pairs=len(heldout), **held),
               win_rates=[wins[g][0] if g in wins else None for g in gammas],
               rule_scores=[wins[g][1] if g in wins else None for g in gammas],
               rule_score_dlm=w["rule_score_ref"] if wins else None)
    cli.atomic_write(out_dir / "merge.json", lambda f: Path(f).write_text(json.dumps(res, indent=2) + "\n"))


if __name__ == "__main__":
    args = p.parse_args()
    dict(spectrum=cmd_spectrum, merge=cmd_merge).get(args.cmd, getattr(args, "fn", None))(args)
