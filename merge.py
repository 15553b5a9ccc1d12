"""
AR-MAP (docs/methods.md §4), step 2: carry the preference the AR model learnt with DPO (dpo.py) into the DLM
converted from that AR model, by adding the preference task vector τ_pref = W_AR_aligned − W_AR to its weights.

    python merge.py pairs    --data data/stdlib --out_dir data/pairs          # the synthetic preference data
    python dpo.py            --ar out/ar-tiny --pairs data/pairs/train.jsonl --heldout data/pairs/heldout.jsonl \\
                             --out_dir out/ar-dpo                               # step 1: DPO on the AR model
    python merge.py spectrum --ar out/ar-tiny --ar_aligned out/ar-dpo --dlm out/repro/lambda10
    python merge.py merge    --ar out/ar-tiny --ar_aligned out/ar-dpo --dlm out/repro/lambda10 \\
                             --pairs data/pairs/train.jsonl --heldout data/pairs/heldout.jsonl \\
                             --out_dir out/dlm-merged --method ties

What is notable here:
- The embedded default's preference can be checked by eye: "prefer single-quoted strings". `pairs` cuts
  windows of the corpus whose continuation holds >= 2 quotes: chosen = every " made ', rejected = every ' made ",
  and rule_score(text) = (#' − #")/max(1, #' + #") scores any text by the same rule (the win rate).
- Checkpoints are read one tensor at a time with safetensors.safe_open (spectrum, task vectors); merging applies
  and reverts γ·Δ in place on the loaded DLM from one saved copy W0, so the revert is bit-exact and there is
  never a second model per γ. ‖·‖₂ comes from the Gram matrix of the shorter side, not from an SVD.
- γ is chosen on a seeded sample of the TRAINING pairs (--n_select); the held-out pairs only report: the reward
  accuracy and margin per γ, and the win rate at the chosen γ.
- The ELBO draws (t, M) are shared by chosen and rejected, and by default (--masks shared) also by every γ and
  the reference DLM (common random numbers). Then r_γ(y_w) − r_γ(y_l) ≈ βγ·∇(ELBO(y_w) − ELBO(y_l))·Δ to first
  order: its sign, hence the reward accuracy, does not depend on γ until the merge is far from linear, and
  --select accuracy (the paper's rule, ties to the smallest γ) picks among near-equal accuracies by chance.
  --masks independent makes the accuracy rise with γ for another reason: the reference's Monte Carlo noise stays
  while the margin grows. --select dpo (this project's rule, not the paper's) minimises the DPO loss of the
  training pairs along W_DLM + γ·Δ instead. merge.json records per γ, on both pair sets, the accuracy, the mean
  margin, margin/γ, the DPO loss and the mean chosen / rejected rewards, the γ each rule picks, and with
  --win_rate_at all the win rate at every γ.
"""
import argparse
import contextlib
import json
import math
import random
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

import cli
import data
import diffusion
import training
from checkpoint import weight_files
from dpo import pair_batch, read_pairs
from model import Qwen3Config, attend
from sample import block_generate, diffusion_generate, until_end
from tokenizer import Tokenizer, atomic_write

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TYPES = LORA_TARGETS + ("embed_tokens", "lm_head", "norms")  # spectrum's rows, in this order
SEQ_LEN = 512  # merge: max tokens of prompt + response (dpo.py: --seq_len)
BATCH = 16  # merge: pairs per forward (ELBOs) and prompts per sampler call (win rate)
GEN_LEN, GEN_BLOCK = 64, 32  # win rate: tokens sampled per prompt; the bidirectional sampler's block length
SELECTORS = ("accuracy", "dpo")  # merge --select: see pick_gamma


def gamma_list(text):
    """argparse type of --gammas: distinct finite numbers, comma-separated."""
    try:
        gammas = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers, e.g. 0,1,2,4") from None
    if not gammas or not all(math.isfinite(g) for g in gammas) or len(set(gammas)) < len(gammas):
        raise argparse.ArgumentTypeError(f"{text!r}: need one or more distinct finite numbers, e.g. 0,1,2,4")
    return gammas


