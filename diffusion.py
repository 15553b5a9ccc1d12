"""
The masked-diffusion objective (methods.md §1), shared by align.py, eval.py and merge.py.

    xt, masked, t = corrupt(x0, mask_id, shift, generator)        # t ~ U(eps, 1-eps) per sequence
    loss = diffusion_loss(model, x0, xt, masked, t, norm="mean")   # or "elbo"

What is notable here:
- The shift convention lives in one place, `denoiser_rows`: a shifted DLM's prediction for a masked
  position i is read at i-1 (the AR head's meaning), an unshifted one's at i. Under shift, position 0 has
  no prediction (there are no logits at -1), so it is never masked: it is context, like a prompt token.
- `masked_logits` applies lm_head only to the rows that denoise a masked token: with Qwen3's 152k-row
  head, the full (B, T, V) logits would dwarf everything else in memory.
- Every random draw comes from the generator passed in, so a reseeded generator gives identical masks
  (evaluation scores every checkpoint on the same corruptions).
"""
import contextlib

import torch
import torch.nn.functional as F

NORMS = ("mean", "elbo")


def maskable(B, T, shift, prompt_lens=None, device=None):
    """(B, T) bool: the positions that may be masked. Not position 0 under shift (nothing predicts it),
    not the prompt (positions < prompt_lens[b])."""
    pos = torch.arange(T, device=device).expand(B, T)
    ok = pos >= int(bool(shift))
    if prompt_lens is not None:
        ok = ok & (pos >= torch.as_tensor(prompt_lens, device=device)[:, None])
    return ok


def corrupt(x0, mask_id, shift, generator=None, eps=1e-3, t=None, prompt_lens=None):
    """-> xt (B, T), masked (B, T) bool, t (B,). Per sequence t ~ U(eps, 1-eps) (or the given t: a float or
    (B,)); each maskable token is replaced by mask_id independently with probability t."""
    B, T = x0.shape
    gdev = generator.device if generator is not None else torch.device("cpu")
    if t is None:
        t = eps + (1 - 2 * eps) * torch.rand(B, generator=generator, device=gdev)  # t ~ U(eps, 1 - eps)
    t = torch.as_tensor(t, dtype=torch.float32, device=gdev).expand(B)
    u = torch.rand(B, T, generator=generator, device=gdev)
    masked = (u < t[:, None]).to(x0.device) & maskable(B, T, shift, prompt_lens, x0.device)  # P(masked) = t
    return torch.where(masked, torch.full_like(x0, mask_id), x0), masked, t.to(x0.device)


def denoiser_rows(masked, shift):
    """(B, T) bool: the positions whose output denoises a masked token. shift: row i-1 for masked i;
    no shift: row i. In row-major order the k-th True row here predicts the k-th True position of masked."""
    if not shift:
        return masked
    if masked[:, 0].any():
        raise ValueError("under shift, position 0 cannot be denoised (no logits at -1): it must not be masked")
    return F.pad(masked[:, 1:], (0, 1), value=False)


def masked_logits(model, xt, masked, attn=None, shift=None, output_hidden_states=False):
    """-> logits (n_masked, V) for the masked positions in row-major order (row k predicts x0[masked][k]),
    and Hugging Face's hidden_states list when asked (else None). One forward; lm_head on n_masked rows only.
    attn, shift: default the checkpoint's config."""
    c = model.config
    attn = c.attn if attn is None else attn
    shift = c.shift if shift is None else shift
    if shift is None:
        raise ValueError("the model's config has no `shift`: is it a DLM converted by convert.py?")
    h, hidden = model.model(xt, attn, c.block_size, output_hidden_states)  # (B, T, C)
    return model.lm_head(h[denoiser_rows(masked, shift)]), hidden


