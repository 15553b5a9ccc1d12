"""diffusion.py: what may be masked, how often, reproducibly; both loss normalisations against a slow,
obvious re-implementation (loops over batch and positions, logits from a plain full forward), under both
shift conventions (the off-by-one). Block DLMs: per-block rates, and the BD3-LM bound and masked-token accuracy
against a loop of one plain block-attention forward per row and block over [x0_<b, xt_b]; bidirectional DLMs
keep the numbers of the code before block models were scored that way (kept here as the reference)."""
import math

import pytest
import torch
import torch.nn.functional as F

import diffusion
import model as model_module
from diffusion import corrupt, denoiser_ce, denoiser_rows, diffusion_loss, maskable
from model import Qwen3, left_padded, preset

MASK = 259


def dlm(shift, seed=0):
    return Qwen3(preset("micro", attn="bidirectional", mask_token_id=MASK, shift=shift)).init_weights(seed)


def test_maskable_excludes_position_zero_under_shift_and_the_prompt():
    assert maskable(2, 5, shift=False).all()
    m = maskable(2, 5, shift=True)
    assert not m[:, 0].any() and m[:, 1:].all()
    m = maskable(3, 6, shift=True, prompt_lens=torch.tensor([0, 1, 4]))
    assert m.tolist() == [[False, True, True, True, True, True], [False, True, True, True, True, True],
                          [False, False, False, False, True, True]]
    assert maskable(1, 4, shift=False, prompt_lens=torch.tensor([2])).tolist() == [[False, False, True, True]]


@pytest.mark.parametrize("shift", [True, False])
def test_corrupt_never_masks_excluded_positions(shift):
    x0 = torch.randint(0, 256, (64, 20))
    lens = torch.randint(0, 10, (64,))
    xt, masked, t = corrupt(x0, MASK, shift, torch.Generator().manual_seed(0), t=0.99, prompt_lens=lens)
    assert not (masked & ~maskable(64, 20, shift, lens)).any()
    assert (xt[masked] == MASK).all() and torch.equal(xt[~masked], x0[~masked])
    assert masked.any() and t.shape == (64,)


def test_masking_rate_is_t_and_t_is_uniform_in_eps_range():
    x0 = torch.zeros(400, 500, dtype=torch.long)
    for r in (0.1, 0.5, 0.9):
        _, masked, _ = corrupt(x0, MASK, False, torch.Generator().manual_seed(1), t=r)
        assert abs(masked.float().mean().item() - r) < 0.005
    _, masked, t = corrupt(x0, MASK, True, torch.Generator().manual_seed(2), eps=0.1)
    assert t.min() >= 0.1 and t.max() <= 0.9 and abs(t.mean().item() - 0.5) < 0.05
    rate = masked[:, 1:].float().mean(1)  # per sequence, over the maskable positions
    assert (rate - t).abs().max() < 0.1  # each row's rate follows its own t


def test_fixed_generator_gives_identical_masks():
    x0 = torch.randint(0, 256, (4, 50))
    a = corrupt(x0, MASK, True, torch.Generator().manual_seed(7))
    b = corrupt(x0, MASK, True, torch.Generator().manual_seed(7))
    c = corrupt(x0, MASK, True, torch.Generator().manual_seed(8))
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not torch.equal(a[1], c[1])


def test_denoiser_rows_off_by_one():
    masked = torch.tensor([[False, False, True, False, True]])
    assert denoiser_rows(masked, shift=True).tolist() == [[False, True, False, True, False]]
    assert torch.equal(denoiser_rows(masked, shift=False), masked)
    with pytest.raises(ValueError, match="position 0"):
        denoiser_rows(torch.tensor([[True, False]]), shift=True)


