"""
diffu-GRPO: reinforcement learning of a masked or block DLM with a checker as the reward (d1's recipe).

    python rl.py --init out/tasks/align --prompts data/tasks/prompts.jsonl --out_dir out/tasks/rl
    python rl.py ... --reward realworld      # worlds/realworld.py's checkers, the prompts in the chat template

Every μ optimizer steps, a batch of rollouts: G completions y_1..G of each of B prompts, from the policy's own
sampler (--threshold, --temperature, --eos_rule), each scored by the checker:
    A_i = (r_i − mean_g r) / (std_g r + ε)                       the group's rewards, normalised
Then μ steps on them, step k with a fresh prompt mask m_k (each prompt token masked with p = --prompt_mask):
    log π(y_j) ≈ log p_θ(y_j | prompt ⊙ m_k, y fully masked)     every token from one forward (block: the block rule)
    ρ_j = π(y_j) / π_old(y_j)                                    π_old: the rollouts' policy, under the same m_k
    L = −mean_j min(ρ_j A, clip(ρ_j, 1 − ε, 1 + ε) A) + β · KL_k3(π ‖ π_ref)    over the completions' tokens
j runs over each completion's tokens up to and including its end token.
"""
import importlib.util
import math
import time

import torch

from diffusion import block_logits, denoiser_rows
from model import attend, left_padded
from sample import block_generate, diffusion_generate, until_end
from lib import cli
from lib import data
from lib import training

p = cli.parser(__doc__)
p.add_argument("--init", default="out/tasks/align", help="the policy: a DLM checkpoint (convert.py, align.py, ...)")
p.add_argument("--prompts", default="data/tasks/prompts.jsonl", help="JSONL of {\"prompt\", \"family\", ...}: what "
               "the reward's checker needs")
p.add_argument("--reward", default="tasks", help="tasks (tasks.check: 1 right, 0 wrong), realworld (realworld.check, "
               "prompts in the chat template), or FILE.py:FUNCTION, a function (record, reply text) -> number")
p.add_argument("--format_weight", type=float, default=0.0, help="tasks: + this for a reply of digits only")
p.add_argument("--out_dir", default="out/rl", help="checkpoints, log.jsonl and results.json go here")
p.add_argument("--group", type=int, default=8, help="G: completions per prompt")
p.add_argument("--mu", type=int, default=4, help="μ: optimizer steps on each batch of rollouts (d1: up to 12)")
p.add_argument("--clip", type=float, default=0.2, help="ε: the ratio's clip")
p.add_argument("--beta", type=float, default=0.04, help="β: the KL to the initial policy (k3 estimator)")
p.add_argument("--prompt_mask", type=float, default=0.15, help="p: each prompt token masked in the log-probability")
p.add_argument("--max_new_tokens", type=int, default=8, help="N: the rollouts' canvas")
p.add_argument("--threshold", type=float, default=0.9, help="rollouts: commit every slot this confident")
p.add_argument("--temperature", type=float, default=1.0, help="rollouts: sampling temperature")
p.add_argument("--eos_rule", default="free", choices=cli.EOS_RULES, help="rollouts: sample.generate's end-token rule")
cli.add_loop_args(p, frozen="the reference policy", tasks="--threshold", max_iters=40, batch_size=8, seq_len=64,
                  lr=1e-4, min_lr=1e-5, warmup=0, eval_interval=8, eval_batches=1)


# ---- the objective --------------------------------------------------------------------------------------

def group_advantages(rewards, group, eps=1e-4):
    """rewards (B·G,), each prompt's G consecutive -> A (B·G,): (r − the group's mean) / (its std + eps)."""
    r = rewards.view(-1, group)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps)).view(-1)


def grpo_loss(logps, old_logps, ref_logps, advantages, keep, *, clip=0.2, beta=0.0):
    """logps, old_logps, ref_logps (B, N): each completion token's log-probability under the policy, the rollouts'
    policy and the reference; advantages (B,); keep (B, N): the tokens that count -> (loss, stats): GRPO's clipped
    surrogate plus β · KL_k3, averaged over every kept token of the batch."""
    ratio = torch.exp(logps - old_logps)  # ρ = π_θ / π_old, per token
    a = advantages[:, None]
    surrogate = torch.min(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a)  # min(ρA, clip(ρ, 1 − ε, 1 + ε)A)
    d = ref_logps - logps
    kl = torch.exp(d) - d - 1  # k3: π_ref/π − log(π_ref/π) − 1 >= 0, unbiased for KL(π ‖ π_ref)
    n = keep.sum().clamp(min=1)
    loss = ((-surrogate + beta * kl) * keep).sum() / n
    clipped = ((ratio - ratio.clamp(1 - clip, 1 + clip)).abs() > 0) & keep
    return loss, dict(kl=(kl.detach() * keep).sum() / n, clipped=clipped.sum() / n)