p = cli.parser(__doc__)
sub = p.add_subparsers(dest="cmd", required=True)
s = sub.add_parser("pairs", formatter_class=cli.HelpFormatter,
                   help="synthetic preference pairs: prefer single-quoted strings")
s.add_argument("--data", default="data/stdlib", help="a directory prepared by data.py")
s.add_argument("--out_dir", default="data/pairs", help="train.jsonl and heldout.jsonl go here")
for name, default, help in (("n_train", 512, "training pairs"), ("n_heldout", 128, "held-out pairs"),
                            ("prompt_chars", 192, "characters of text before the response"),
                            ("response_chars", 96, "characters of each response"),
                            ("seed", 1337, "which corpus windows are cut")):
    s.add_argument(f"--{name}", type=int, default=default, help=help)
s = sub.add_parser("spectrum", formatter_class=cli.HelpFormatter,
                   help="spectral norms of τ_diff and τ_pref per weight, by layer type")
s.add_argument("--ar", default="out/ar-tiny", help="the AR checkpoint (W_AR)")
s.add_argument("--ar_aligned", default="out/ar-dpo", help="the AR checkpoint after DPO (W_AR_aligned)")
s.add_argument("--dlm", default="out/repro/lambda10", help="the DLM converted from --ar and trained (W_DLM)")
s.add_argument("--out", default=None, help="default: spectrum.json in the --ar_aligned directory")
s.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
s = sub.add_parser("merge", formatter_class=cli.HelpFormatter,
                   help="W = W_DLM + γ·Δ, γ chosen on training pairs, reported on held-out pairs")
s.add_argument("--ar", default="out/ar-tiny", help="the AR checkpoint (W_AR)")
s.add_argument("--ar_aligned", default="out/ar-dpo", help="the AR checkpoint after DPO (W_AR_aligned)")
s.add_argument("--dlm", default="out/repro/lambda10", help="the DLM to merge into (W_DLM)")
s.add_argument("--pairs", default="data/pairs/train.jsonl", help="training pairs: a sample of them chooses γ")
s.add_argument("--heldout", default="data/pairs/heldout.jsonl",
               help="held-out pairs: the reported reward accuracy per γ, and the win rate's prompts")
s.add_argument("--n_select", type=int, default=128, help="training pairs (a seeded sample) that score each γ")
s.add_argument("--out_dir", default="out/dlm-merged", help="the merged DLM at the chosen γ, and merge.json")
s.add_argument("--method", default="linear", choices=["linear", "ties", "dare"], help="how Δ is formed from τ_pref")
s.add_argument("--density", type=float, default=0.2, help="ties: the fraction of entries kept")
s.add_argument("--drop", type=float, default=0.9, help="dare: the drop probability p")
s.add_argument("--gammas", type=gamma_list, default="0,0.5,1,2,3,4,6,8", help="the γ grid (one value: no search)")
s.add_argument("--select", default="accuracy", choices=SELECTORS,
               help="how the training pairs choose γ (see pick_gamma)")
s.add_argument("--masks", default="shared", choices=["shared", "independent"],
               help="shared: the merged models' ELBO draws are the reference DLM's; independent: drawn apart")
s.add_argument("--beta", type=float, default=0.1, help="β of the implicit reward β(ELBO_γ − ELBO_DLM)")
s.add_argument("--n_masks", type=int, default=4, help="ELBO draws (t, mask) per pair")
s.add_argument("--samples", type=int, default=32, help="win rate: completions per model (0: none)")
s.add_argument("--win_rate_at", default="chosen", choices=["chosen", "all"],
               help="the win rate at the chosen γ, or at every γ of the grid (a measurement: one sampling per γ)")
s.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
s.add_argument("--seed", type=int, default=1337, help="the training-pair sample, masks, DARE, samples")


# ---- pairs -----------------------------------------------------------------------------------------

def rule_score(text):
    s, d = text.count("'"), text.count('"')
    return (s - d) / max(1, s + d)  # (#' − #") / max(1, #' + #"): +1 all single quotes, −1 all double