def slow_loss(model, x0, xt, masked, t, norm, shift, prompt_lens=None):
    """Loops: the logits of a plain full forward, read at i-1 (shift) or i for each masked i."""
    logits = model(xt, attn="bidirectional")
    B, T = x0.shape
    per_seq, total, count = [], 0.0, 0
    for b in range(B):
        s = 0.0
        for i in range(T):
            if masked[b, i]:
                row = logits[b, i - 1] if shift else logits[b, i]
                ce = -torch.log_softmax(row.double(), -1)[x0[b, i]]
                s, total, count = s + ce / t[b], total + ce, count + 1
        n_tok = T - max(int(shift), 0 if prompt_lens is None else int(prompt_lens[b]))  # maskable tokens
        per_seq.append(s / n_tok)
    return total / count if norm == "mean" else sum(per_seq) / B


@pytest.mark.parametrize("shift", [True, False])
@pytest.mark.parametrize("norm", ["mean", "elbo"])
def test_losses_match_slow_reimplementation(shift, norm):
    model = dlm(shift)
    x0 = torch.randint(0, 256, (3, 12), generator=torch.Generator().manual_seed(3))
    lens = torch.tensor([0, 2, 5])
    for prompt_lens in (None, lens):
        xt, masked, t = corrupt(x0, MASK, shift, torch.Generator().manual_seed(4), eps=0.2, prompt_lens=prompt_lens)
        got = diffusion_loss(model, x0, xt, masked, t, norm, prompt_lens=prompt_lens)
        want = slow_loss(model, x0, xt, masked, t, norm, shift, prompt_lens)
        assert torch.allclose(got.double(), want, atol=1e-5), (got, want)
    if shift:  # reading the same masks at i instead of i-1 gives another number: the test sees an off-by-one
        wrong = diffusion_loss(model, x0, xt, masked, t, norm, shift=False, prompt_lens=prompt_lens)
        assert not torch.allclose(wrong.double(), want, atol=1e-3)


def masked_logits(model, xt, masked, output_hidden_states=False):
    """The logits (n_masked, V) that denoise the masked positions, row-major: lm_head on those rows alone."""
    return model(xt, rows=denoiser_rows(masked, model.config.shift), output_hidden_states=output_hidden_states)


def test_masked_logits_rows_and_hidden_states_come_from_one_forward():
    model = dlm(True)
    x0 = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(5))
    xt, masked, t = corrupt(x0, MASK, True, torch.Generator().manual_seed(6), t=0.5)
    logits, hidden = masked_logits(model, xt, masked, output_hidden_states=True)
    full, full_hidden = model(xt, output_hidden_states=True)
    assert torch.allclose(logits, full[:, :-1][masked[:, 1:]], atol=1e-6)  # row i-1 for masked i
    assert len(hidden) == model.config.num_hidden_layers + 1
    assert all(torch.allclose(a, b) for a, b in zip(hidden, full_hidden))
    loss, h2 = diffusion_loss(model, x0, xt, masked, t, output_hidden_states=True)
    assert len(h2) == len(hidden) and loss.ndim == 0


def test_extra_ce_term_value_and_gradient_weight():
    model = dlm(False)
    x0 = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(8))
    xt, masked, t = corrupt(x0, MASK, False, torch.Generator().manual_seed(9), t=0.6)
    logits = masked_logits(model, xt, masked)
    ce = torch.nn.functional.cross_entropy(logits, x0[masked], reduction="none")
    got = diffusion_loss(model, x0, xt, masked, t, extra_ce=True)
    assert torch.allclose(got, (ce + torch.exp(-ce) * ce).mean(), atol=1e-6)
    # exp(-CE) is detached: d/dCE of the term is exp(-CE), not exp(-CE)(1 - CE)
    c = ce.detach().clone().requires_grad_()
    (c + torch.exp(-c.detach()) * c).sum().backward()
    assert torch.allclose(c.grad, 1 + torch.exp(-ce.detach()))


def test_no_masked_token_gives_zero_not_nan():
    model = dlm(True)
    x0 = torch.randint(0, 256, (2, 6))
    masked = torch.zeros(2, 6, dtype=torch.bool)
    for norm in ("mean", "elbo"):
        assert diffusion_loss(model, x0, x0, masked, torch.full((2,), 0.5), norm).item() == 0.0
    assert math.isfinite(diffusion_loss(model, x0, x0, masked, torch.full((2,), 0.5)).item())


# ---- block DLMs: the BD3-LM bound ------------------------------------------------------------------------------