def completion_logps(model, x, lens, P, prompt_drop):
    """x (B, P + N): prompts left-padded to P (lens (B,) real tokens), then the completions; prompt_drop (B, P)
    bool: the prompt tokens to mask -> (B, N) log p_θ(y_j | the masked prompt, y fully masked), one forward.
    A block DLM reads block b given the clean blocks before it (BD3-LM: [x, x_t], diffusion.block_logits)."""
    c, (B, L), N = model.config, x.shape, x.shape[1] - P
    real, pos = left_padded(lens, P, L)
    x_in = torch.cat([x[:, :P].masked_fill(prompt_drop, c.mask_token_id), x[:, P:]], 1)
    y, hidden = x[:, P:], torch.full_like(x[:, P:], c.mask_token_id)  # the targets; the completion, masked
    if c.attn == "block":
        ce = block_logits(model, x_in, hidden, torch.ones_like(y, dtype=torch.bool), P=P, real=real, pos=pos,
                          targets=y.reshape(-1), reduction="none")
    else:
        masked = torch.arange(L, device=x.device).expand(B, L) >= P  # (B, L): the completion's slots
        ce = model(torch.cat([x_in[:, :P], hidden], 1), attend("bidirectional", torch.arange(L, device=x.device),
                   real), pos=pos, rows=denoiser_rows(masked, c.shift), targets=y.reshape(-1), reduction="none")
    return -ce.float().view(B, N)


# ---- rewards and rollouts ---------------------------------------------------------------------------------

def load_reward(spec, format_weight=0.0):
    """--reward -> (reward(record, reply) -> number, chat: whether prompts go in the chat template)."""
    if spec == "tasks":
        from worlds import tasks

        def reward(rec, reply):
            form = format_weight * bool(reply.split() and all(len(w) == 1 and w.isdigit() for w in reply.split()))
            return float(tasks.check(rec["family"], rec["prompt"], reply)) + form
        return reward, False
    if spec == "realworld":
        from worlds import realworld
        return (lambda rec, reply: float(realworld.check(rec, reply))), True
    path, _, name = spec.partition(":")
    if not path.endswith(".py") or not name:
        raise SystemExit(f"rl: --reward {spec}: use tasks, realworld or FILE.py:FUNCTION")
    try:
        spec_ = importlib.util.spec_from_file_location("reward_module", path)
        module = importlib.util.module_from_spec(spec_)
        spec_.loader.exec_module(module)
        return getattr(module, name), False
    except (OSError, AttributeError, SyntaxError) as e:
        raise SystemExit(f"rl: --reward {spec}: cannot load it ({type(e).__name__}: {e})") from None


def checked_reward(reward, rec, reply, where):
    """reward(rec, reply) as a float, or a one-line exit naming where a record has no checker or a reward is no
    number."""
    try:
        r = reward(rec, reply)
    except (KeyError, ValueError, TypeError) as e:
        raise SystemExit(f"rl: {where}: the reward has no checker for this record ({type(e).__name__}: {e}); each "
                         f"record needs what --reward reads (tasks: a canonical prompt and its family)") from None
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
        raise SystemExit(f"rl: {where}: the reward returned {r!r} ({type(r).__name__}); a reward must be a finite "
                         f"int or float")
    return float(r)


def rollouts(model, tok, prompts, n_new, gen, *, group, threshold, temperature, eos_rule):
    """Each prompt's `group` completions from the policy's sampler -> x (B·G, P + N), lens, P, texts, keep (B·G, N):
    each completion's tokens up to and including its first end token, tokens per forward (mean)."""
    ends, rows, was_training = tok.end_ids(model.config, turn=True), [q for q in prompts for _ in range(group)], \
        model.training
    kw = dict(threshold=threshold, temperature=temperature, eos_id=ends, generator=gen, vocab_limit=tok.vocab_size,
              eos_rule=eos_rule)
    if model.config.attn == "block":  # block by block, finished blocks in the KV cache
        g = block_generate(model.eval(), rows, n_new, **kw)
    else:  # masked diffusion: semi-autoregressive blocks of at most 32 (sample.generate's default)
        g = diffusion_generate(model.eval(), rows, n_new, min(32, n_new), n_new, **kw)
    model.train(was_training)
    y = g.generated
    keep = torch.arange(n_new, device=y.device) < g.row_tokens[:, None]  # up to its first end token (sampler's count)
    texts = [tok.decode(until_end(y[b].tolist(), ends)) for b in range(y.shape[0])]
    return g.tokens, g.prompt_lens, g.start, texts, keep, g.tokens_per_forward.mean().item()