def make_pairs(texts, n, prompt_chars, response_chars, seed):
    """n {prompt, chosen, rejected} records: windows (prompt = the preceding text, response = the continuation)
    whose response holds >= 2 quotes, drawn with a seeded RNG; the rule is applied to the response only."""
    windows = []
    for text in texts:
        for c in range(prompt_chars, len(text) - response_chars + 1, response_chars):
            y = text[c:c + response_chars]
            if y.count("'") + y.count('"') >= 2:
                windows.append((text[c - prompt_chars:c], y))
    picked = random.Random(seed).sample(windows, min(n, len(windows)))
    return [dict(prompt=x, chosen=y.replace('"', "'"), rejected=y.replace("'", '"')) for x, y in picked]


def cmd_pairs(args):
    if min(args.n_train, args.n_heldout, args.prompt_chars, args.response_chars) <= 0:
        p.error("need --n_train, --n_heldout, --prompt_chars and --response_chars > 0")
    try:
        tok = Tokenizer.from_pretrained(args.data)
        splits = {s: data.load_split(args.data, s) for s in ("train", "val")}
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"merge pairs: {e}")
    recs = {}
    for split, name, n in (("train", "train.jsonl", args.n_train), ("val", "heldout.jsonl", args.n_heldout)):
        docs = data.documents(splits[split], tok.eos_id)
        texts = [tok.decode(d.tolist()) for d in tqdm(docs, desc=f"decoding {split}", leave=False)]
        recs[name] = make_pairs(texts, n, args.prompt_chars, args.response_chars, args.seed + (split == "val"))
        if not recs[name]:
            raise SystemExit(f"merge pairs: no window of the {split} split of {args.data} has >= 2 quotes in its "
                             f"{args.response_chars}-character continuation; try other --prompt_chars/--response_chars")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)  # only now: a failed run leaves no empty directory behind
    for (name, r), split, n in zip(recs.items(), ("train", "val"), (args.n_train, args.n_heldout)):
        atomic_write(out / name, lambda f: Path(f).write_text("".join(json.dumps(x) + "\n" for x in r)))
        print(f"{out / name}: {len(r)} pairs from the {split} split" + f" (asked for {n})" * (len(r) < n))


# ---- task vectors: spectrum ------------------------------------------------------------------------

def open_weights(paths):
    """-> one {name: safe_open handle} per checkpoint (nothing read yet), after checking that all hold the same
    tensor names and shapes."""
    handles = []
    for path in paths:
        h = {}
        try:
            tied = Qwen3Config.load(path).tie_word_embeddings  # a tied checkpoint may also store lm_head: it is embed
            for f in weight_files(Path(path)):
                sf = safe_open(f, "pt")
                h.update({k: sf for k in sf.keys() if not (tied and k == "lm_head.weight")})
        except (FileNotFoundError, OSError, ValueError, SafetensorError) as e:
            raise SystemExit(f"merge: {path}: {e}")
        handles.append(h)
    shapes = [{k: tuple(sf.get_slice(k).get_shape()) for k, sf in h.items()} for h in handles]
    for path, sh in zip(paths[1:], shapes[1:]):
        if sh != shapes[0]:
            diff = sorted(set(sh.items()) ^ set(shapes[0].items()))[:2]
            raise SystemExit(f"merge: {path} and {paths[0]} hold different tensors (names or shapes), e.g. {diff}: "
                             f"they are not the same model")
    return handles


def read(h, name, device="cpu"):
    return h[name].get_tensor(name).to(device).float()


def spectral_norm(x):
    """‖x‖₂: the largest singular value of a matrix, the L2 norm of a vector (norm weights, biases). No SVD: σ₁² is
    the largest eigenvalue of the Gram matrix of the shorter side, one matmul and a min(m, n)² symmetric
    eigenproblem (for Qwen3's 151936 × 1024 embedding, a 1024 × 1024 one)."""
    if x.dim() != 2:
        return x.norm().item()
    g = x.T @ x if x.shape[0] >= x.shape[1] else x @ x.T  # (k, k), k = min(m, n)
    return torch.linalg.eigvalsh(g)[-1].clamp(min=0).sqrt().item()  # σ₁ = √λ_max(XᵀX), relative error ~1e-6


