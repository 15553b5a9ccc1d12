"""
AR-MAP, step 1 (docs/methods.md §4): teach the AR model a preference with DPO. merge.py then carries it into the
DLM converted from that AR model, as the task vector τ_pref = W_AR_aligned − W_AR.

    python dpo.py --ar out/ar-tiny --pairs data/pairs/train.jsonl --heldout data/pairs/heldout.jsonl \
                  --out_dir out/ar-dpo                          # add --lora_rank 8 for LoRA

Per step, for a batch of pairs (x, y_w, y_l) (worlds.stdlib, or worlds/tasks.py's pairs_*.jsonl):
    log π(y|x)  = Σ_{i ∈ y} log p(y_i | x, y_<i)          one causal forward, lm_head on the response rows only
    r(x, y)     = β (log π(y|x) − log π_ref(y|x))          π_ref: the AR model before DPO, frozen
    L           = −log σ(r(x, y_w) − r(x, y_l))  [+ α · NLL(y_w) per token: --sft_weight]
--lora_rank: π_ref is the policy with its adapters off (one copy); checkpoints hold the merged, plain weights.
--dlm: the DLM-only baseline AR-MAP is measured against: DPO on a DLM itself (--ar a convert.py checkpoint), log π(y|x)
the ELBO of one draw (t, M) per pair and step, the same draw for π and π_ref and for y_w and y_l (VRPO's sharing).
"""
import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrize

from diffusion import N_DRAWS, all_logps, draw_masks, pair_elbo, response_logps
from lib import cli
from lib import data
from lib import training

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

p = cli.parser(__doc__)
p.add_argument("--ar", default="out/ar-tiny", help="the AR checkpoint; also the frozen reference")
p.add_argument("--pairs", default="data/pairs/train.jsonl", help="training pairs ({prompt, chosen, rejected} JSONL)")
p.add_argument("--heldout", default="data/pairs/heldout.jsonl", help="every pair is scored at each evaluation")
p.add_argument("--out_dir", default="out/ar-dpo", help="the DPO-trained AR checkpoint goes here")
p.add_argument("--beta", type=float, default=0.1, help="DPO's β: the strength of the pull away from π_ref")
p.add_argument("--sft_weight", type=float, default=0.0, help="α: + α · the chosen responses' NLL per token (not "
               "published; keeps a small model's generations intact)")
p.add_argument("--lora_rank", type=int, default=0, help="0: full fine-tuning; r > 0: LoRA, π_ref its base")
p.add_argument("--dlm", action="store_true", help="--ar is a DLM: DPO on the ELBO (the DLM-only baseline)")
p.add_argument("--lora_alpha", type=float, default=16.0, help="LoRA scale α (the update is (α/r)·BA)")
cli.add_loop_args(p, frozen="the reference model π_ref (full fine-tuning)", max_iters=30, batch_size=8,
                  seq_len=512, lr=2e-4, min_lr=2e-5, warmup=3, eval_interval=10, eval_batches=16)  # unused
# decay would add -η·λ·W to τ_pref, which is not the preference; fp32 weights, as bf16 would round a small τ_pref away
p.set_defaults(weight_decay=0.0, save_dtype="float32")


# ---- DPO -------------------------------------------------------------------------------------------

def dpo_loss(pi_w, pi_l, ref_w, ref_l, beta):
    """-> (mean loss, reward_w, reward_l), the implicit rewards detached."""
    r_w, r_l = beta * (pi_w - ref_w), beta * (pi_l - ref_l)  # r(x, y) = β (log π(y|x) − log π_ref(y|x))
    loss = -F.logsigmoid(r_w - r_l).mean()  # −log σ(r(x, y_w) − r(x, y_l))
    return loss, r_w.detach(), r_l.detach()


class LoRA(nn.Module):
    """The parametrization W -> W + (α/r)·B@A of a Linear's weight, B starting at zero; disabled: W itself."""

    def __init__(self, weight, rank, alpha):
        super().__init__()
        self.scale, self.enabled = alpha / rank, True
        n_in = weight.shape[1]
        self.lora_A = nn.Parameter(torch.randn(rank, n_in, device=weight.device) / math.sqrt(n_in))
        self.lora_B = nn.Parameter(torch.zeros(weight.shape[0], rank, device=weight.device))

    def forward(self, W):
        return W + self.scale * self.lora_B @ self.lora_A if self.enabled else W  # W + (α/r)·B@A


@contextlib.contextmanager
def adapters_off(model):
    """Inside: every LoRA of the model off, so that it computes π_ref, its frozen base (no LoRA: the model)."""
    loras = [m for m in model.modules() if isinstance(m, LoRA)]
    for m in loras:
        m.enabled = False
    try:
        yield model
    finally:
        for m in loras:
            m.enabled = True


def add_lora(model, rank, alpha):
    """Every weight frozen; LoRA on the attention and MLP projections (A, B: the only trainable tensors)."""
    model.requires_grad_(False)
    for name, m in model.named_modules():
        if name.rsplit(".", 1)[-1] in LORA_TARGETS:
            parametrize.register_parametrization(m, "weight", LoRA(m.weight, rank, alpha))
    return model


def merged_state(model):
    """The weights of a model with LoRA as a plain Qwen3's state dict: each adapted weight W + (α/r)·B@A."""
    state = {k: v for k, v in model.state_dict().items() if ".parametrizations." not in k}
    return state | {f"{n}.weight": m.weight.detach() for n, m in model.named_modules()
                    if parametrize.is_parametrized(m, "weight")}


