"""
OPDLM: on-policy distillation of a block-diffusion student from the frozen AR teacher (docs/methods.md §3).

    python distill.py --init out/dlm-block --teacher out/ar-tiny --data data/stdlib --out_dir out/distill
    python distill.py ... --policy off     # ablation: the student's own rollouts, masked at random (other states)
    python distill.py ... --policy data    # ablation: data windows, masked at random (other content and states)

Per optimizer step, for a batch of prompts (left-padded to P, a multiple of the block size, as block_generate does):
    x0, rounds = block_generate(student, prompts, L(step), record=True)   threshold 0.9, temperature 1.0
    per block b: r_b ~ U{rounds in which block b committed};  xt = x0 with positions of rounds >= r_b masked
    target_i  = p_AR(. | prompt, x0_<i)            one causal teacher forward over [prompt, x0]: logits at i-1
    d_i       = KL(target_i || p_θ(. | prompt, x0_<block(i), xt_block(i)))          (--divergence, --teacher_top_k)
    loss      = mean over sequences of the mean of d_i over its masked, valid i    (--kl_reduction seq; token: the
                mean over all masked, valid i of the batch)
valid: generated positions before the first end token (--train_eos: up to and including it): any of the ids
Tokenizer.end_ids lists for the student (an instruct Qwen3 declares <|im_end|> and <|endoftext|>), at which a
rollout stops too.
L(step) = L_min + (L_max - L_min)(1 - cos(π/2 · min(1, step / --curriculum_steps))), rounded to a multiple of the
block size: a quarter-cosine ramp over optimizer steps, each on one rollout batch of --batch_size prompts (the
published code counts rollout steps of 128 prompts, each followed by about 16 optimizer updates).

What is notable here:
- The student's logits at the masked positions are, by definition, one forward per block b over
  [prompt, x0_<b, xt_b] under the plain block rule (diffusion.per_block_logits); training uses the same in one
  forward over [prompt, x0, xt] (diffusion.block_logits, BD3-LM's vectorised training, on CUDA through a
  FlexAttention BlockMask): the attention rule eval.py's block likelihood uses too.
- --policy: on, the published method; off, the published ablation (the same kind of rollouts, but random states:
  per block k ~ U{1..block} of its positions masked, a uniformly random k-subset), which isolates the claim
  "states from the sampler's trajectory beat random states"; data, random states of data windows.
- The sparse teacher (--teacher_top_k, published 16): Σ_{v∈top-k} p_T(v) (log p_T(v) - log p_θ(v)), both
  full-vocabulary log-softmaxes read at the teacher's top-k ids, NOT renormalised (as the published code).
- Each micro-batch's prompts and rollout seed are drawn from the run's generator, and its rollout and states
  from a generator of that seed: under torchrun every rank draws them all and rolls out its own micro-batches,
  which are the ones one process would roll out.
- lm_head runs only on the rows that carry the loss; divergences are taken over the tokenizer's ids only
  (the ids the sampler can emit). --seq_len is the prompt length in tokens; --eval_interval the
  checkpoint (and fixed-prompt evaluation) interval. The evaluation (evaluate), at the final length
  --rollout_max from fixed prompts: val_kl, the forward KL on the student's own rollouts (fixed seed), and each
  row's tokens per forward there (its generated positions / Σ over its blocks of (its last round + 1));
  val_kl_data, the forward KL on fixed random block masks of the prompts' real continuations: the same states
  for every model, so the number to compare models and policies by (val_kl scores each on its own text).
"""
import contextlib
import math
import time

import torch

import cli
import data
import tasks
import training
from diffusion import EVAL_SEED, block_logits, per_block_logits
from model import attend, left_padded
from sample import block_generate, end_list, prepare

p = cli.parser(__doc__)
p.add_argument("--init", default="out/dlm-block", help="the student: a block DLM checkpoint (convert.py --attn block)")
p.add_argument("--teacher", default=None, help="the AR checkpoint (default: the student's config.converted_from)")
p.add_argument("--data", default="data/stdlib", help="prompts are cut from its validation split")
p.add_argument("--prompts", default=None, help="a JSONL of {\"prompt\"} records instead (not with --policy data)")
p.add_argument("--num_prompts", type=int, default=1024, help="size of the prompt pool cut from the data")
p.add_argument("--out_dir", default="out/distill", help="checkpoints, log.jsonl and results.json go here")
p.add_argument("--policy", default="on", choices=["on", "off", "data"],
               help="on: states of the student's rollouts; off: random masks of its rollouts; data: of data windows")