def layer_type(name):
    kind = name.rsplit(".", 2)[-2]  # model.layers.3.self_attn.q_proj.weight -> q_proj
    return "norms" if kind.endswith("norm") else kind


def spectrum(ar, aligned, dlm, device="cpu"):
    """Per tensor: ‖τ_diff‖₂, ‖τ_pref‖₂ and their ratio, one tensor of each checkpoint in memory at a time."""
    h_ar, h_al, h_dlm = open_weights([ar, aligned, dlm])
    rows = []
    for name in tqdm(sorted(h_ar), desc="spectrum", leave=False):
        w = read(h_ar, name, device)
        pref = spectral_norm(read(h_al, name, device) - w)  # τ_pref = W_AR_aligned − W_AR
        diff = spectral_norm(w - read(h_dlm, name, device))  # τ_diff = W_AR − W_DLM
        ratio = diff / pref if pref else math.inf
        rows.append(dict(name=name, type=layer_type(name), diff=diff, pref=pref, ratio=ratio))
    return rows


def summarise(rows):
    """Per layer type: count, median ‖τ_diff‖₂, median ‖τ_pref‖₂, median and min ratio."""
    types = sorted({r["type"] for r in rows}, key=lambda t: (TYPES + (t,)).index(t))
    med = lambda t, k: statistics.median(r[k] for r in rows if r["type"] == t)
    return {t: dict(count=sum(r["type"] == t for r in rows), diff=med(t, "diff"), pref=med(t, "pref"),
                    ratio=med(t, "ratio"), min_ratio=min(r["ratio"] for r in rows if r["type"] == t)) for t in types}


def cmd_spectrum(args):
    device, _ = training.setup(args.device)
    out = Path(args.ar_aligned) / "spectrum.json" if args.out is None else Path(args.out)
    summary = summarise(rows := spectrum(args.ar, args.ar_aligned, args.dlm, device))
    print("| layer type | count | median ‖τ_diff‖₂ | median ‖τ_pref‖₂ | median ratio | min ratio |\n"
          "|---|---|---|---|---|---|")
    for t, v in summary.items():
        print(f"| {t} | {v['count']} | {v['diff']:.4g} | {v['pref']:.4g} | {v['ratio']:.4g} | {v['min_ratio']:.4g} |")
    out.write_text(json.dumps(dict(ar=args.ar, ar_aligned=args.ar_aligned, dlm=args.dlm, summary=summary,
                                   tensors=rows), indent=2) + "\n")
    print(f"wrote {out}")


# ---- task vectors: merge ---------------------------------------------------------------------------

def ties(deltas, density):
    """TIES: trim each delta to its top-`density` fraction by magnitude, elect a sign per entry (the sign of the
    sum of the trimmed deltas), and average, per entry, only the deltas that agree with it (disjoint mean)."""
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


def task_deltas(handles, names, *, method, density, drop, seed, device):
    """{name: Δ}: the merged delta of τ_pref = W_AR_aligned − W_AR per tensor: linear (τ_pref itself), ties
    (density: the share kept) or dare (drop: the drop probability; its masks from a generator of this seed)."""
    h_ar, h_al = handles
    g = torch.Generator().manual_seed(seed)
    delta = {}
    for name in tqdm(names, desc=f"task vector ({method})", leave=False):
        tau = read(h_al, name) - read(h_ar, name)  # τ_pref = W_AR_aligned − W_AR
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


def draw_masks(n_pairs, n_masks, T, seed, eps=1e-3):
    """Common random numbers, drawn once: t (n_masks, n_pairs) ~ U(eps, 1-eps), u (n_masks, n_pairs, T) ~ U(0, 1).
    In draw k, response position i of pair j (chosen and rejected alike) is masked when u[k, j, i] < t[k, j]."""
    g = torch.Generator().manual_seed(seed)
    t = eps + (1 - 2 * eps) * torch.rand(n_masks, n_pairs, generator=g)
    return t, torch.rand(n_masks, n_pairs, T, generator=g)


