"""
OPDLM: on-policy distillation of a block-diffusion student from the frozen AR teacher (methods.md §3).

    python distill.py --init out/dlm-block --teacher out/ar-tiny --data data/stdlib --out_dir out/distill
    python distill.py ... --policy off        # the ablation: random masks of data instead of the student's rollouts

Per iteration, for a batch of prompts (left-padded to P, a multiple of the block size, as block_generate does):
    x0, rounds = block_generate(student, prompts, L(step), record=True)   threshold 0.9, temperature 1.0
    per block b: r_b ~ U{rounds in which block b committed};  xt = x0 with positions of rounds >= r_b masked
    target_i  = p_AR(. | prompt, x0_<i)            one causal teacher forward over [prompt, x0]: logits at i-1
    loss      = mean over masked, valid i of KL(target_i || p_θ(. | prompt, x0_<block(i), xt_block(i)))
valid: generated positions before the first end-of-sequence token (--train_eos: up to and including it).
L(step) ramps from --rollout_min to --rollout_max over --curriculum_steps (cosine), a multiple of the block size.

What is notable here:
- Vectorised training (BD3-LM): one student forward over [prompt, x0, xt] of length P + 2N under the rule
  of `train_rule`: the clean stream [prompt, x0] is block-causal, the noisy copy of block b sees the clean
  blocks < b and itself; its RoPE positions are those of the clean copy. `per_block_logits` is the
  one-forward-per-block reference it is tested equal to.
- The rule is stated once, as a FlexAttention mask_mod. On CUDA `train_mask` turns it into a BlockMask
  (create_block_mask) and the model runs flex_attention: no (B, 1, T, T) mask lives through the forward and
  backward, and 128 x 128 tiles the rule hides are skipped. On CPU (flex_attention has no backward there) the
  same mask_mod, evaluated on the index grid, is the dense bool mask handed to SDPA.
- --compile marks the shapes dynamic (torch.compile(dynamic=True)): the curriculum changes the length every
  step (a rollout ending early at eos keeps its length, eos-filled), and with symbolic lengths one graph per
  kind of call (rollout forward, training forward with and without grad, teacher forward) serves them all.
  torch's default compiles the first length statically and then recompiles, several graphs on the one code
  object (Qwen3Model.forward, shared by student and teacher) whose recompile limit is 8; padding to length
  buckets would also bound the graphs, at the cost of padded compute.
- The shift convention (config.shift): unshifted, position i is read at the noisy slot i; shifted, at i-1,
  which for the first position of a block is the clean copy's last slot of the previous block (exactly
  what the sampler and the per-block reference read there).
- lm_head runs only on the rows that carry the loss; divergences are taken over the tokenizer's ids only
  (the ids the sampler can emit). --seq_len is the prompt length in tokens; --eval_interval the
  checkpoint (and fixed-prompt evaluation) interval.
"""
import argparse
import json
import math
import time
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import create_block_mask
from tqdm import tqdm

import data
import training
from sample import attend, block_generate, prepare

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--init", default="out/dlm-block", help="the student: a block DLM checkpoint (convert.py --attn block)")
p.add_argument("--teacher", default=None, help="the AR checkpoint (default: the student's config.converted_from)")
p.add_argument("--data", default="data/stdlib", help="prompts are cut from its validation split")
p.add_argument("--prompts", default=None, help="a JSONL of {\"prompt\"} records instead (on-policy only)")
p.add_argument("--num_prompts", type=int, default=1024, help="size of the prompt pool cut from the data")
p.add_argument("--out_dir", default="out/distill")
p.add_argument("--policy", default="on", choices=["on", "off"], help="off: random masks of data windows (ablation)")
p.add_argument("--divergence", default="fkl", choices=["fkl", "rkl", "jsd"])
p.add_argument("--teacher_top_k", type=int, default=None, help="sparse fkl over the teacher's top-k ids (paper: 16)")
p.add_argument("--train_eos", action="store_true", help="also train the position of the first eos")
p.add_argument("--threshold", type=float, default=0.9, help="rollout confidence threshold")
p.add_argument("--temperature", type=float, default=1.0, help="rollout temperature")
p.add_argument("--rollout_min", type=int, default=16, help="curriculum start (published: 100)")
p.add_argument("--rollout_max", type=int, default=64, help="curriculum end (published: 4000)")
p.add_argument("--curriculum_steps", type=int, default=100, help="cosine ramp length (published: 100)")
training.add_loop_args(p, max_iters=200, batch_size=8, seq_len=32, lr=1e-3, min_lr=1e-4, warmup=5,
                       eval_interval=50, eval_batches=2)