p.add_argument("--divergence", default="fkl", choices=["fkl", "rkl", "jsd"],
               help="KL(teacher || student), KL(student || teacher), or Jensen-Shannon")
p.add_argument("--kl_reduction", default="seq", choices=["seq", "token"],
               help="seq (published): mean per sequence over its positions, then over sequences; token: over all")
p.add_argument("--teacher_top_k", type=int, default=None,
               help="sparse fkl over the teacher's top-k ids, not renormalised (published: 16)")
p.add_argument("--train_eos", action="store_true", help="also train the position of the first end token")
tasks.add_eval_args(p, "--threshold")
p.add_argument("--threshold", type=float, default=0.9, help="rollout confidence threshold")
p.add_argument("--temperature", type=float, default=1.0, help="rollout temperature")
p.add_argument("--rollout_min", type=int, default=16, help="curriculum start, tokens (published: 100)")
p.add_argument("--rollout_max", type=int, default=64, help="curriculum end, tokens; the evaluation's length "
               "(published: 4000)")
p.add_argument("--curriculum_steps", type=int, default=100, help="quarter-cosine ramp length in optimizer steps, one "
               "rollout batch each (published: 100 rollout steps of 128 prompts, ~16 optimizer updates each)")
training.add_loop_args(p, frozen="the AR teacher", max_iters=200, batch_size=8, seq_len=32, lr=1e-3, min_lr=1e-4,
                       warmup=5, eval_interval=50, eval_batches=2)