@torch.no_grad()
def pair_elbos(model, items, t, u, ctx=contextlib.nullcontext()):
    """(n_pairs, 2): ELBO estimates of log p(y_w|x) and log p(y_l|x), the mean over the draws of (t, u)."""
    c, dev = model.config, model.model.embed_tokens.weight.device
    out = torch.zeros(len(items), 2)
    for s in range(0, len(items), BATCH):
        ids, plen, resp, real = pair_batch(items[s:s + BATCH], dev)
        B, T = ids.shape
        attn = c.attn if real.all() else attend(c.attn, torch.arange(T, device=dev), real, c.block_size)  # pads hidden
        ok = resp & diffusion.maskable(B, T, c.shift, plen, dev)  # the response only; never position 0 under shift
        for k in range(t.shape[0]):
            tk = t[k, s:s + B // 2].repeat(2).to(dev)  # the same draw for y_w (rows :B/2) and y_l (rows B/2:)
            uk = u[k, s:s + B // 2, :T].repeat(2, 1).to(dev)
            masked = (uk < tk[:, None]) & ok  # P(masked) = t
            with ctx:
                e = diffusion.sequence_elbo(model, ids, masked, tk, attn)  # −Σ_{i∈M} CE_i / t
            out[s:s + B // 2] += torch.stack(e.cpu().chunk(2), 1) / t.shape[0]  # E_{t,M}: the mean over draws
    return out


def rewards(model, W0, delta, items, gammas, *, beta, n_masks, seed, masks="shared", ctx=contextlib.nullcontext()):
    """-> (G, n, 2): the implicit rewards r_γ(x, y) = β (ELBO_γ(y|x) − ELBO_DLM(y|x)) of every pair's chosen and
    rejected response at every γ of the grid; the model is left at W0. Each pair's n_masks ELBO draws (t, M) are
    shared by its chosen and rejected responses. masks="shared": the merged models use the reference DLM's draws
    too (common random numbers; at γ = 0 every reward is exactly 0). "independent": the merged models (every γ,
    γ = 0 included) use draws of their own (seed + 1), so r_0 measures the Monte Carlo noise of a reward."""
    T = max(len(x) + max(len(yw), len(yl)) for x, yw, yl in items)
    ref_masks = draw_masks(len(items), n_masks, T, seed)
    own_masks = ref_masks if masks == "shared" else draw_masks(len(items), n_masks, T, seed + 1)
    ref = pair_elbos(model, items, *ref_masks, ctx)  # ELBO_DLM, computed once
    out = []
    for gamma in tqdm(gammas, desc=f"γ grid, {len(items)} pairs", leave=False):
        apply(model, W0, delta, gamma)
        e = ref if gamma == 0 and masks == "shared" else pair_elbos(model, items, *own_masks, ctx)
        revert(model, W0)
        out.append(beta * (e - ref))  # r_γ(x, y) = β (ELBO_γ(y|x) − ELBO_DLM(y|x))
    return torch.stack(out)


def reward_stats(r, gammas):
    """Per γ, from rewards (G, n, 2): the reward accuracy (the fraction of pairs with r_γ(y_w) > r_γ(y_l)), the mean
    margin r_γ(y_w) − r_γ(y_l) and margin / γ (None at γ = 0), the mean DPO loss, the mean chosen and rejected
    rewards, and the fraction of pairs whose margin has the same sign as at the grid's smallest γ > 0 (first order:
    all of them)."""
    m = r[..., 0] - r[..., 1]  # (G, n) margins
    pos = [k for k, g in enumerate(gammas) if g > 0]
    first = min(pos, key=lambda k: gammas[k]) if pos else None
    mean = m.mean(1).tolist()
    return dict(reward_accuracy=(m > 0).float().mean(1).tolist(), margin=mean,
                margin_per_gamma=[x / g if g else None for x, g in zip(mean, gammas)],
                dpo_loss=(-F.logsigmoid(m)).mean(1).tolist(),  # −log σ(r_γ(x, y_w) − r_γ(x, y_l))
                reward_chosen=r[..., 0].mean(1).tolist(), reward_rejected=r[..., 1].mean(1).tolist(),
                same_sign=None if first is None else (torch.sign(m) == torch.sign(m[first])).float().mean(1).tolist())


def pick_gamma(gammas, stats, *, select="accuracy"):
    """The γ that the statistics of the training pairs (reward_stats) choose; ties go to the smallest γ.
    accuracy (the paper's rule): the highest reward accuracy. With shared masks it is flat in γ up to noise until
        the merge stops being linear in γ, so what it picks among near-equal values is mostly chance.
    dpo (this project's rule, not the paper's): the lowest DPO loss −log σ(r_γ(y_w) − r_γ(y_l)), i.e. DPO's own
        objective, with ELBOs for log π, minimised along the line W_DLM + γ·Δ. The margins grow linearly with γ
        and then bend (the merge's curvature), so its optimum is set by the data, not by ties or noise. It weighs
        the preference only: it does not see what the larger γ costs in likelihood (see reward_chosen)."""
    key = {"accuracy": [-a for a in stats["reward_accuracy"]], "dpo": stats["dpo_loss"]}[select]
    return min(zip(gammas, key), key=lambda gk: (gk[1], gk[0]))[0]


@torch.no_grad()
def completions(model, prompts, tok, seed, ctx):
    """Decoded completions from the DLM's own sampler at temperature 1.0 and confidence threshold 0.9, one seeded
    generator: bidirectional, diffusion_generate (Fast-dLLM, blocks of GEN_BLOCK); block, block_generate. Each
    stops, and is cut, at the first of the checkpoint's end ids (Tokenizer.end_ids)."""
    c, dev, ends = model.config, model.model.embed_tokens.weight.device, tok.end_ids(model.config)
    g, out = torch.Generator(dev).manual_seed(seed), []
    kw = dict(temperature=1.0, threshold=0.9, eos_id=ends, generator=g, vocab_limit=tok.vocab_size)
    for s in tqdm(range(0, len(prompts), BATCH), desc="sampling", leave=False):
        with ctx:
            if c.attn == "block":
                gen = block_generate(model, prompts[s:s + BATCH], -(-GEN_LEN // c.block_size) * c.block_size, **kw)
            else:
                gen = diffusion_generate(model, prompts[s:s + BATCH], GEN_LEN, GEN_BLOCK, GEN_LEN, **kw)
        out += [tok.decode(until_end(r, ends)) for r in gen.generated.tolist()]
    return out


def cmd_merge(args):
    if not 0 < args.density <= 1 or not 0 <= args.drop < 1 or min(args.n_masks, args.n_select) <= 0 or args.samples < 0:
        p.error("need 0 < --density <= 1, 0 <= --drop < 1, --n_masks > 0, --n_select > 0, --samples >= 0")
    if Path(args.pairs).resolve() == Path(args.heldout).resolve():
        raise SystemExit(f"merge: --pairs and --heldout are the same file ({args.pairs}): γ is chosen on training "
                         f"pairs and reported on held-out ones; pass both")
    device, ctx = training.setup(args.device, args.seed)
    handles = open_weights([args.ar, args.ar_aligned, args.dlm])
    model = training.load_model(args.dlm, device, "merge: --dlm").requires_grad_(False).eval()
    c = model.config
    training.require_dlm(c, f"--dlm {args.dlm}", "merge")
    tok = training.load_tokenizer(args.dlm, c)
    train, heldout = read_pairs(args.pairs, tok, SEQ_LEN, "merge"), read_pairs(args.heldout, tok, SEQ_LEN, "merge")
    train = random.Random(args.seed).sample(train, min(args.n_select, len(train)))  # the γ search's sample
    names = [n for n, _ in model.named_parameters()]
    delta = task_deltas(handles[:2], names, method=args.method, density=args.density, drop=args.drop,
                        seed=args.seed, device=device)
    W0 = {n: q.detach().clone() for n, q in model.named_parameters()}  # W_DLM, the one saved copy
    gammas = args.gammas
    score = lambda items: reward_stats(rewards(model, W0, delta, items, gammas, beta=args.beta, n_masks=args.n_masks,
                                               seed=args.seed, masks=args.masks, ctx=ctx), gammas)
    sel = score(train) if len(gammas) > 1 else None  # the selection sees the training pairs only
    best = gammas[0] if sel is None else pick_gamma(gammas, sel, select=args.select)
    held = score(heldout)  # reported per γ; never read by the selection
    print(f"\n{args.method}, {args.masks} masks ({args.n_masks} draws per pair): γ chosen by {args.select} on "
          f"{len(train)} training pairs, reported on {len(heldout)} held-out pairs\n"
          "| γ | train: reward accuracy | train: mean margin | train: DPO loss | held-out: reward accuracy "
          "| held-out: mean margin | held-out: margin / γ |\n|---|---|---|---|---|---|---|")
    for k, g in enumerate(gammas):
        tr = "— | — | —"
        if sel is not None:
            tr = f"{sel['reward_accuracy'][k]:.3f} | {sel['margin'][k]:.4f} | {sel['dpo_loss'][k]:.4f}"
        per = held["margin_per_gamma"][k]
        print(f"| {g:g}{' (chosen)' * (g == best)} | {tr} | {held['reward_accuracy'][k]:.3f} | "
              f"{held['margin'][k]:.4f} | {'—' if per is None else f'{per:.4f}'} |")
    if sel is not None:
        print("γ by each rule: " + ", ".join(f"{k} {pick_gamma(gammas, sel, select=k):g}" for k in SELECTORS))

    out_dir = Path(args.out_dir)
    apply(model, W0, delta, best)
    model.save_pretrained(out_dir)  # the DLM's config (attn, shift, mask token, converted_from) kept
    tok.save_pretrained(out_dir)
    revert(model, W0)
    wins = {}  # γ -> (win rate against the DLM, mean rule score)
    if args.samples:
        prompts = [heldout[k % len(heldout)][0] for k in range(args.samples)]
        base = [rule_score(x) for x in completions(model, prompts, tok, args.seed, ctx)]  # the DLM itself
        for g in tqdm(gammas if args.win_rate_at == "all" else [best], desc="win rate", leave=False):
            apply(model, W0, delta, g)
            mine = [rule_score(x) for x in completions(model, prompts, tok, args.seed, ctx)]  # the same seeds
            revert(model, W0)
            wins[g] = (sum((x > y) + 0.5 * (x == y) for x, y in zip(mine, base)) / len(base),  # ties count half
                       statistics.mean(mine))
        print(f"win rate against the DLM by rule_score (mean score of the DLM {statistics.mean(base):+.3f}), "
              f"{len(base)} held-out prompts, temperature 1.0, threshold 0.9:\n"
              "| γ | win rate | mean score |\n|---|---|---|")
        for g, (w, sc) in wins.items():
            print(f"| {g:g}{' (chosen)' * (g == best)} | {w:.3f} | {sc:+.3f} |")
    res = dict(method=args.method, density=args.density if args.method == "ties" else None,
               drop=args.drop if args.method == "dare" else None, beta=args.beta, n_masks=args.n_masks,
               masks=args.masks, select=args.select, seed=args.seed, gammas=gammas, best_gamma=best,
               chosen_by=None if sel is None else {k: pick_gamma(gammas, sel, select=k) for k in SELECTORS},
               train=dict(pairs=args.pairs, n_pairs=len(train), **(sel or {})),
               heldout=dict(pairs=args.heldout, n_pairs=len(heldout), **held),
               win_rate=wins[best][0] if wins else None, samples=args.samples,
               win_rates=[wins[g][0] if g in wins else None for g in gammas],
               rule_scores=[wins[g][1] if g in wins else None for g in gammas],
               rule_score_dlm=statistics.mean(base) if wins else None,
               ar=args.ar, ar_aligned=args.ar_aligned, dlm=args.dlm)
    atomic_write(out_dir / "merge.json", lambda f: Path(f).write_text(json.dumps(res, indent=2) + "\n"))


if __name__ == "__main__":
    args = p.parse_args()
    dict(pairs=cmd_pairs, spectrum=cmd_spectrum, merge=cmd_merge)[args.cmd](args)