if __name__ == "__main__":
    args = cli.parse_loop_args(p)
    if args.beta <= 0 or args.lora_rank < 0 or args.sft_weight < 0:
        p.error("need --beta > 0, --lora_rank >= 0 and --sft_weight >= 0")
    if args.fsdp and args.lora_rank:
        p.error("--fsdp shards full fine-tuning only; LoRA's adapters are small: drop --fsdp (DDP) or --lora_rank")
    run = training.Run(args, "dpo")  # its generator draws the batches
    device, ctx = run.device, run.ctx
    def load_ar(dtype=torch.float32):
        return training.load_model(args.ar, device, "dpo: --ar", dtype=dtype, attn=None if args.dlm else "causal")
    policy = run.start(load_ar)
    if args.dlm:
        training.require_dlm(policy.config, f"--ar {args.ar}", "dpo --dlm")
    if args.lora_rank:  # a checkpoint holds the merged W + (α/r)BA: a resumed LoRA continues on --ar with A, B saved
        policy = add_lora(load_ar() if run.state else policy, args.lora_rank, args.lora_alpha)
        if run.state:
            policy.load_state_dict(run.state["extra"]["lora"], strict=False)
    # π_ref: the initial AR, frozen; with LoRA the policy's own base, under adapters_off (one copy)
    ref = policy if args.lora_rank else load_ar(run.frozen_dtype).requires_grad_(False).eval()
    tok = training.load_tokenizer(args.ar, ref.config)
    train, heldout = (data.tokenized_pairs(f, tok, args.seq_len, "dpo") for f in (args.pairs, args.heldout))
    policy = run.prepare(policy, dynamic=True)  # --compile: dynamic, as pairs differ in length from batch to batch
    draws = draw_masks(len(heldout), N_DRAWS, args.seq_len, args.seed) if args.dlm else None  # as draw()'s: T = seq_len
    def held_logps(m):
        return all_logps(m, heldout, draws, args.batch_size, ctx)  # --dlm: the same draws every time
    with adapters_off(ref):
        ref_held = held_logps(ref)  # the reference never changes: once
    n_train = sum(q.numel() for q in policy.parameters() if q.requires_grad)
    print(f"DPO: {len(train)} train / {len(heldout)} held-out pairs, β = {args.beta}, reference "
          f"{str(ref.lm_head.weight.dtype).removeprefix('torch.')}; {n_train / 1e6:.3f}M trainable "
          f"({f'LoRA rank {args.lora_rank}' if args.lora_rank else 'full'})")

    def held_out():  # the DPO loss, reward accuracy and margin; the share of pairs whose y_w is the more likely
        lp = held_logps(policy.eval())
        loss, r_w, r_l = dpo_loss(lp[:, 0], lp[:, 1], ref_held[:, 0], ref_held[:, 1], args.beta)
        policy.train()
        return dict(heldout_loss=loss.item(), heldout_reward_acc=(r_w > r_l).float().mean().item(), heldout_margin=(
            r_w - r_l).mean().item(), heldout_pref_acc=(lp[:, 0] > lp[:, 1]).float().mean().item())

    def draw():  # a micro-batch's pairs and, --dlm, one draw (t, u) per pair (u over seq_len, which pairs fit in)
        pick = torch.randint(len(train), (args.batch_size,), generator=run.gen).tolist()  # on every rank: in step
        return pick, [x[0] for x in draw_masks(len(pick), 1, args.seq_len, run.gen)] if args.dlm else None
    for step in run.steps():
        for pick, tu in run.micro_batches(draw):
            ids, _, resp, _ = batch = data.pair_batch([train[j] for j in pick], device)
            def logps(m):
                return response_logps(m, ids, resp) if tu is None else pair_elbo(m, *batch, *tu)
            with torch.no_grad(), ctx, adapters_off(ref):
                ref_w, ref_l = logps(ref).chunk(2)  # log π_ref(y|x), no gradient; --dlm: the ELBO of the draw
            with ctx:
                pi_w, pi_l = logps(policy).chunk(2)  # log π(y|x); --dlm: the same draw (t, M) as π_ref's
            loss, r_w, r_l = dpo_loss(pi_w, pi_l, ref_w, ref_l, args.beta)
            if args.sft_weight:  # + α · (−log π(y_w|x) / |y_w|): the chosen responses' NLL per token
                loss = loss + args.sft_weight * (-pi_w / resp.chunk(2)[0].sum(1).clamp(min=1)).mean()
            stats = dict(reward_acc=(r_w > r_l).float().mean(), margin=(r_w - r_l).mean(), reward_chosen=r_w.mean(),
                         reward_rejected=r_l.mean())  # every micro-batch has batch_size pairs
            run.backward(loss, stats, tokens=ids.numel(),
                         flops=training.flops_per_token(policy, ids.shape[1], forward_only=ref) * ids.numel())
        rec = run.update()
        if run.eval_due():
            rec.update(run.evaluate(held_out))
        if run.save_due():  # LoRA: the merged weights; it resumes from --ar and A, B (exact=(): no fp32 copy)
            lora = {k: v for k, v in policy.state_dict().items() if "lora_" in k}
            run.save(policy, tok, extra=dict(args=vars(args), lora=lora), exact=() if args.lora_rank else None,
                     state_dict=merged_state(policy) if args.lora_rank else None)
        run.snapshot(policy, tok, state_dict=(lambda: merged_state(policy)) if args.lora_rank else None)
        run.log(rec, loss=f"{rec['loss']:.3f}", acc=f"{rec['reward_acc']:.2f}",
                val_acc=f"{run.last_eval.get('heldout_reward_acc', float('nan')):.2f}")

    final = dict(run.final(held_out))
    final["heldout_pref_acc_before"] = (ref_held[:, 0] > ref_held[:, 1]).float().mean().item()  # the AR's own
    print("\nfinal held-out: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
    run.results(dict(**final, heldout_pairs=len(heldout), steps=args.max_iters, beta=args.beta,
                     lora_rank=args.lora_rank))