def curriculum(step, lo, hi, steps, bs):
    """Max rollout length at `step`: L = lo + (hi - lo)(1 - cos(π/2 · min(1, step/steps))), to a multiple of bs."""
    frac = 1.0 if steps <= 0 else min(1.0, step / steps)
    L = lo + (hi - lo) * (1 - math.cos(math.pi / 2 * frac))
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
    """Random states (--policy off, data): per block k ~ U{1..bs} positions, a uniformly random k-subset, masked."""
    k = torch.randint(1, bs + 1, (B, N // bs, 1), generator=gen, device=gen.device)
    rank = torch.rand(B, N // bs, bs, generator=gen, device=gen.device).argsort(-1).argsort(-1)
    return (rank < k).view(B, N).to(device)


def valid_positions(gen_tokens, eos_id, train_eos=False):
    """(B, N) bool: generated positions before the first end token (eos_id: an id or several, any of them ends a
    row), or up to and including it (train_eos); pads never get here."""
    end = torch.isin(gen_tokens, torch.as_tensor(eos_id, device=gen_tokens.device)).long()  # (B, N)
    return end.cumsum(1) - end * int(train_eos) == 0  # no end token before i, nor at i (but with train_eos)


@torch.no_grad()
def teacher_logits(teacher, x, real, pos, P, sel):
    """(M, V): p_AR(. | prompt, x0_<i) for the positions sel, read at slot P + i - 1 of one causal forward."""
    mask = "causal" if real.all() else attend("causal", torch.arange(x.shape[1], device=x.device), real)
    b, i = sel.nonzero(as_tuple=True)
    return teacher(x, mask, pos=pos, rows=(b, P + i - 1))


def token_divergence(t, s, kind="fkl", top_k=None):
    """Per row (M,): the divergence between teacher logits t and student logits s (M, V). top_k (fkl only): the
    sum over the teacher's top-k ids of the full-vocabulary terms, not renormalised (the published sparse KL)."""
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
    """d (M,) per position, rows (M,) the sequence of each -> scalar. token: the mean over the M positions; seq
    (published): each sequence's mean over its positions, then the mean over the sequences that have one."""
    if reduction == "token":
        return d.sum() / max(1, d.numel())  # (1/M) Σ_i d_i
    n = torch.zeros(B, device=d.device).index_add(0, rows, torch.ones_like(d))  # (B,) positions per sequence
    per_seq = torch.zeros(B, device=d.device).index_add(0, rows, d) / n.clamp(min=1)  # (1/n_b) Σ_{i∈b} d_i
    return per_seq.sum() / (n > 0).sum().clamp(min=1)  # mean over the sequences with n_b > 0


def distill_loss(student, teacher, x, lens, P, masked, *, eos_id, vocab_size, divergence="fkl", top_k=None,
                 reduction="seq", train_eos=False, vectorised=True):
    """-> (loss, stats). x (B, P + N): left-padded prompts (lens (B,) real tokens, P a multiple of the block size)
    then x0; masked (B, N): the state, xt = x0 with these positions masked. loss: the divergence between the
    teacher's next-token distribution and the student's denoiser at every masked, valid position, reduced per
    `reduction`; eos_id: the end ids (an id or several: valid_positions). Divergences over ids < vocab_size (the
    tokenizer's). stats: kl (the full forward KL, the same reduction), masked (positions trained), rollout_len
    (generated tokens up to and with the first end token, mean per row).
    vectorised=False: the per-block reference forward (tests, bench)."""
    B, real, pos = x.shape[0], *left_padded(lens, P, x.shape[1])
    sel = masked & valid_positions(x[:, P:], eos_id, train_eos)  # (B, N)
    t = teacher_logits(teacher, x, real, pos, P, sel)[:, :vocab_size]
    xt = x[:, P:].masked_fill(masked, student.config.mask_token_id)
    # The student's denoiser: by definition one forward per block over [prompt, x0_<b, xt_b] (per_block_logits);
    # the same in one forward over [prompt, x0, xt] (block_logits, FlexAttention on CUDA) is what trains.
    if vectorised:
        s = block_logits(student, x, xt, sel, P=P, real=real, pos=pos, flex=x.is_cuda)
    else:
        s = per_block_logits(student, x, xt, sel, P=P, real=real, pos=pos)
    s, rows = s[:, :vocab_size], sel.nonzero()[:, 0]
    d = token_divergence(t, s, divergence, top_k)
    kl = d.detach() if divergence == "fkl" and not top_k else token_divergence(t, s.detach())
    resp = valid_positions(x[:, P:], eos_id, True).sum(1).float().mean()
    return reduce_kl(d, rows, B, reduction), dict(kl=reduce_kl(kl, rows, B, reduction),
                                                  masked=torch.tensor(float(d.numel())), rollout_len=resp)


def make_batch(student, items, L, policy, gen, *, eos_id, vocab_limit, pad_id=None, threshold=0.9,
               temperature=1.0):
    """items: [(prompt ids, data continuation ids)] -> x (B, P + L) [left-padded prompt, x0], prompt lens (B,),
    P, masked (B, L), stats. on: x0 the student's rollout (threshold, temperature; it stops at any of the end ids
    eos_id, an id or several), masked a state of its own trajectory; off: the same kind of rollout, masked at
    random; data: x0 the data continuation (padded with pad_id, one of the end ids: default the first), masked at
    random. stats (rollouts): tokens per forward (the mean over rows of Generation.tokens_per_forward: each row's
    tokens up to and including its first eos over the forwards it needed, as eval.py and tasks.py count it), nfe."""
    bs, prompts = student.config.block_size, [ids for ids, _ in items]
    if policy == "data":
        pad = end_list(eos_id)[0] if pad_id is None else pad_id
        x, lens, P, _, _ = prepare(student, prompts, L, pad, pad, multiple=bs)
        for b, (_, tail) in enumerate(items):
            x[b, P:P + min(L, len(tail))] = torch.as_tensor(tail[:L], device=x.device)
        return x, lens, P, random_states(len(items), L, bs, gen, x.device), {}
    g = block_generate(student, prompts, L, bs, threshold=threshold, temperature=temperature, record=True,
                       eos_id=eos_id, generator=gen, vocab_limit=vocab_limit)
    if policy == "on":
        masked = rollout_states(g.rounds, bs, gen)
    else:
        masked = random_states(len(items), L, bs, gen, g.tokens.device)
    stats = dict(tokens_per_forward=g.tokens_per_forward.mean().item(), nfe=g.nfe)
    return g.tokens, g.prompt_lens, g.start, masked, stats


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
def evaluate(student, teacher, items, L, *, batch_size, eos_id, vocab_size, pad_id=None, threshold=0.9,
             temperature=1.0, ctx=None, seed=EVAL_SEED):
    """Two forward KLs from the teacher (full vocabulary, seq reduction, batches weighted by their rows) at length
    L on the fixed prompts `items` [(prompt ids, data continuation ids)]:
    - val_kl: on the student's own rollouts (threshold, temperature, a fixed seed) at states of its own
      trajectories: the states it is sampled in, but each model is scored on its own text and states, so a model
      that samples text the teacher finds easy to predict scores well; val_tokens_per_forward there (the mean
      over rows of each row's).
    - val_kl_data: teacher-forced on fixed states that every model sees identically: x0 the real continuation
      (padded with pad_id: make_batch), per block a random mask (random_states, from a seed of its own): the
      number comparable across models and policies. Only when every item has a continuation (not with --prompts).
    eos_id: the end ids (an id or several); a rollout stops at any, and the loss ends at the first."""
    dev = student.lm_head.weight.device
    gen, gen_data = torch.Generator(dev).manual_seed(seed), torch.Generator(dev).manual_seed(seed)
    kl, kl_data, tpf, was_training = 0.0, 0.0, 0.0, student.training
    real_text = all(tail for _, tail in items)
    student.eval()
    for k in range(0, len(items), batch_size):
        batch = items[k:k + batch_size]
        with ctx or contextlib.nullcontext():
            x, lens, P, masked, st = make_batch(student, batch, L, "on", gen, eos_id=eos_id, vocab_limit=vocab_size,
                                                threshold=threshold, temperature=temperature)
            kl += distill_loss(student, teacher, x, lens, P, masked, eos_id=eos_id,
                               vocab_size=vocab_size)[1]["kl"].item() * len(batch)
            if real_text:
                x, lens, P, masked, _ = make_batch(student, batch, L, "data", gen_data, eos_id=eos_id,
                                                   vocab_limit=vocab_size, pad_id=pad_id)
                kl_data += distill_loss(student, teacher, x, lens, P, masked, eos_id=eos_id,
                                        vocab_size=vocab_size)[1]["kl"].item() * len(batch)
        tpf += st["tokens_per_forward"] * len(batch)
    student.train(was_training)
    res = dict(val_kl=kl / len(items), val_tokens_per_forward=tpf / len(items))
    if real_text:
        res["val_kl_data"] = kl_data / len(items)
    return res


if __name__ == "__main__":
    args = training.parse_loop_args(p)
    if not 0 < args.rollout_min <= args.rollout_max or args.curriculum_steps < 0 or args.num_prompts <= 0:
        p.error("need 0 < --rollout_min <= --rollout_max, --curriculum_steps >= 0, --num_prompts > 0")
    if args.teacher_top_k is not None and (args.teacher_top_k <= 0 or args.divergence != "fkl"):
        p.error("--teacher_top_k must be positive and goes with --divergence fkl")
    if args.policy == "data" and args.prompts:
        p.error("--policy data takes x0 from the data: it cannot use --prompts")
    task_items = tasks.eval_items(p, args)
    run = training.Run(args, "distill", generator="device")  # its generator: prompts, rollouts, states
    device, ctx = run.device, run.ctx
    student = run.start(lambda: training.load_model(args.init, device, "distill: student"))
    c = student.config
    training.require_dlm(c, args.init, "distill", "block")
    teacher_dir = args.teacher or c.converted_from
    teacher = training.load_teacher(teacher_dir, student, device, "distill", dtype=run.frozen_dtype)
    tok = training.load_tokenizer(args.init if not args.resume else run.out_dir, c)
    if not args.prompts:  # the prompts are cut from the data: it must share the student's tokenizer
        run.load_splits(args.data, like=student)
    try:
        pool = prompt_pool(args, tok, args.rollout_max)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"distill: {e}")
    if not pool:
        raise SystemExit("distill: no prompts (the documents are shorter than --seq_len?)")
    # --compile: dynamic shapes, as the curriculum changes the length every step (a rollout that ends early at eos
    # keeps its length, eos-filled): one graph per kind of call (rollout forward, training forward with and without
    # grad, teacher forward) serves them all, where torch's default would recompile on the one code object
    # (Qwen3Model.forward, shared by student and teacher) past its recompile limit of 8
    student = run.train(student, compile_too=[teacher], dynamic=True)
    eval_items = pool[:args.eval_batches * args.batch_size]
    ends = tok.end_ids(c)  # every end id the student declares: rollouts stop at any, the loss ends at the first

    def run_eval():  # at the final length --rollout_max: the states the trained student is sampled in
        res = evaluate(student, teacher, eval_items, args.rollout_max, batch_size=args.batch_size,
                       vocab_size=tok.vocab_size, ctx=ctx, eos_id=ends, pad_id=tok.eos_id, threshold=args.threshold,
                       temperature=args.temperature)
        if task_items:
            with ctx:
                res.update(tasks.log_record(student, tok, task_items, threshold=args.threshold))
        return res
    print(f"student: {student.num_params() / 1e6:.2f}M parameters, block {c.block_size}, shift={c.shift}; teacher "
          f"{teacher_dir} ({str(teacher.lm_head.weight.dtype).removeprefix('torch.')}); {len(pool)} prompts; "
          f"policy {args.policy}, {args.divergence}, {args.kl_reduction}; device {device}")

    def draw():  # a micro-batch's prompts and rollout seed: drawn on every rank
        pick = torch.randint(len(pool), (args.batch_size,), generator=run.gen, device=run.gen.device).tolist()
        return pick, torch.randint(2 ** 62, (1,), generator=run.gen, device=run.gen.device).item()

    last_eval = {}
    for step in run.steps():
        L = curriculum(step, args.rollout_min, args.rollout_max, args.curriculum_steps, c.block_size)
        t_roll = 0.0
        for pick, seed in run.micro_batches(draw):
            g = torch.Generator(device).manual_seed(seed)  # this micro-batch's rollout and states, on any rank
            t1 = time.time()
            student.eval()
            with ctx:
                x, lens, P, masked, st = make_batch(student, [pool[j] for j in pick], L, args.policy, g,
                                                    eos_id=ends, vocab_limit=tok.vocab_size, pad_id=tok.eos_id,
                                                    threshold=args.threshold, temperature=args.temperature)
            student.train()
            t_roll += time.time() - t1
            with ctx:
                loss, s = distill_loss(student, teacher, x, lens, P, masked, eos_id=ends, vocab_size=tok.vocab_size,
                                       divergence=args.divergence, top_k=args.teacher_top_k,
                                       reduction=args.kl_reduction, train_eos=args.train_eos)
            n = x.shape[0] * (x.shape[1] - P)  # the tokens rolled out and trained
            run.backward(loss, {k: float(v) for k, v in {**s, **st, "loss": loss.detach()}.items()}, tokens=n,
                         flops=training.flops_per_token(student, x.shape[1], forward_only=teacher) * n)
        rec = run.update()
        rec.update(max_len=L, rollout_share=t_roll / run.step_times[-1])
        if run.eval_due():
            last_eval = dict(step=step, **run_eval())
            rec.update({k: v for k, v in last_eval.items() if k != "step"})
        if run.save_due():
            run.save(student, tok)
        run.log(rec, kl=f"{rec['kl']:.3f}", L=L, tpf=f"{rec.get('tokens_per_forward', 0):.2f}",
                val_kl=f"{last_eval.get('val_kl', float('nan')):.3f}",
                val_kl_data=f"{last_eval.get('val_kl_data', float('nan')):.3f}")

    final = last_eval if last_eval.get("step") == args.max_iters - 1 else run_eval()
    final = {k: v for k, v in final.items() if k != "step"}
    print("\nfinal eval: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
    run.results(dict(**final, eval_len=args.rollout_max, steps=args.max_iters, policy=args.policy,
                     divergence=args.divergence, kl_reduction=args.kl_reduction,
                     seconds=run.timing()["train_seconds_this_run"]))
