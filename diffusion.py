"""
The masked-diffusion objective (docs/methods.md §1), shared by align.py, distill.py, eval.py and merge.py, and the
block-diffusion (BD3-LM) forward that scores and trains block DLMs.

    xt, masked, t = corrupt(x0, mask_id, shift, generator)        # t ~ U(eps, 1-eps) per sequence
    loss = diffusion_loss(model, x0, xt, masked, t, norm="mean")   # or "elbo"
    nats = nelbo(model, x0, generator)                             # one draw of -ELBO/token (BD3-LM's for blocks)

Notes on the design: docs/methods.md, "diffusion.py" under §8.
"""
import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask

from model import attend, packed_mask
from lib import data

NORMS = ("mean", "elbo")
# Every evaluation here scores each checkpoint on the same corruptions: masks from a generator of this seed, at
# these mask ratios, and the ELBO's t ~ U(ELBO_EPS, 1 - ELBO_EPS) (align.py, eval.py likelihood, distill.py's seed)
EVAL_RATIOS, EVAL_SEED, ELBO_EPS = (0.15, 0.5, 0.9), 1234, 1e-3


def maskable(B, T, shift, prompt_lens=None, device=None, pos=None):
    """(B, T) bool: the positions that may be masked: not 0 under shift (pos (B, T): each slot's position, as in
    packed rows, where every conversation has its own 0), not the prompt (< prompt_lens[b])."""
    pos = torch.arange(T, device=device).expand(B, T) if pos is None else pos
    ok = pos >= int(bool(shift))
    if prompt_lens is not None:
        ok = ok & (pos >= torch.as_tensor(prompt_lens, device=device)[:, None])
    return ok


