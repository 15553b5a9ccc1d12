"""
OPDLM: on-policy distillation of a block-diffusion student from the frozen AR teacher (docs/methods.md §3).

    python distill.py --init out/dlm-block --teacher out/ar-tiny --data data/stdlib --out_dir out/distill
    python distill.py ... --policy off     # ablations: random states of its own rollouts (off), of data windows (data)

Per optimizer step, for a batch of prompts (left-padded to P, a multiple of the block size, as block_generate does):
    x0, rounds = block_generate(student, prompts, L(step), record=True)   threshold 0.9, temperature 1.0
    per block b: r_b ~ U{rounds in which block b committed};  xt = x0 with positions of rounds >= r_b masked
    target_i  = p_AR(. | prompt, x0_<i)            one causal teacher forward over [prompt, x0]: logits at i-1
    d_i       = KL(target_i || p_θ(. | prompt, x0_<block(i), xt_block(i)))          (--divergence, --teacher_top_k)
    loss      = mean over sequences of the mean of d_i over its masked, valid i     (--kl_reduction)
valid: before the first end token (--train_eos: and it); L(step): a quarter-cosine ramp (curriculum).
"""
import contextlib
import math
import time

import torch

from diffusion import EVAL_SEED, block_logits
from model import attend, canvas, left_padded
from sample import block_generate, end_list
from lib import cli
from lib import training

p = cli.parser(__doc__)
p.add_argument("--init", default="out/dlm-block", help="the student: a block DLM checkpoint (convert.py --attn block)")
p.add_argument("--teacher", default=None, help="the AR checkpoint (default: the student's config.converted_from)")
p.add_argument("--data", default="data/stdlib", help="prompts are cut from its validation split")
p.add_argument("--prompts", default=None, help="a JSONL of {\"prompt\"} records instead (not with --policy data)")
p.add_argument("--num_prompts", type=int, default=1024, help="size of the prompt pool cut from the data")
p.add_argument("--out_dir", default="out/distill", help="checkpoints, log.jsonl and results.json go here")
p.add_argument("--policy", default="on", choices=["on", "off", "data"], help="the rollouts' own states; random ones; "
               "random ones of data windows")
p.add_argument("--divergence", default="fkl", choices=["fkl", "rkl", "jsd"], help="KL(T || S), KL(S || T) or JSD")
p.add_argument("--kl_reduction", default="seq", choices=["seq", "token"], help="means per sequence first (published)")
p.add_argument("--teacher_top_k", type=int, default=None, help="sparse fkl on the teacher's top-k ids (published: 16)")
p.add_argument("--train_eos", action="store_true", help="also train the position of the first end token")
p.add_argument("--threshold", type=float, default=0.9, help="rollout confidence threshold")
p.add_argument("--temperature", type=float, default=1.0, help="rollout temperature")
p.add_argument("--rollout_min", type=int, default=16, help="curriculum start, tokens (published: 100)")
p.add_argument("--rollout_max", type=int, default=64, help="curriculum end, tokens; the evaluation's (published: 4000)")
p.add_argument("--curriculum_steps", type=int, default=100, help="the ramp's optimizer steps (published: 100)")
cli.add_loop_args(p, frozen="the AR teacher", tasks="--threshold", max_iters=200, batch_size=8, seq_len=32,
                  lr=1e-3, min_lr=1e-4, warmup=5, eval_interval=50, eval_batches=2)


def curriculum(step, lo, hi, steps, bs):
    """Max rollout length at `step`: L = lo + (hi - lo)(1 - cos(π/2 · min(1, step/steps))), to a multiple of bs."""
    frac = 1.0 if steps <= 0 else min(1.0, step / steps)
    L = lo + (hi - lo) * (1 - math.cos(math.pi / 2 * frac))
    return max(bs, round(L / bs) * bs)