EVAL_SEED = 1234


def curriculum(step, lo, hi, steps, bs):
    """Max rollout length at `step`: L = lo + (hi - lo)(1 - cos(π min(1, step/steps)))/2, rounded to a multiple of bs."""
    frac = 1.0 if steps <= 0 else min(1.0, step / steps)
    L = lo + (hi - lo) * (1 - math.cos(math.pi * frac)) / 2
    return max(bs, round(L / bs) * bs)


def rollout_states(rounds, bs, gen):
    """rounds (B, N) (-1: never generated) -> masked (B, N): per block one round r_b drawn uniformly among the
    rounds in which the block committed something; the positions committed at rounds >= r_b are masked."""
    B, N = rounds.shape
    r = rounds.view(B, N // bs, bs)
    used = (r[..., None] == torch.arange(bs, device=r.device)).any(2)  # (B, nb, rounds): round k committed here
    u = torch.rand(used.shape, generator=gen, device=gen.device).to(r.device)
    pick = u.masked_fill(~used, -1).argmax(-1)  # uniform over the used rounds (argmax of iid uniforms)
    return ((r >= pick[..., None]) & (r >= 0)).view(B, N)


def random_states(B, N, bs, gen, device):
    """Off-policy: per block k ~ U{1..bs} positions, a uniformly random k-subset, are masked."""
    k = torch.randint(1, bs + 1, (B, N // bs, 1), generator=gen, device=gen.device)
    rank = torch.rand(B, N // bs, bs, generator=gen, device=gen.device).argsort(-1).argsort(-1)
    return (rank < k).view(B, N).to(device)


def valid_positions(gen_tokens, eos_id, train_eos=False):
    """(B, N) bool: generated positions before the first eos (or up to it, train_eos); pads never get here."""
    seen = (gen_tokens == eos_id).long().cumsum(1)
    return seen - (gen_tokens == eos_id).long() * int(train_eos) == 0


def layout(lens, P, L):
    """-> real (B, L) (slot holds a token, not a left pad) and RoPE positions (B, L), as sample.prepare."""
    rel = torch.arange(L, device=lens.device) - (P - lens)[:, None]
    return rel >= 0, rel.clamp(min=0)


def train_rule(real, N, bs):
    """The attention rule over [prompt, x0, xt] (T = L + N slots, L = P + N, P a multiple of bs) as a FlexAttention
    mask_mod: rule(b, h, q, k) says whether query slot q of row b may attend to key slot k. Clean slot (< L):
    block-causal over the clean stream. Noisy slot of block g: the clean blocks < g and the noisy slots of block g.
    Left pads are hidden from every query; a slot always sees itself (so a pad query has a key)."""
    L = real.shape[1]
    key_real = torch.cat([real, real.new_ones(real.shape[0], N)], 1)  # (B, T): the noisy copy has no pads

    def rule(b, h, q, k):
        q_noisy, k_noisy = q >= L, k >= L
        q_blk = torch.where(q_noisy, q - N, q) // bs  # the noisy copy lives in the same blocks as the clean one
        k_blk = torch.where(k_noisy, k - N, k) // bs
        m = torch.where(q_noisy, torch.where(k_noisy, k_blk == q_blk, k_blk < q_blk), ~k_noisy & (k_blk <= q_blk))
        return (m & key_real[b, k]) | (q == k)
    return rule


def train_mask(real, N, bs, flex=False):
    """The rule of `train_rule` as a FlexAttention BlockMask (flex: only the allowed blocks are computed, no
    (T, T) tensor is kept) or as a dense (B, 1, T, T) bool tensor: the rule evaluated on the index grid."""
    B, T, dev = real.shape[0], real.shape[1] + N, real.device
    if flex:
        return create_block_mask(train_rule(real, N, bs), B, None, T, T, device=dev)
    i = torch.arange(T, device=dev)
    return train_rule(real, N, bs)(torch.arange(B, device=dev)[:, None, None, None], None, i[:, None], i)


def student_logits(student, x, xt, real, pos, P, sel, flex=None):
    """Vectorised: logits (M, V) for the positions sel (B, N) (row-major), one forward over [prompt, x0, xt].
    flex (default: on CUDA): attend through a FlexAttention BlockMask instead of the dense mask."""
    B, L = x.shape
    N, bs, shift = L - P, student.config.block_size, int(student.config.shift)
    mask = train_mask(real, N, bs, flex=x.is_cuda if flex is None else flex)
    h = student.model(torch.cat([x, xt], 1), mask, None, False, torch.cat([pos, pos[:, P:]], 1))[0]
    b, i = sel.nonzero(as_tuple=True)
    first = (i % bs == 0) & bool(shift)  # shifted, a block's first position is read at the clean slot P + i - 1
    rows = torch.where(first, P + i - 1, L + i - shift)
    return student.lm_head(h[b, rows])


def per_block_logits(student, x, xt, real, pos, P, sel):
    """Reference (tests, bench): one forward per block b on [prompt, x0_<b, xt_b] under the plain block rule."""
    B, L = x.shape
    bs, shift = student.config.block_size, int(student.config.shift)
    out = torch.zeros(sel.shape + (student.config.vocab_size,), device=x.device)
    for g in range((L - P) // bs):
        s, e = P + g * bs, P + (g + 1) * bs
        idx = torch.cat([x[:, :s], xt[:, s - P:e - P]], 1)
        logits = student(idx, attn=attend("block", torch.arange(e, device=x.device), real[:, :e], bs), pos=pos[:, :e])
        out[:, s - P:e - P] = logits[:, s - shift:e - shift].float()  # slot i - shift predicts slot i
    return out[sel]


@torch.no_grad()
def teacher_logits(teacher, x, real, pos, P, sel):
    """(M, V): p_AR(. | prompt, x0_<i) for the positions sel, read at slot P + i - 1 of one causal forward."""
    mask = "causal" if real.all() else attend("causal", torch.arange(x.shape[1], device=x.device), real)
    h = teacher.model(x, mask, None, False, pos)[0]
    b, i = sel.nonzero(as_tuple=True)
    return teacher.lm_head(h[b, P + i - 1])


def divergence(t, s, kind="fkl", top_k=None):
    """Per row (M,): the divergence between teacher logits t and student logits s (M, V)."""
    lt, ls = t.float().log_softmax(-1), s.float().log_softmax(-1)
    if top_k:  # sparse: teacher renormalised over its top-k ids, student's full log-probs at those ids
        idx = t.topk(min(top_k, t.shape[-1]), -1).indices
        lt, ls = t.float().gather(-1, idx).log_softmax(-1), ls.gather(-1, idx)
    pt, ps = lt.exp(), ls.exp()
    if kind == "fkl":
        return (pt * (lt - ls)).sum(-1)  # KL(p_T || p_θ) = Σ_v p_T(v) (log p_T(v) - log p_θ(v))
    if kind == "rkl":
        return (ps * (ls - lt)).sum(-1)  # KL(p_θ || p_T) = Σ_v p_θ(v) (log p_θ(v) - log p_T(v))
    lm = torch.logaddexp(lt, ls) - math.log(2)  # m = (p_T + p_θ) / 2
    return 0.5 * (pt * (lt - lm)).sum(-1) + 0.5 * (ps * (ls - lm)).sum(-1)  # JSD = ½ KL(p_T||m) + ½ KL(p_θ||m)


def make_batch(student, items, L, args, gen, tok, policy):
    """-> x (B, P + L) [left-padded prompt, x0], prompt lens (B,), P, masked (B, L), rollout stats."""
    bs, prompts = student.config.block_size, [ids for ids, _ in items]
    if policy == "on":
        g = block_generate(student, prompts, L, bs, args.threshold, args.temperature, record=True, eos_id=tok.eos_id,
                           generator=gen, vocab_limit=tok.vocab_size)
        r = g.rounds.view(len(items), -1, bs)
        nfe = (r.max(-1).values + 1).sum()  # forwards each row needed: its rounds per block
        stats = dict(tokens_per_forward=((r >= 0).sum() / nfe.clamp(min=1)).item(), nfe=g.nfe)
        return g.tokens, g.prompt_lens, g.start, rollout_states(g.rounds, bs, gen), stats
    x, lens, P, _, _ = prepare(student, prompts, L, tok.eos_id, tok.eos_id, multiple=bs)
    for b, (_, tail) in enumerate(items):
        x[b, P:P + min(L, len(tail))] = torch.as_tensor(tail[:L], device=x.device)
    return x, lens, P, random_states(len(items), L, bs, gen, x.device), {}


def distill_loss(student, teacher, x, lens, P, masked, args, tok, vectorised=True):
    """-> (loss, stats): the divergence averaged over the masked, valid positions."""
    real, pos = layout(lens, P, x.shape[1])
    sel = masked & valid_positions(x[:, P:], tok.eos_id, args.train_eos)
    t = teacher_logits(teacher, x, real, pos, P, sel)[:, :tok.vocab_size]
    xt = x[:, P:].masked_fill(masked, student.config.mask_token_id)
    s = (student_logits if vectorised else per_block_logits)(student, x, xt, real, pos, P, sel)[:, :tok.vocab_size]
    d = divergence(t, s, args.divergence, args.teacher_top_k)
    n = max(1, d.numel())
    kl = d if args.divergence == "fkl" and not args.teacher_top_k else divergence(t, s.detach())
    resp = valid_positions(x[:, P:], tok.eos_id, True).sum(1).float().mean()
    return d.sum() / n, dict(kl=kl.detach().sum() / n, masked=torch.tensor(float(d.numel())), rollout_len=resp)


def prompt_pool(args, tok, span):
    """[(prompt ids, continuation ids)]: from --prompts (no continuation), or windows of the val documents."""
    if args.prompts:
        return [(tok.encode(r["prompt"])[-args.seq_len:], []) for r in data.read_prompts(args.prompts)]
    pool = []
    for doc in data.documents(data.load_split(args.data, "val"), tok.eos_id):
        for o in range(0, len(doc) - args.seq_len, args.seq_len + span):
            pool.append((doc[o:o + args.seq_len].tolist(), doc[o + args.seq_len:o + args.seq_len + span].tolist()))
    stride = max(1, len(pool) // args.num_prompts)  # spread over all documents
    return pool[::stride][:args.num_prompts]


@torch.no_grad()
def evaluate(student, teacher, items, args, tok, ctx, device):
    """On-policy KL and tokens per forward on fixed prompts, fixed seed, length --rollout_min (any --policy)."""
    gen, kl, tpf = torch.Generator(device).manual_seed(EVAL_SEED), 0.0, 0.0
    L = curriculum(0, args.rollout_min, args.rollout_max, args.curriculum_steps, student.config.block_size)
    batches = [items[k:k + args.batch_size] for k in range(0, len(items), args.batch_size)]
    student.eval()
    for batch in batches:
        with ctx:
            x, lens, P, masked, st = make_batch(student, batch, L, args, gen, tok, "on")
            kl += distill_loss(student, teacher, x, lens, P, masked, args, tok)[1]["kl"].item() / len(batches)
        tpf += st["tokens_per_forward"] / len(batches)
    student.train()
    return dict(val_kl=kl, val_tokens_per_forward=tpf)


if __name__ == "__main__":
    args = training.parse_loop_args(p)
    if not 0 < args.rollout_min <= args.rollout_max or args.curriculum_steps < 0 or args.num_prompts <= 0:
        p.error("need 0 < --rollout_min <= --rollout_max, --curriculum_steps >= 0, --num_prompts > 0")
    if args.teacher_top_k is not None and (args.teacher_top_k <= 0 or args.divergence != "fkl"):
        p.error("--teacher_top_k must be positive and goes with --divergence fkl")
    if args.policy == "off" and args.prompts:
        p.error("--policy off takes x0 from the data: it cannot use --prompts")
    device, ctx = training.setup(args.device, args.seed)
    out_dir = Path(args.out_dir)
    gen = torch.Generator(device).manual_seed(args.seed)  # prompts, rollouts, states: all randomness
    student, state, start = training.resume_or_start(out_dir, args.resume, device, gen,
                                                     lambda: training.load_model(args.init, device, "distill: student"))
    c = student.config
    if c.attn != "block" or not c.block_size or c.mask_token_id is None or c.shift is None:
        raise SystemExit(f"distill: {args.init} is not a block DLM (attn={c.attn!r}, block_size={c.block_size}); make one "
                         f"with: python convert.py --ar AR_DIR --out_dir DLM_DIR --attn block --block_size 4")
    teacher = training.load_model(args.teacher or c.converted_from, device, "distill: teacher").requires_grad_(False).eval()
    if teacher.config.vocab_size != c.vocab_size:
        raise SystemExit("distill: the teacher and the student have different vocabularies")
    tok = training.load_tokenizer(args.init if not args.resume else out_dir, c)
    try:
        pool = prompt_pool(args, tok, args.rollout_max)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"distill: {e}")
    if not pool:
        raise SystemExit("distill: no prompts (the documents are shorter than --seq_len?)")
    student.model.gradient_checkpointing = args.grad_checkpoint
    opt = training.optimizer(student, args, device, state)
    if args.compile:  # dynamic shapes: one graph serves every length of the curriculum (module docstring)
        student.model.compile(dynamic=True)
        teacher.model.compile(dynamic=True)
    eval_items = pool[:args.eval_batches * args.batch_size]
    log = training.Log(out_dir, args.resume)
    print(f"student: {student.num_params() / 1e6:.2f}M parameters, block {c.block_size}, shift={c.shift}; teacher "
          f"{args.teacher or c.converted_from}; {len(pool)} prompts; policy {args.policy}, {args.divergence}; device {device}")

    bar = tqdm(range(start, args.max_iters), initial=start, total=args.max_iters, desc="distill")
    last_eval, t_start = {}, time.time()
    for step in bar:
        t0 = time.time()
        lr = training.set_lr(opt, step, args)
        L = curriculum(step, args.rollout_min, args.rollout_max, args.curriculum_steps, c.block_size)
        stats, t_roll, n_tok = {}, 0.0, 0
        for _ in range(args.grad_accum):
            pick = torch.randint(len(pool), (args.batch_size,), generator=gen, device=gen.device).tolist()
            t1 = time.time()
            student.eval()
            with ctx:
                x, lens, P, masked, st = make_batch(student, [pool[k] for k in pick], L, args, gen, tok, args.policy)
            student.train()
            t_roll += time.time() - t1
            with ctx:
                loss, s = distill_loss(student, teacher, x, lens, P, masked, args, tok)
            (loss / args.grad_accum).backward()
            n_tok += x.shape[0] * (x.shape[1] - P)
            for k, v in {**s, **st}.items():
                stats[k] = stats.get(k, 0) + float(v) / args.grad_accum
        training.check_finite(loss, step, out_dir)
        norm = torch.nn.utils.clip_grad_norm_(student.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.time() - t0
        rec = dict(step=step, loss=loss.item(), **stats, max_len=L, lr=lr, grad_norm=norm.item(),
                   tokens_per_s=n_tok / dt, rollout_share=t_roll / dt)
        if step % args.eval_interval == 0 or step == args.max_iters - 1:
            last_eval = dict(step=step, **evaluate(student, teacher, eval_items, args, tok, ctx, device))
            rec.update({k: v for k, v in last_eval.items() if k != "step"})
            training.save_checkpoint(out_dir, student, tok, opt, step, gen, extra=vars(args))
        log(**rec)
        bar.set_postfix(kl=f"{rec['kl']:.3f}", L=L, tpf=f"{rec.get('tokens_per_forward', 0):.2f}",
                        val_kl=f"{last_eval.get('val_kl', float('nan')):.3f}")

    final = last_eval if last_eval.get("step") == args.max_iters - 1 else evaluate(student, teacher, eval_items, args, tok, ctx, device)
    final = {k: v for k, v in final.items() if k != "step"}
    print("\nfinal eval: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
    (out_dir / "results.json").write_text(json.dumps(dict(**final, steps=args.max_iters, policy=args.policy,
                                                          divergence=args.divergence, seconds=time.time() - t_start), indent=2) + "\n")