def corrupt(x0, mask_id, shift, generator=None, eps=1e-3, t=None, prompt_lens=None, *, block_size=None, where=None,
            doc=None, pos=None):
    """-> xt (B, T), masked (B, T) bool, t (B,), or (B, T) per position with block_size or doc. t ~ U(eps, 1-eps) per
    sequence (per block), or the given t; each maskable token (and where (B, T) allows) masked w.p. t. Packed rows
    (data.packed_batch): doc (B, T) each slot's conversation, pos (B, T) its position: t per conversation (per block
    of its own positions, with block_size), position 0 of each one never masked under shift."""
    B, T = x0.shape
    gdev = generator.device if generator is not None else torch.device("cpu")
    nb = -(-T // block_size) if block_size else 1  # blocks a row (a conversation) can hold
    if doc is not None:  # packed rows: a rate per conversation, or per block of its own positions
        unit = doc.clamp(min=0) * nb + (pos // block_size if block_size else 0)  # (B, T): each slot's rate
        shape = (B, (int(doc.max()) + 1) * nb)
    else:
        shape = (B, nb) if block_size else (B,)
    if t is None:
        t = eps + (1 - 2 * eps) * torch.rand(shape, generator=generator, device=gdev)  # t ~ U(eps, 1 - eps)
    t = torch.as_tensor(t, dtype=torch.float32, device=gdev).expand(shape)
    if doc is not None:
        t = t.gather(1, unit.to(gdev))  # (B, T); a pad takes the first conversation's (and is never masked)
    elif block_size:
        t = t.repeat_interleave(block_size, 1)[:, :T]  # (B, T): each position its block's t
    u = torch.rand(B, T, generator=generator, device=gdev)
    ok = maskable(B, T, shift, prompt_lens, x0.device, pos) & (True if doc is None else doc >= 0)
    masked = (u < per_position(t)).to(x0.device) & ok  # P(masked) = t
    masked = masked if where is None else masked & where
    return torch.where(masked, torch.full_like(x0, mask_id), x0), masked, t.to(x0.device)


def per_position(t):
    """t (B,) -> (B, 1); t (B, T) stays: broadcastable to (B, T)."""
    return t[:, None] if t.dim() == 1 else t


def denoiser_rows(masked, shift):
    """(B, T) bool: the rows whose output denoises a masked token: i-1 for masked i (shift), else i. Row-major,
    the k-th True row predicts the k-th True position of masked."""
    if not shift:
        return masked
    never_first(masked)
    return F.pad(masked[:, 1:], (0, 1), value=False)


def never_first(masked):
    """ValueError if position 0 is masked: under shift nothing predicts it."""
    if masked[:, 0].any():
        raise ValueError("under shift, position 0 cannot be denoised (no logits at -1): it must not be masked")


# ---- block diffusion: block b given the clean blocks before it -----------------------------------------------

def per_block_logits(model, x, xt, sel, *, P=0, real=None, pos=None, shift=None):
    """The definition, one forward per block (the reference of tests and bench): x (B, P + N) the clean
    [prompt, x0] (P a multiple of the block size), xt (B, N) a noisy copy of x0, sel (B, N) the positions to
    read -> logits (n_sel, V) in row-major order: block b's from a forward over [prompt, x0_<b, xt_b] under the
    plain block rule. real, pos: left pads and RoPE positions (model.left_padded; default none, the slot index)."""
    B, L = x.shape
    bs, shift = model.config.block_size, int(model.config.shift if shift is None else shift)
    real = torch.ones_like(x, dtype=torch.bool) if real is None else real
    pos = torch.arange(L, device=x.device).expand(B, L) if pos is None else pos
    out = torch.zeros(sel.shape + (model.config.vocab_size,), device=x.device)
    for s in range(P, L, bs):
        e = min(s + bs, L)  # the block's slots
        idx = torch.cat([x[:, :s], xt[:, s - P:e - P]], 1)  # [prompt, x0_<b, xt_b]
        logits = model(idx, attn=attend("block", torch.arange(e, device=x.device), real[:, :e], bs), pos=pos[:, :e])
        rows = (torch.arange(s, e, device=x.device) - shift).clamp(min=0)  # slot i - shift predicts slot i
        out[:, s - P:e - P] = logits[:, rows].float()  # (under shift slot 0 has no prediction: never selected)
    return out[sel]


def train_rule(real, N, bs, doc=None, pos=None):
    """The attention rule over [x, xt] (x = [prompt, x0], L = P + N slots; then N noisy ones) as a FlexAttention
    mask_mod rule(b, h, q, k): BD3-LM's M_BC | M_OBC | M_BD; pads (real (B, L) False) hidden, a slot sees itself.
    Packed rows (doc, pos (B, L): each slot's conversation and position, P = 0): the blocks are those of each
    conversation's own positions, and a slot sees its own conversation only."""
    L = real.shape[1]
    key_real = torch.cat([real, real[:, L - N:]], 1)  # (B, L + N): a noisy slot is real where its clean one is
    if doc is not None:
        blocks, conv = torch.cat([pos, pos[:, L - N:]], 1) // bs, torch.cat([doc, doc[:, L - N:]], 1)  # (B, L + N)

    def rule(b, h, q, k):
        q_noisy, k_noisy = q >= L, k >= L
        if doc is None:
            q_blk = torch.where(q_noisy, q - N, q) // bs  # the noisy copy lives in the same blocks as the clean one
            k_blk = torch.where(k_noisy, k - N, k) // bs
        else:
            q_blk, k_blk = blocks[b, q], blocks[b, k]
        block_diagonal = q_noisy & k_noisy & (k_blk == q_blk)  # M_BD: a noisy block sees itself
        offset_block_causal = q_noisy & ~k_noisy & (k_blk < q_blk)  # M_OBC: ... and the clean blocks before it
        block_causal = ~q_noisy & ~k_noisy & (k_blk <= q_blk)  # M_BC: the clean stream, block-causal
        seen = (block_diagonal | offset_block_causal | block_causal) & key_real[b, k]
        return (seen if doc is None else seen & (conv[b, q] == conv[b, k])) | (q == k)
    return rule


def train_mask(real, N, bs, *, flex=False, doc=None, pos=None):
    """train_rule as a FlexAttention BlockMask (flex) or a dense (B, 1, T, T) bool mask, T = L + N."""
    B, T, dev = real.shape[0], real.shape[1] + N, real.device
    if flex:
        return create_block_mask(train_rule(real, N, bs, doc, pos), B, None, T, T, device=dev)
    i = torch.arange(T, device=dev)
    return train_rule(real, N, bs, doc, pos)(torch.arange(B, device=dev)[:, None, None, None], None, i[:, None], i)


def block_logits(model, x, xt, sel, *, P=0, real=None, pos=None, shift=None, flex=False, targets=None,
                 reduction="none", argmax=False, doc=None):
    """per_block_logits in one forward over [x, xt] under train_rule, the noisy copy at the clean one's RoPE
    positions -> logits (n_sel, V) row-major (targets: the CE instead, as Qwen3.forward); flex: a BlockMask.
    doc (B, L): packed rows (data.packed_batch; P = 0, pos their positions), each conversation its own blocks."""
    B, L = x.shape
    N, bs, shift = L - P, model.config.block_size, int(model.config.shift if shift is None else shift)
    if P % bs:
        raise ValueError(f"the prompt length P={P} must be a multiple of the block size {bs}")
    if shift and P == 0:
        never_first(sel if doc is None else sel & (pos == 0))  # packed: no conversation's first position
    real = (torch.ones_like(x, dtype=torch.bool) if doc is None else doc >= 0) if real is None else real
    pos = torch.arange(L, device=x.device).expand(B, L) if pos is None else pos
    b, i = sel.nonzero(as_tuple=True)
    first = (i if doc is None else pos[b, i]) % bs == 0  # position i opens its block
    rows = torch.where(first & bool(shift), P + i - 1, L + i - shift)  # the slot that denoises position i
    mask = train_mask(real, N, bs, flex=flex, doc=doc, pos=None if doc is None else pos)
    return model(torch.cat([x, xt], 1), mask, pos=torch.cat([pos, pos[:, P:]], 1), rows=(b, rows), targets=targets,
                 reduction=reduction, argmax=argmax)


# ---- the losses ----------------------------------------------------------------------------------------------

def denoiser_ce(model, x0, xt, masked, *, attn=None, shift=None, reduction="none", argmax=False,
                output_hidden_states=False, doc=None, pos=None):
    """-> CE_i = -log p_θ(x0_i | xt) (n_masked,), row-major [, hidden_states], lm_head on the denoiser_rows only
    (reduction, argmax: as Qwen3.forward). attn "block": block b given the clean blocks before it (block_logits).
    doc, pos (B, T): packed rows (data.packed_batch), each conversation read alone (model.packed_mask)."""
    attn, shift = model.config.attn if attn is None else attn, model.config.shift if shift is None else shift
    if shift is None:
        raise ValueError("the model's config has no `shift`: is it a DLM converted by convert.py?")
    if isinstance(attn, str) and attn == "block":
        if output_hidden_states:
            raise ValueError("a block DLM is read over [x0, xt] (BD3-LM): hidden states are not offered")
        return block_logits(model, x0, xt, masked, shift=shift, targets=x0[masked], reduction=reduction,
                            argmax=argmax, doc=doc, pos=pos)
    if doc is not None:
        if shift:
            never_first(masked & (pos == 0))  # nothing in a conversation predicts its first position
        attn = packed_mask(attn, doc, pos, model.config.block_size)
    return model(xt, attn, rows=denoiser_rows(masked, shift), targets=x0[masked], reduction=reduction, argmax=argmax,
                 output_hidden_states=output_hidden_states, pos=pos)


def diffusion_loss(model, x0, xt, masked, t, norm="mean", attn=None, shift=None, prompt_lens=None,
                   extra_ce=False, output_hidden_states=False, doc=None, pos=None):
    """-> the masked-diffusion loss [, hidden_states]; t (B,) or (B, T) as corrupt's. norm "mean": the mean CE
    over masked tokens; "elbo": the negative ELBO in nats per maskable token (LLaDA/MDLM; BD3-LM for a block DLM).
    extra_ce: + sg(exp(-CE))·CE per masked token. doc, pos: packed rows (denoiser_ce), with norm "mean"."""
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    if doc is not None and norm != "mean":
        raise ValueError("packed rows take norm 'mean' (the ELBO's per-sequence normalisation is per row)")
    out = denoiser_ce(model, x0, xt, masked, attn=attn, shift=shift, output_hidden_states=output_hidden_states,
                      doc=doc, pos=pos)
    ce, hidden = out if output_hidden_states else (out, None)  # CE_i = -log p_θ(x0_i | xt), (n_masked,)
    if extra_ce:
        ce = ce + torch.exp(-ce.detach()) * ce  # CE_i + sg(exp(-CE_i)) · CE_i
    if norm == "mean":
        loss = ce.sum() / masked.sum().clamp(min=1)  # L = (1/|M|) Σ_{(b,i)∈M} CE_{b,i}
    else:
        B, T = x0.shape
        shift = model.config.shift if shift is None else shift
        n_tok = maskable(B, T, shift, prompt_lens, x0.device).sum(1).clamp(min=1)  # (B,) tokens modelled
        w = (1.0 / (per_position(t.float()) * n_tok[:, None])).expand(B, T)[masked]  # 1 / (t_{b,i} · L_b) per token
        loss = (ce * w).sum() / B  # L = (1/B) Σ_b (1/L_b) Σ_{i∈M_b} CE_{b,i} / t_{b,i}
    return (loss, hidden) if output_hidden_states else loss


def nelbo(model, x0, generator, eps=1e-3, per_sequence=False):
    """One draw of the negative ELBO in nats per token: diffusion_loss(norm="elbo") on a corruption of x0. With
    per_sequence, (B,): each sequence's own, (1/L_b) Σ_{i∈M_b} CE_{b,i} / t_{b,i} (their mean is the former, to
    rounding), the unit of a paired test."""
    c, (B, T) = model.config, x0.shape
    bs = c.block_size if c.attn == "block" else None
    xt, masked, t = corrupt(x0, c.mask_token_id, c.shift, generator, eps, block_size=bs)
    if per_sequence:
        return -sequence_elbo(model, x0, masked, t) / maskable(B, T, c.shift, None, x0.device).sum(1).clamp(min=1)
    return diffusion_loss(model, x0, xt, masked, t, "elbo")


def sequence_elbo(model, x0, masked, t, attn=None):
    """(B,) one draw of each sequence's ELBO term: -Σ_{i∈M_b} CE_{b,i} / t_b, for the given masks and rates (no
    normalisation; t (B,) or (B, T)). With M drawn at rate t ~ U(0, 1) over a response alone, its mean over draws
    is the bound log p(response | prompt) >= -E_{t,M}[Σ_{i∈M} CE_i / t] (LLaDA); merge.py's implicit rewards use
    it. A block DLM under attn "block" is read as BD3-LM (denoiser_ce)."""
    xt = torch.where(masked, torch.full_like(x0, model.config.mask_token_id), x0)
    ce = denoiser_ce(model, x0, xt, masked, attn=attn)  # CE_i = -log p_θ(x0_i | xt), (n_masked,)
    rows = masked.nonzero()[:, 0]  # the sequence of each masked token, in denoiser_ce's row-major order
    tm = per_position(t.float()).expand(x0.shape)[masked]  # each masked token's rate
    return -torch.zeros(x0.shape[0], device=x0.device).index_add(0, rows, ce / tm)  # -Σ_{i∈M_b} CE_{b,i} / t_b


def answer_elbo(model, ids, prompt_lens, resp, real, t, u):
    """(B,) one draw of the ELBO of log p(y|x) per row of data.response_batch: t (B,), u (B, >=T) ~ U(0, 1), answer
    slot i masked if u_i < t."""
    c, (B, T), dev = model.config, ids.shape, ids.device
    attn = c.attn if real.all() else attend(c.attn, torch.arange(T, device=dev), real, c.block_size)  # pads hidden
    ok = resp & maskable(B, T, c.shift, prompt_lens, dev)  # the answer only; never position 0 under shift
    t, u = t.to(dev), u[:, :T].to(dev)
    return sequence_elbo(model, ids, (u < t[:, None]) & ok, t, attn)  # P(masked) = t; −Σ_{i∈M} CE_i / t


def pair_elbo(model, ids, prompt_lens, resp, real, t, u):
    """(2B,) answer_elbo of each row of data.pair_batch (B chosen rows, then B rejected), the draw of pair j (t (B,),
    u (B, >=T)) shared by its two responses."""
    return answer_elbo(model, ids, prompt_lens, resp, real, t.repeat(2), u[:, :ids.shape[1]].repeat(2, 1))


@torch.no_grad()
def fixed_mask_eval(model, batches, ctx=None, ratios=EVAL_RATIOS, seed=EVAL_SEED, elbo_eps=ELBO_EPS):
    """Masked-token accuracy and mean CE at each mask ratio, and a one-draw negative ELBO (nelbo), on batches
    masked from a generator of `seed`: every call, every checkpoint, the same corruptions."""
    c, g = model.config, torch.Generator().manual_seed(seed)
    ce, acc, n, nats = [0.0] * len(ratios), [0] * len(ratios), [0] * len(ratios), 0.0
    for x0 in batches:
        with ctx or contextlib.nullcontext():
            for k, r in enumerate(ratios):
                xt, masked, _ = corrupt(x0, c.mask_token_id, c.shift, g, t=r)
                target = x0[masked]
                ce_k, top = denoiser_ce(model, x0, xt, masked, reduction="sum", argmax=True)
                ce[k] += ce_k.item()
                acc[k] += (top == target).sum().item()
                n[k] += target.numel()
            nats += nelbo(model, x0, g, elbo_eps).item() / len(batches)
    n = [max(v, 1) for v in n]
    return {**{f"val_loss@{r}": ce[k] / n[k] for k, r in enumerate(ratios)},
            **{f"val_acc@{r}": acc[k] / n[k] for k, r in enumerate(ratios)}, "val_nelbo": nats}


# ---- scoring preference pairs: AR exact, DLM by the ELBO (dpo.py, merge.py, lib/harness.py) ----------------------

N_DRAWS = 4  # fixed ELBO draws (t, M) per pair that score pairs: --dlm's held-out pairs; merge.py --n_masks's default


def response_logps(model, ids, resp_mask):
    """(B,) log π(y|x) = Σ_{i ∈ response} log p(ids_i | ids_<i): one causal forward, lm_head on rows i-1 only."""
    ce = model(ids, "causal", rows=denoiser_rows(resp_mask, True), targets=ids[resp_mask])  # (n_resp,)
    return torch.zeros(ids.shape[0], device=ids.device).index_add(0, resp_mask.nonzero()[:, 0], -ce)  # Σ log p


def draw_masks(n_pairs, n_masks, T, seed, eps=1e-3):
    """t (n_masks, n_pairs) ~ U(eps, 1-eps), u (n_masks, n_pairs, T) ~ U(0, 1): draw k masks i of pair j if u < t.
    seed: an int, or a torch.Generator to draw from."""
    g = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)
    t = eps + (1 - 2 * eps) * torch.rand(n_masks, n_pairs, generator=g)
    return t, torch.rand(n_masks, n_pairs, T, generator=g)


def batched_logps(model, items, draws, batch_size, ctx, make_batch, elbo):
    """log π(y|x) of items, batch by batch (make_batch: data.response_batch or data.pair_batch), each batch's rows
    (on the CPU) exact (AR: draws None) or the mean over the draws (t (K, n), u (K, n, >=T) of draw_masks, sliced
    to the batch's items) of one elbo(model, *batch, t_k, u_k) each (answer_elbo, pair_elbo)."""
    dev = model.model.embed_tokens.weight.device
    for s in range(0, len(items), batch_size):
        n = len(items[s:s + batch_size])
        batch = make_batch(items[s:s + n], dev)
        with ctx:
            if draws is None:
                yield response_logps(model, batch[0], batch[2]).cpu()
            else:  # E_{t,M}: the mean over draws
                yield (sum(elbo(model, *batch, t[s:s + n], u[s:s + n]) for t, u in zip(*draws)) / len(draws[0])).cpu()


@torch.no_grad()
def answer_logps(model, items, draws=None, batch_size=16, ctx=contextlib.nullcontext()):
    """(n,): log π(y|x) of every (x, y), exact (AR) or, given draws (t, u) of draw_masks, a DLM's ELBO estimate
    (realworld.py's −ELBO of the teacher's replies)."""
    return torch.cat(list(batched_logps(model, items, draws, batch_size, ctx, data.response_batch, answer_elbo)))


@torch.no_grad()
def all_logps(model, items, draws=None, batch_size=16, ctx=contextlib.nullcontext()):
    """(n, 2): log π(y_w|x), log π(y_l|x) of every pair, exact (AR) or, given draws (t, u) of draw_masks, a DLM's ELBO
    estimate: the mean over the draws, each shared by a pair's y_w and y_l (merge.py's rewards, dpo.py --dlm's)."""
    return torch.cat([torch.stack(lp.chunk(2), 1)  # a batch's chosen rows, then its rejected ones
                      for lp in batched_logps(model, items, draws, batch_size, ctx, data.pair_batch, pair_elbo)])