def rollout_states(rounds, bs, gen):
    """rounds (B, N) (-1: not generated) -> masked (B, N): per block r_b ~ U{its rounds}; rounds >= r_b masked."""
    B, N = rounds.shape
    r = rounds.view(B, N // bs, bs)
    used = (r[..., None] == torch.arange(bs, device=r.device)).any(2)  # (B, nb, rounds): round k committed here
    u = torch.rand(used.shape, generator=gen, device=gen.device).to(r.device)
    pick = u.masked_fill(~used, -1).argmax(-1)  # uniform over the used rounds (argmax of iid uniforms)
    return ((r >= pick[..., None]) & (r >= 0)).view(B, N)


def random_states(B, N, bs, gen, device):
    """(B, N) bool, random states (--policy off, data): per block k ~ U{1..bs}, a uniform k-subset masked."""
    k = torch.randint(1, bs + 1, (B, N // bs, 1), generator=gen, device=gen.device)
    rank = torch.rand(B, N // bs, bs, generator=gen, device=gen.device).argsort(-1).argsort(-1)
    return (rank < k).view(B, N).to(device)


def valid_positions(gen_tokens, eos_id, train_eos=False):
    """(B, N) bool: generated positions before the first end token (of eos_id), or up to it and it (train_eos)."""
    end = torch.isin(gen_tokens, torch.as_tensor(eos_id, device=gen_tokens.device)).long()  # (B, N)
    return end.cumsum(1) - end * int(train_eos) == 0  # no end token before i, nor at i (but with train_eos)


@torch.no_grad()
def teacher_logits(teacher, x, real, pos, P, sel):
    """(M, V): p_AR(. | prompt, x0_<i) for the positions sel, read at slot P + i - 1 of one causal forward."""
    mask = "causal" if real.all() else attend("causal", torch.arange(x.shape[1], device=x.device), real)
    b, i = sel.nonzero(as_tuple=True)
    return teacher(x, mask, pos=pos, rows=(b, P + i - 1))


def token_divergence(t, s, kind="fkl", top_k=None):
    """Per row (M,): the divergence between teacher logits t and student logits s (M, V); top_k (fkl): the sum
    over the teacher's top-k ids of the full-vocabulary terms, not renormalised (the published sparse KL)."""
    lt, ls = t.float().log_softmax(-1), s.float().log_softmax(-1)
    if top_k:
        if kind != "fkl":
            raise ValueError("a sparse teacher (top_k) goes with the forward KL")
        idx = lt.topk(min(top_k, lt.shape[-1]), -1).indices  # the teacher's k most likely ids
        lt, ls = lt.gather(-1, idx), ls.gather(-1, idx)  # log p_T, log p_θ there: no renormalisation
    pt, ps = lt.exp(), ls.exp()
    if kind == "fkl":
        return (pt * (lt - ls)).sum(-1)  # KL(p_T || p_θ) = Σ_v p_T(v) (log p_T(v) - log p_θ(v))
    if kind == "rkl":
        return (ps * (ls - lt)).sum(-1)  # KL(p_θ || p_T) = Σ_v p_θ(v) (log p_θ(v) - log p_T(v))
    lm = torch.logaddexp(lt, ls) - math.log(2)  # m = (p_T + p_θ) / 2
    return 0.5 * (pt * (lt - lm)).sum(-1) + 0.5 * (ps * (ls - lm)).sum(-1)  # JSD = ½ KL(p_T||m) + ½ KL(p_θ||m)


def reduce_kl(d, rows, B, reduction="seq"):
    """d (M,) per position, rows (M,) their sequences -> the mean over positions (token), or over the sequences
    that have one of each sequence's mean (seq, published)."""
    if reduction == "token":
        return d.sum() / max(1, d.numel())  # (1/M) Σ_i d_i
    n = torch.zeros(B, device=d.device).index_add(0, rows, torch.ones_like(d))  # (B,) positions per sequence
    per_seq = torch.zeros(B, device=d.device).index_add(0, rows, d) / n.clamp(min=1)  # (1/n_b) Σ_{i∈b} d_i
    return per_seq.sum() / (n > 0).sum().clamp(min=1)  # mean over the sequences with n_b > 0


def distill_loss(student, teacher, x, lens, P, masked, *, eos_id, vocab_size, divergence="fkl", top_k=None,
                 reduction="seq", train_eos=False):
    """x (B, P + N): prompts left-padded to P (lens (B,) real tokens), then x0; masked (B, N): the state -> (loss,
    stats): the divergence of the student's denoiser from the teacher at every masked, valid position (ids <
    vocab_size), reduced; stats: kl (the full forward KL), masked (positions trained), rollout_len (mean per row)."""
    B, real, pos = x.shape[0], *left_padded(lens, P, x.shape[1])
    sel = masked & valid_positions(x[:, P:], eos_id, train_eos)  # (B, N)
    t = teacher_logits(teacher, x, real, pos, P, sel)[:, :vocab_size]
    xt = x[:, P:].masked_fill(masked, student.config.mask_token_id)
    # the student's denoiser over [prompt, x0, xt]: a forward per block's worth in one (FlexAttention on CUDA)
    s = block_logits(student, x, xt, sel, P=P, real=real, pos=pos, flex=x.is_cuda)[:, :vocab_size]
    rows = sel.nonzero()[:, 0]
    d = token_divergence(t, s, divergence, top_k)
    kl = d.detach() if divergence == "fkl" and not top_k else token_divergence(t, s.detach())
    resp = valid_positions(x[:, P:], eos_id, True).sum(1).float().mean()
    return reduce_kl(d, rows, B, reduction), dict(kl=reduce_kl(kl, rows, B, reduction),
                                                  masked=torch.tensor(float(d.numel())), rollout_len=resp)


def make_batch(student, items, L, policy, gen, *, eos_id, vocab_limit, pad_id=None, threshold=0.9, temperature=1.0):
    """items [(prompt ids, continuation ids)] -> x (B, P + L) [prompts, x0], lens (B,), P, masked (B, L), stats. x0:
    the student's rollout (on: a state of its trajectory; off: masked at random) or the data's (padded; at random)."""
    bs, prompts = student.config.block_size, [ids for ids, _ in items]
    if policy == "data":
        pad = end_list(eos_id)[0] if pad_id is None else pad_id
        x, lens, P, _, _ = canvas(student, prompts, L, pad, pad, multiple=bs)
        for b, (_, tail) in enumerate(items):
            x[b, P:P + min(L, len(tail))] = torch.as_tensor(tail[:L], device=x.device)
        return x, lens, P, random_states(len(items), L, bs, gen, x.device), {}
    was_training = student.training
    g = block_generate(student.eval(), prompts, L, bs, threshold=threshold, temperature=temperature, record=True,
                       eos_id=eos_id, generator=gen, vocab_limit=vocab_limit)
    student.train(was_training)
    x = g.tokens
    masked = rollout_states(g.rounds, bs, gen) if policy == "on" else random_states(len(items), L, bs, gen, x.device)
    return x, g.prompt_lens, g.start, masked, dict(tokens_per_forward=g.tokens_per_forward.mean().item(), nfe=g.nfe)


@torch.no_grad()
def evaluate(student, teacher, items, L, *, batch_size, eos_id, vocab_size, pad_id=None, threshold=0.9,
             temperature=1.0, ctx=None, seed=EVAL_SEED):
    """The forward KL from the teacher at length L on fixed prompts `items`: val_kl on the student's own rollouts
    (a fixed seed) at its own states, with val_tokens_per_forward there; val_kl_data on the real continuations
    under fixed random masks, the same states for every model (only when every item has a continuation)."""
    dev, n = student.lm_head.weight.device, len(items)
    policies = ["on", "data"] if all(tail for _, tail in items) else ["on"]  # "data": the real continuations
    gens = {k: torch.Generator(dev).manual_seed(seed) for k in policies}
    kl, tpf = dict.fromkeys(policies, 0.0), 0.0
    for k in range(0, n, batch_size):
        batch = items[k:k + batch_size]
        for policy in policies:
            with ctx or contextlib.nullcontext():
                x, lens, P, masked, st = make_batch(student, batch, L, policy, gens[policy], eos_id=eos_id,
                                                    vocab_limit=vocab_size, pad_id=pad_id, threshold=threshold,
                                                    temperature=temperature)
                loss_kl = distill_loss(student, teacher, x, lens, P, masked, eos_id=eos_id, vocab_size=vocab_size)
            kl[policy] += loss_kl[1]["kl"].item() * len(batch)
            tpf += st.get("tokens_per_forward", 0.0) * len(batch)
    res = dict(val_kl=kl["on"] / n, val_tokens_per_forward=tpf / n)
    return res if "data" not in kl else dict(res, val_kl_data=kl["data"] / n)

if __name__ == "__main__":
    args = cli.parse_loop_args(p)
    if not 0 < args.rollout_min <= args.rollout_max or args.curriculum_steps < 0 or args.num_prompts <= 0:
        p.error("need 0 < --rollout_min <= --rollout_max, --curriculum_steps >= 0, --num_prompts > 0")
    if args.teacher_top_k is not None and (args.teacher_top_k <= 0 or args.divergence != "fkl"):
        p.error("--teacher_top_k must be positive and goes with --divergence fkl")
    if args.policy == "data" and args.prompts:
        p.error("--policy data takes x0 from the data: it cannot use --prompts")
    run = training.Run(args, "distill", generator="device")  # its generator: prompts, rollouts, states
    device, ctx = run.device, run.ctx
    student = run.start(lambda: training.load_model(args.init, device, "distill: student"))
    c = student.config
    training.require_dlm(c, args.init, "distill", "block")
    teacher = training.load_teacher(args.teacher, student, device, "distill", dtype=run.frozen_dtype)
    tok = training.load_tokenizer(args.init if not args.resume else run.out_dir, c)
    pool = run.prompt_pool(tok, args.rollout_max, prompts=args.prompts, data_dir=args.data, n=args.num_prompts,
                           like=student)
    # --compile: dynamic shapes, as the curriculum changes the length every step (one graph per kind of call)
    student = run.prepare(student, compile_too=[teacher], dynamic=True)
    eval_items = pool[:args.eval_batches * args.batch_size]
    ends = tok.end_ids(c)  # every end id the student declares: rollouts stop at any, the loss ends at the first

    def run_eval():  # at the final length --rollout_max; --tasks: exact match, by eval.py, at --threshold
        return dict(evaluate(student, teacher, eval_items, args.rollout_max, batch_size=args.batch_size, ctx=ctx,
                             vocab_size=tok.vocab_size, eos_id=ends, pad_id=tok.eos_id, temperature=args.temperature,
                             threshold=args.threshold), **training.task_eval(run, student, tok))
    print(f"student: {student.num_params() / 1e6:.2f}M parameters, block {c.block_size}, shift={c.shift}; teacher "
          f"{teacher.config.path} ({str(teacher.lm_head.weight.dtype).removeprefix('torch.')}); {len(pool)} prompts")

    def draw():  # a micro-batch's prompts and rollout seed: drawn on every rank
        pick = torch.randint(len(pool), (args.batch_size,), generator=run.gen, device=run.gen.device).tolist()
        return pick, torch.randint(2 ** 62, (1,), generator=run.gen, device=run.gen.device).item()

    for step in run.steps():
        L = curriculum(step, args.rollout_min, args.rollout_max, args.curriculum_steps, c.block_size)
        t_roll = 0.0
        for pick, seed in run.micro_batches(draw):
            g = torch.Generator(device).manual_seed(seed)  # this micro-batch's rollout and states, on any rank
            t1 = time.time()
            with ctx:
                x, lens, P, masked, st = make_batch(student, [pool[j] for j in pick], L, args.policy, g,
                                                    eos_id=ends, vocab_limit=tok.vocab_size, pad_id=tok.eos_id,
                                                    threshold=args.threshold, temperature=args.temperature)
            t_roll += time.time() - t1
            with ctx:
                loss, s = distill_loss(student, teacher, x, lens, P, masked, eos_id=ends, vocab_size=tok.vocab_size,
                                       divergence=args.divergence, top_k=args.teacher_top_k,
                                       reduction=args.kl_reduction, train_eos=args.train_eos)
            n = x.shape[0] * (x.shape[1] - P)  # the tokens rolled out and trained
            run.backward(loss, {k: float(v) for k, v in {**s, **st, "loss": loss.detach()}.items()}, tokens=n,
                         flops=training.flops_per_token(student, x.shape[1], forward_only=teacher) * n)
        rec = run.update()
        rec.update(max_len=L, rollout_share=t_roll / rec["step_seconds"])
        if run.eval_due():
            rec.update(run.evaluate(run_eval))
        if run.save_due():
            run.save(student, tok)
        run.snapshot(student, tok)
        run.log(rec, kl=f"{rec['kl']:.3f}", L=L, tpf=f"{rec.get('tokens_per_forward', 0):.2f}",
                val_kl=f"{run.last_eval.get('val_kl', float('nan')):.3f}")

    final = run.final(run_eval)
    print("\nfinal eval: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
    run.results(dict(**final, eval_len=args.rollout_max, steps=args.max_iters, policy=args.policy,
                     divergence=args.divergence, kl_reduction=args.kl_reduction))  # and the run's timing
