"""diffusion.py: what may be masked, how often, reproducibly; both loss normalisations against a slow,
obvious re-implementation (loops over batch and positions, logits from a plain full forward), under both
shift conventions (the off-by-one)."""
import math

import pytest
import torch

from diffusion import corrupt, denoiser_rows, diffusion_loss, maskable, masked_logits
from model import Qwen3, preset

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
    logits, _ = masked_logits(model, xt, masked)
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