def diffusion_loss(model, x0, xt, masked, t, norm="mean", attn=None, shift=None, prompt_lens=None,
                   extra_ce=False, output_hidden_states=False):
    """The masked-diffusion loss: -> scalar, or (scalar, hidden_states) with output_hidden_states.
    norm="mean": the mean cross-entropy over masked tokens (the REPR-ALIGN code).
    norm="elbo": sum over masked tokens of CE / t, divided by the number of tokens that can be masked
        (T, or T-1 under shift, less the prompt), averaged over sequences (LLaDA/MDLM): the negative ELBO
        in nats per token, an upper bound on -log p(x0) per token.
    extra_ce: add the public REPR-ALIGN code's exp(-CE)·CE per masked token, exp(-CE) detached (the
        probability of the true token): its gradient is p·grad CE, i.e. confident tokens weigh up to twice."""
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    logits, hidden = masked_logits(model, xt, masked, attn, shift, output_hidden_states)
    ce = F.cross_entropy(logits.float(), x0[masked], reduction="none")  # CE_i = -log p_θ(x0_i | xt), (n_masked,)
    if extra_ce:
        ce = ce + torch.exp(-ce.detach()) * ce  # CE_i + sg(exp(-CE_i)) · CE_i
    if norm == "mean":
        loss = ce.sum() / masked.sum().clamp(min=1)  # L = (1/|M|) Σ_{(b,i)∈M} CE_{b,i}
    else:
        B, T = x0.shape
        shift = model.config.shift if shift is None else shift
        n_tok = maskable(B, T, shift, prompt_lens, x0.device).sum(1).clamp(min=1)  # (B,) tokens modelled
        w = (1.0 / (t.float() * n_tok))[:, None].expand(B, T)[masked]  # 1 / (t_b · L_b) per masked token
        loss = (ce * w).sum() / B  # L = (1/B) Σ_b (1/L_b) Σ_{i∈M_b} CE_{b,i} / t_b
    return (loss, hidden) if output_hidden_states else loss


def sequence_elbo(model, x0, masked, t, attn=None):
    """(B,) one draw of each sequence's ELBO term: -Σ_{i∈M_b} CE_{b,i} / t_b, for the given masks and rates (no
    normalisation). With M drawn at rate t ~ U(0, 1) over a response alone, its mean over draws is the bound
    log p(response | prompt) >= -E_{t,M}[Σ_{i∈M} CE_i / t] (LLaDA); merge.py's implicit rewards use it."""
    xt = torch.where(masked, torch.full_like(x0, model.config.mask_token_id), x0)
    logits, _ = masked_logits(model, xt, masked, attn)
    ce = F.cross_entropy(logits.float(), x0[masked], reduction="none")  # CE_i = -log p_θ(x0_i | xt), (n_masked,)
    rows = masked.nonzero()[:, 0]  # the sequence of each masked token, in masked_logits' row-major order
    return -torch.zeros(x0.shape[0], device=x0.device).index_add(0, rows, ce / t.float()[rows])  # -Σ_{i∈M_b} CE_{b,i} / t_b


@torch.no_grad()
def fixed_mask_eval(model, batches, ctx=None, ratios=(0.15, 0.5, 0.9), seed=1234, elbo_eps=1e-3):
    """On fixed batches with fixed masks (one generator, seeded here, so every call and every checkpoint sees
    the same corruptions): masked-token accuracy and mean CE at each mask ratio, and a one-draw negative ELBO
    (nats/token, t ~ U(elbo_eps, 1-elbo_eps)). Shared by align.py's evaluation and eval.py's likelihood."""
    c, g = model.config, torch.Generator().manual_seed(seed)
    ctx = ctx or contextlib.nullcontext()
    ce, acc, n, nelbo = [0.0] * len(ratios), [0] * len(ratios), [0] * len(ratios), 0.0
    for x0 in batches:
        with ctx:
            for k, r in enumerate(ratios):
                xt, masked, _ = corrupt(x0, c.mask_token_id, c.shift, g, t=r)
                logits, _ = masked_logits(model, xt, masked)
                target = x0[masked]
                ce[k] += F.cross_entropy(logits.float(), target, reduction="sum").item()
                acc[k] += (logits.argmax(-1) == target).sum().item()
                n[k] += target.numel()
            xt, masked, t = corrupt(x0, c.mask_token_id, c.shift, g, elbo_eps)
            nelbo += diffusion_loss(model, x0, xt, masked, t, "elbo").item() / len(batches)
    n = [max(v, 1) for v in n]
    return {**{f"val_loss@{r}": ce[k] / n[k] for k, r in enumerate(ratios)},
            **{f"val_acc@{r}": acc[k] / n[k] for k, r in enumerate(ratios)}, "val_nelbo": nelbo}