def block_dlm(shift, seed=0, bs=4):
    return Qwen3(preset("micro", attn="block", block_size=bs, mask_token_id=MASK, shift=shift)).init_weights(seed)


def test_corrupt_per_block_rates():
    x0 = torch.zeros(300, 22, dtype=torch.long)  # 6 blocks of 4, the last one partial
    xt, masked, t = corrupt(x0, MASK, True, torch.Generator().manual_seed(0), eps=0.1, block_size=4)
    assert t.shape == (300, 22) and not masked[:, 0].any()
    blocks = torch.nn.functional.pad(t, (0, 2), value=-1).view(300, 6, 4)
    assert (blocks[:, :5] == blocks[:, :5, :1]).all() and (t[:, 20:] == t[:, 20:21]).all()  # one t per block
    assert t.min() >= 0.1 and t.max() <= 0.9 and blocks[:, :, 0].std(1).mean() > 0.1  # blocks draw their own t
    assert abs(masked[:, 1:].float().mean().item() - t[:, 1:].mean().item()) < 0.01  # P(masked) = its block's t
    ts = torch.tensor([[0.0, 1.0, 0.0, 1.0, 0.0, 1.0]]).expand(2, 6)  # a given t (B, n_blocks)
    _, m, t2 = corrupt(torch.zeros(2, 22, dtype=torch.long), MASK, False, t=ts, block_size=4)
    assert torch.equal(m, (torch.arange(22) // 4 % 2 == 1).expand(2, 22)) and t2.shape == (2, 22)


def slow_block_logp(model, x0, xt):
    """(B, T, V) log-probs, entry [b, i] the denoiser's distribution for position i: for each row and block one
    forward of the model's plain block rule over [x0_<blk, xt_blk], read at i - shift (under shift, a block's first
    position at the clean token before it). Row 0 under shift is never read (nothing predicts position 0)."""
    bs, shift = model.config.block_size, int(model.config.shift)
    B, T = x0.shape
    out = torch.zeros(B, T, model.config.vocab_size, dtype=torch.float64)
    for b in range(B):
        for s in range(0, T, bs):
            e = min(s + bs, T)
            logp = F.log_softmax(model(torch.cat([x0[b, :s], xt[b, s:e]])[None], attn="block")[0].double(), -1)
            for i in range(max(s, shift), e):
                out[b, i] = logp[i - shift]
    return out


def slow_block_eval(model, batches, ratios, seed, eps):
    """fixed_mask_eval by loops: the same generator, draws in the same order, the slow per-block log-probs."""
    c, g = model.config, torch.Generator().manual_seed(seed)
    ce, acc, n, nelbo = [0.0] * len(ratios), [0] * len(ratios), [0] * len(ratios), 0.0
    for x0 in batches:
        B, T = x0.shape
        for k, r in enumerate(ratios):
            xt, masked, _ = corrupt(x0, c.mask_token_id, c.shift, g, t=r)
            logp = slow_block_logp(model, x0, xt)
            for b, i in masked.nonzero().tolist():
                ce[k] -= logp[b, i, x0[b, i]].item()
                acc[k] += int(logp[b, i].argmax() == x0[b, i])
                n[k] += 1
        xt, masked, t = corrupt(x0, c.mask_token_id, c.shift, g, eps, block_size=c.block_size)
        logp = slow_block_logp(model, x0, xt)
        per_seq = [sum(-logp[b, i, x0[b, i]].item() / t[b, i].item() for i in range(T) if masked[b, i])
                   / (T - int(c.shift)) for b in range(B)]  # Σ_blocks Σ_{i∈M_blk} CE_i / t_blk, per modelled token
        nelbo += sum(per_seq) / B / len(batches)
    return ce, acc, n, nelbo


@pytest.mark.parametrize("shift", [False, True])
def test_block_bound_and_accuracy_equal_the_per_block_loop(shift):
    model = block_dlm(shift)
    g = torch.Generator().manual_seed(11)
    batches = [torch.randint(0, 256, (3, 18), generator=g) for _ in range(2)]  # 4 blocks of 4 and a partial one
    ratios = (0.3, 0.8)
    got = diffusion.fixed_mask_eval(model, batches, ratios=ratios, seed=5, elbo_eps=0.05)
    ce, acc, n, nelbo = slow_block_eval(model, batches, ratios, 5, 0.05)
    for k, r in enumerate(ratios):
        assert got[f"val_loss@{r}"] == pytest.approx(ce[k] / n[k], rel=1e-5)
        assert got[f"val_acc@{r}"] == acc[k] / n[k]
    assert got["val_nelbo"] == pytest.approx(nelbo, rel=1e-5)
    # and not the old scoring: the whole corrupted window under the block rule gives other numbers
    old = old_fixed_mask_eval(model, batches, ratios, 5, 0.05)
    assert abs(old["val_loss@0.8"] - got["val_loss@0.8"]) > 1e-3


@pytest.mark.parametrize("shift", [False, True])
def test_block_logits_equal_per_block_logits_with_a_prompt_and_pads(shift):
    """distill.py's layout: prompts left-padded to P, the clean [prompt, x0] then the noisy copy."""
    model, bs, P, N = block_dlm(shift), 4, 8, 12
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, 256, (3, P + N), generator=g)
    real, pos = left_padded(torch.tensor([8, 5, 1]), P, P + N)
    masked = torch.rand(3, N, generator=g) < 0.5
    masked[:, ::bs] = True  # every block's first position: under shift, read at the clean slot before the block
    xt = x[:, P:].masked_fill(masked, MASK)
    kw = dict(P=P, real=real, pos=pos)
    fast = diffusion.block_logits(model, x, xt, masked, **kw)
    slow = diffusion.per_block_logits(model, x, xt, masked, **kw)
    assert fast.shape == slow.shape == (int(masked.sum()), 320) and torch.allclose(fast, slow, atol=1e-5)
    for blk in range(N // bs):  # row 0 (no pads) against the model's own "block" mode, block by block
        s = P + bs * blk
        want = model(torch.cat([x[0, :s], xt[0, s - P:s - P + bs]])[None], attn="block")[0, s - int(shift)]
        k = int(masked[0, :s - P].sum())  # row-major index of this block's first position (always masked)
        assert torch.allclose(fast[k], want, atol=1e-5)
    with pytest.raises(ValueError, match="multiple of the block size"):
        diffusion.block_logits(model, x[:, 2:], xt, masked, P=P - 2)


def test_block_scoring_refuses_position_zero_under_shift_and_hidden_states():
    model = block_dlm(True)
    x0 = torch.randint(0, 256, (2, 8))
    masked = torch.zeros(2, 8, dtype=torch.bool)
    masked[0, 0] = True
    with pytest.raises(ValueError, match="position 0"):
        diffusion.block_logits(model, x0, x0, masked)
    with pytest.raises(ValueError, match="hidden states are not offered"):
        denoiser_ce(model, x0, x0, masked.roll(1, 1), output_hidden_states=True)


# ---- bidirectional DLMs keep their numbers ---------------------------------------------------------------------

def old_fixed_mask_eval(model, batches, ratios, seed, elbo_eps):
    """The code before block DLMs were scored as BD3-LM, inlined: per-sequence t, one forward over the corrupted
    window under the model's own rule, the ELBO weight 1 / (t_b L_b)."""
    c, g = model.config, torch.Generator().manual_seed(seed)

    def old_corrupt(x0, t=None):
        B, T = x0.shape
        if t is None:
            t = elbo_eps + (1 - 2 * elbo_eps) * torch.rand(B, generator=g)
        t = torch.as_tensor(t, dtype=torch.float32).expand(B)
        u = torch.rand(B, T, generator=g)
        masked = (u < t[:, None]) & (torch.arange(T) >= int(bool(c.shift))).expand(B, T)
        return torch.where(masked, torch.full_like(x0, c.mask_token_id), x0), masked, t

    def old_logits(xt, masked):
        h, _ = model.model(xt, c.attn, block_size=c.block_size)
        return model.lm_head(h[F.pad(masked[:, 1:], (0, 1), value=False) if c.shift else masked])

    ce, acc, n, nelbo = [0.0] * len(ratios), [0] * len(ratios), [0] * len(ratios), 0.0
    with torch.no_grad():
        for x0 in batches:
            for k, r in enumerate(ratios):
                xt, masked, _ = old_corrupt(x0, r)
                logits = old_logits(xt, masked)
                ce[k] += F.cross_entropy(logits.float(), x0[masked], reduction="sum").item()
                acc[k] += (logits.argmax(-1) == x0[masked]).sum().item()
                n[k] += int(masked.sum())
            xt, masked, t = old_corrupt(x0)
            B, T = x0.shape
            cel = F.cross_entropy(old_logits(xt, masked).float(), x0[masked], reduction="none")
            n_tok = torch.full((B,), T - int(bool(c.shift)))
            w = (1.0 / (t.float() * n_tok))[:, None].expand(B, T)[masked]
            nelbo += ((cel * w).sum() / B).item() / len(batches)
    return {**{f"val_loss@{r}": ce[k] / n[k] for k, r in enumerate(ratios)},
            **{f"val_acc@{r}": acc[k] / n[k] for k, r in enumerate(ratios)}, "val_nelbo": nelbo}


@pytest.mark.parametrize("shift", [False, True])
def test_bidirectional_numbers_unchanged(shift):
    model = dlm(shift)
    g = torch.Generator().manual_seed(12)
    batches = [torch.randint(0, 256, (4, 20), generator=g) for _ in range(2)]
    got = diffusion.fixed_mask_eval(model, batches, ratios=(0.15, 0.5, 0.9), seed=1234)
    assert got == old_fixed_mask_eval(model, batches, (0.15, 0.5, 0.9), 1234, 1e-3)  # bit for bit


@pytest.mark.parametrize("shift", [False, True])
def test_chunked_evaluation_equals_one_piece(shift, monkeypatch):
    """Qwen3.cross_entropy without grad takes CE_ROWS rows at a time: the same cross-entropies (to rounding) and
    argmaxes as one piece; with grad it is one piece whatever CE_ROWS is, so its gradient is F.cross_entropy's."""
    model = dlm(shift)
    g = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, 256, (4, 20), generator=g) for _ in range(2)]
    whole = diffusion.fixed_mask_eval(model, batches, ratios=(0.15, 0.9), seed=1234)
    monkeypatch.setattr(model_module, "CE_ROWS", 3)
    chunked = diffusion.fixed_mask_eval(model, batches, ratios=(0.15, 0.9), seed=1234)
    assert chunked.keys() == whole.keys()
    for k in whole:
        assert chunked[k] == pytest.approx(whole[k], rel=1e-6, abs=1e-9), k
    h = torch.randn(10, model.config.hidden_size, requires_grad=True)
    target = torch.randint(0, 256, (10,), generator=g)
    ce = model.cross_entropy(h, target)
    ref = F.cross_entropy(model.lm_head(h).float(), target, reduction="none")
    assert torch.equal(ce, ref)
    assert torch.equal(torch.autograd.grad(ce.sum(), h)[0], torch.autograd.grad(ref.sum(), h)[0])
    with torch.no_grad():
        ce, top = model.cross_entropy(h, target, argmax=True)
        torch.testing.assert_close(ce, ref.detach(), rtol=1e-6, atol=1e-6)
        assert torch.equal(top, model.lm_head(h).argmax(-1))


def test_corrupt_where_limits_the_masks():
    """where: only those positions may be masked; the draws are otherwise the same (same generator state)."""
    x0 = torch.arange(2 * 12).view(2, 12)
    where = torch.zeros(2, 12, dtype=torch.bool)
    where[0, 5:], where[1, 2:4] = True, True
    xt, m, t = diffusion.corrupt(x0, 99, True, torch.Generator().manual_seed(0), t=0.7, where=where)
    xt_all, m_all, _ = diffusion.corrupt(x0, 99, True, torch.Generator().manual_seed(0), t=0.7)
    assert torch.equal(m, m_all & where) and torch.equal(xt, torch.where(m, 99, x0)) and m.any()