if __name__ == "__main__":
    args = cli.parse_loop_args(p)
    if args.group < 2:
        p.error(f"--group {args.group}: GRPO compares completions within a group; it needs at least 2")
    if args.mu < 1 or args.clip <= 0 or args.beta < 0 or not 0 <= args.prompt_mask < 1 or args.max_new_tokens < 1:
        p.error("need --mu >= 1, --clip > 0, --beta >= 0, 0 <= --prompt_mask < 1 and --max_new_tokens >= 1")
    if args.eval_interval % args.mu:
        p.error(f"--eval_interval {args.eval_interval} must be a multiple of --mu {args.mu}: checkpoints are written "
                f"where a batch of rollouts ends, so that --resume starts a fresh one")
    reward, chat = load_reward(args.reward, args.format_weight)
    run = training.Run(args, "rl", generator="device")  # its generator: prompts, rollouts, prompt masks
    device, ctx = run.device, run.ctx
    policy = run.start(lambda: training.load_model(args.init, device, "rl: --init"))
    c = policy.config
    training.require_dlm(c, f"--init {args.init}", "rl")
    ref = training.load_model(args.init, device, "rl: reference", dtype=run.frozen_dtype).requires_grad_(False).eval() \
        if args.beta else None  # π_ref: the initial policy, frozen
    tok = training.load_tokenizer(args.init, c)
    records = data.read_prompts(args.prompts)
    for i, rec in enumerate(records):  # every record has a checker, and it answers with a number
        checked_reward(reward, rec, "", f"--prompts {args.prompts} line {i + 1}")
    if chat:
        from worlds import realworld
        pool = [realworld.prompt_ids(tok, rec) for rec in records]
    else:
        pool = [tok.encode(rec["prompt"]) for rec in records]
    policy = run.prepare(policy, dynamic=True)
    print(f"policy {args.init}: {policy.num_params() / 1e6:.2f}M parameters, attn {c.attn}; {len(records)} prompts, "
          f"G = {args.group}, μ = {args.mu}, β = {args.beta}, reward {args.reward}")

    def draw():  # a micro-batch's prompts, its rollout seed and μ prompt-mask seeds: drawn on every rank
        pick = torch.randint(len(pool), (args.batch_size,), generator=run.gen, device=run.gen.device).tolist()
        return pick, torch.randint(2 ** 62, (args.mu + 1,), generator=run.gen, device=run.gen.device).tolist()

    def make_batch(pick, seeds):  # rollouts, rewards, advantages, and per inner step its mask, π_old and π_ref
        t0 = time.time()
        with ctx:
            x, lens, P, texts, keep, tpf = rollouts(policy, tok, [pool[j] for j in pick], args.max_new_tokens,
                                                    torch.Generator(device).manual_seed(seeds[0]), group=args.group,
                                                    threshold=args.threshold, temperature=args.temperature,
                                                    eos_rule=args.eos_rule)
        recs = [records[j] for j in pick for _ in range(args.group)]
        r = torch.tensor([checked_reward(reward, rec, t, "a rollout") for rec, t in zip(recs, texts)], device=device)
        real = left_padded(lens, P, x.shape[1])[0][:, :P]
        steps = []
        for s in seeds[1:]:  # the prompt mask of each inner step; π_old and π_ref under it, without gradients
            u = torch.rand(real.shape, generator=torch.Generator(device).manual_seed(s), device=device)
            drop = (u < args.prompt_mask) & real
            with torch.no_grad(), ctx:
                old = completion_logps(policy, x, lens, P, drop) if args.mu > 1 else None
                ref_lp = completion_logps(ref, x, lens, P, drop) if args.beta else None
            steps.append((drop, old, ref_lp))
        return dict(x=x, lens=lens, P=P, keep=keep, adv=group_advantages(r, args.group), steps=steps,
                    stats=dict(reward=r.mean().item(), reward_std=r.view(-1, args.group).std(1).mean().item(),
                               tokens_per_forward=tpf, rollout_seconds=time.time() - t0))

    def run_eval():  # --tasks: held-out exact match at --threshold, by eval.py
        return training.task_eval(run, policy, tok)

    steps = run.steps()
    for step in steps:  # a batch of rollouts, then μ optimizer steps on it, each under its own prompt mask
        buffer = [make_batch(*b) for b in run.micro_batches(draw)]
        for k in range(args.mu):
            if k and next(steps, None) is None:  # --max_iters ends inside the batch
                break
            for b in buffer:
                drop, old, ref_lp = b["steps"][k]
                with ctx:
                    logps = completion_logps(policy, b["x"], b["lens"], b["P"], drop)
                    loss, s = grpo_loss(logps, logps.detach() if old is None else old,
                                        logps.detach() if ref_lp is None else ref_lp, b["adv"], b["keep"],
                                        clip=args.clip, beta=args.beta)
                n = b["x"].numel()
                rollout = b["stats"] if k == 0 else {}  # the rollouts' figures, logged at the step that made them
                run.backward(loss, {**s, **rollout}, tokens=n,
                             flops=training.flops_per_token(policy, b["x"].shape[1], forward_only=ref) * n)
            rec = run.update()
            if run.eval_due():
                rec.update(run.evaluate(run_eval))
            if run.save_due(ends=True):  # where a batch of rollouts ends: --resume starts a fresh one
                run.save(policy, tok)
            run.snapshot(policy, tok)
            run.log(rec, reward=f"{buffer[0]['stats']['reward']:.2f}", kl=f"{rec['kl']:.4f}")

    final = run.final(run_eval)
    print("\nfinal: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items() if isinstance(v, float)))
    run.results(dict(**final, steps=args.max_iters, group=args.group, mu=args.mu, beta=args.beta,
                     reward=args.reward))
