"""distill.py: the vectorised [prompt, x0, xt] mask against a slow construction, the vectorised loss against one forward
per block (shift false and true, ragged prompts), the state construction from recorded rounds, the off policy's random
states of the rollout itself, per-row tokens per forward by hand, the evaluation's KL on fixed masks of real text
against a row-by-row, block-by-block reference, the teacher's targets off by one, the divergences against slow loops
(the sparse top-k one unrenormalised, by hand), the seq and token reductions against loops over rows, eos/padding
exclusion, two end ids (valid positions against a loop, rollouts, data-window padding, the script's wiring), the
quarter-cosine curriculum, the FlexAttention BlockMask against the dense mask (flex_attention runs eagerly on CPU,
forward only), the number of graphs --compile makes over a curriculum (a counting backend, no real
compile), and the script: learning, the final evaluation at --rollout_max, resume == no interruption, both ablations,
flags and refusals."""
import json
import math

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounter
from torch.nn.attention.flex_attention import create_mask

import diffusion
import distill
from conftest import run_script, world_copy, killed_after_checkpoint
from model import Qwen3
from sample import block_generate
from lib import data
from lib.tokenizer import Tokenizer

SMALL = ["--batch_size", "4", "--seq_len", "12", "--rollout_min", "8", "--rollout_max", "16", "--curriculum_steps", "4",
         "--eval_batches", "1", "--warmup", "1", "--num_prompts", "32"]
EOS = 256


@pytest.fixture(scope="module")
def world(base_world, tmp_path_factory):
    return world_copy(base_world, tmp_path_factory)


def student_of(world, name):
    s = Qwen3.from_pretrained(world / name)
    with torch.no_grad():  # make the student differ from the teacher
        for q in s.parameters():
            q.add_(0.02 * torch.randn(q.shape, generator=torch.Generator().manual_seed(1)))
    return s


def ragged_batch(P=8, N=12, seed=0):
    """x (3, P + N): left-padded prompts of 8, 5, 1 tokens, then random 'generated' tokens (no eos)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor([8, 5, 1])
    x = torch.randint(0, 250, (3, P + N), generator=g)
    x[:, :P] = torch.where(torch.arange(P) < P - lens[:, None], EOS, x[:, :P])
    masked = torch.rand(3, N, generator=g) < 0.5
    masked[:, 0] = True
    return x, lens, P, masked


def test_train_mask_matches_slow_construction():
    bs, P, N = 4, 8, 12
    lens = torch.tensor([8, 3, 1])
    real, _ = distill.left_padded(lens, P, P + N)
    m = diffusion.train_mask(real, N, bs)
    L = P + N
    assert m.shape == (3, 1, L + N, L + N)
    for b in range(3):
        for q in range(L + N):
            for k in range(L + N):
                if q == k:
                    want = True
                elif k < L and not real[b, k]:
                    want = False  # pads are hidden
                elif q < L:  # clean stream: block-causal over the clean stream only
                    want = k < L and k // bs <= q // bs
                else:  # noisy copy of block g = (q - N) // bs
                    g = (q - N) // bs
                    want = (k < L and k // bs < g) or (k >= L and (k - N) // bs == g)
                assert bool(m[b, 0, q, k]) == want, (b, q, k)


def test_flex_block_mask_equals_train_mask():
    bs, P, N = 4, 64, 48  # T = 160: 2 x 2 blocks of 128
    lens = torch.tensor([64, 30, 1])
    real, _ = distill.left_padded(lens, P, P + N)
    dense = diffusion.train_mask(real, N, bs)  # (B, 1, T, T)
    bm = diffusion.train_mask(real, N, bs, flex=True)
    T = P + 2 * N
    assert bm.shape == (3, 1, T, T)
    assert torch.equal(create_mask(bm.mask_mod, 3, 1, T, T, device="cpu"), dense)  # position by position
    # block level: exactly the 128 x 128 tiles holding an allowed pair are computed (the upper right one is not)
    tiles = F.pad(dense, (0, 256 - T, 0, 256 - T)).view(3, 1, 2, 128, 2, 128).any(5).any(3)
    assert torch.equal(bm.to_dense().bool(), tiles) and not tiles[:, :, 0, 1].any()


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name", ["block", "block_shift"])
def test_flex_student_logits_equal_dense(world, name):
    student = student_of(world, name)
    x, lens, P, masked = ragged_batch()
    real, pos = distill.left_padded(lens, P, x.shape[1])
    xt = x[:, P:].masked_fill(masked, 259)
    with torch.no_grad():  # flex_attention has no backward on CPU
        dense = diffusion.block_logits(student, x, xt, masked, P=P, real=real, pos=pos, flex=False)
        flex = diffusion.block_logits(student, x, xt, masked, P=P, real=real, pos=pos, flex=True)
    assert torch.allclose(flex, dense, atol=1e-5)


def loss_kw(**kw):
    return dict(eos_id=EOS, vocab_size=256, **kw)


def per_block_loss(monkeypatch, *args, **kw):
    """distill_loss with the student's denoiser read by its definition, one forward per block (per_block_logits)."""
    with monkeypatch.context() as m:
        m.setattr(distill, "block_logits", lambda *a, flex=False, **k: diffusion.per_block_logits(*a, **k))
        return distill.distill_loss(*args, **kw)


@pytest.mark.parametrize("name", ["block", "block_shift"])
def test_vectorised_loss_equals_per_block_reference(world, name, monkeypatch):
    student, teacher = student_of(world, name), Qwen3.from_pretrained(world / "ar")
    x, lens, P, masked = ragged_batch()
    real, pos = distill.left_padded(lens, P, x.shape[1])
    xt = x[:, P:].masked_fill(masked, 259)
    fast = diffusion.block_logits(student, x, xt, masked, P=P, real=real, pos=pos)
    slow = diffusion.per_block_logits(student, x, xt, masked, P=P, real=real, pos=pos)
    assert fast.shape == slow.shape == (int(masked.sum()), 320)
    assert torch.allclose(fast, slow, atol=1e-5)
    for div in ("fkl", "rkl", "jsd"):
        for red in ("seq", "token"):
            kw = loss_kw(divergence=div, reduction=red)
            l1, s1 = distill.distill_loss(student, teacher, x, lens, P, masked, **kw)
            l2, _ = per_block_loss(monkeypatch, student, teacher, x, lens, P, masked, **kw)
            assert torch.allclose(l1, l2, atol=1e-6) and l1 > 0
    # gradients agree too
    l1, _ = distill.distill_loss(student, teacher, x, lens, P, masked, **loss_kw())
    g1 = torch.autograd.grad(l1, list(student.parameters()))
    l2, _ = per_block_loss(monkeypatch, student, teacher, x, lens, P, masked, **loss_kw())
    g2 = torch.autograd.grad(l2, list(student.parameters()))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g1, g2))


def test_seq_and_token_reductions_against_loops(world):
    """The loss against per-position divergences summed by hand: seq = the mean over rows (with a masked, valid
    position) of each row's mean; token = the mean over all positions. Row 2 has none: seq leaves it out."""
    student, teacher = student_of(world, "block"), Qwen3.from_pretrained(world / "ar")
    x, lens, P, masked = ragged_batch()
    masked[1], masked[2] = True, False  # rows of 12, about 6, and 0 positions: seq and token differ
    real, pos = distill.left_padded(lens, P, x.shape[1])
    xt = x[:, P:].masked_fill(masked, 259)
    with torch.no_grad():
        t = distill.teacher_logits(teacher, x, real, pos, P, masked)[:, :256]
        d = distill.token_divergence(t, diffusion.per_block_logits(student, x, xt, masked, P=P, real=real,
                                                                   pos=pos)[:, :256]).tolist()
        seq, _ = distill.distill_loss(student, teacher, x, lens, P, masked, **loss_kw(reduction="seq"))
        tok, _ = distill.distill_loss(student, teacher, x, lens, P, masked, **loss_kw(reduction="token"))
    rows, k = [], 0
    for b in range(3):
        n = int(masked[b].sum())
        if n:
            rows.append(sum(d[k:k + n]) / n)
        k += n
    assert len(rows) == 2 and seq.item() == pytest.approx(sum(rows) / 2, rel=1e-5)
    assert tok.item() == pytest.approx(sum(d) / len(d), rel=1e-5) and abs(seq.item() - tok.item()) > 1e-4
    assert distill.reduce_kl(torch.tensor([]), torch.tensor([], dtype=torch.long), 3).item() == 0.0


def test_state_construction_from_hand_made_rounds():
    rounds = torch.tensor([[0, 2, 2, 3, 1, 0, 1, 0, 0, 0, 0, 0, -1, -1, -1, -1]])
    picks = {0: set(), 1: set(), 2: set()}
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    for _ in range(600):
        m = distill.rollout_states(rounds, 4, g)
        for blk in range(4):
            r, mb = rounds[0, 4 * blk:4 * blk + 4], m[0, 4 * blk:4 * blk + 4]
            if blk == 3:
                assert not mb.any()  # never generated (eos stop): nothing masked
                continue
            chosen = int(r[mb].min())  # the re-masked positions are exactly those committed at/after it
            assert torch.equal(mb, r >= chosen) and chosen in r.tolist()
            picks[blk].add(chosen)
            if blk == 0:
                counts[chosen] += 1
        assert m[0, 3] and m[0, 8:12].all()  # the last round of a block is always re-masked
    # every used round, never an unused one (1 in block 0)
    assert picks[0] == {0, 2, 3} and picks[1] == {0, 1} and picks[2] == {0}
    assert ((counts[[0, 2, 3]] / 600 - 1 / 3).abs() < 0.07).all()  # uniform over the used rounds


def test_states_from_a_real_rollout(world):
    student = Qwen3.from_pretrained(world / "block")
    g = torch.Generator().manual_seed(3)
    gen = block_generate(student, [[1, 2, 3], [4, 5, 6, 7, 8]], 16, 4, 0.05, 1.0, record=True, generator=g)
    m = distill.rollout_states(gen.rounds, 4, g)
    r = gen.rounds.view(2, 4, 4)
    assert (r >= 0).all() and m.view(2, 4, 4).any(-1).all()  # every block has a state with >= 1 masked position
    for b in range(2):
        for blk in range(4):
            rb, mb = r[b, blk], m.view(2, 4, 4)[b, blk]
            assert torch.equal(mb, rb >= rb[mb].min())


def test_random_states_mask_1_to_bs_per_block():
    m = distill.random_states(50, 16, 4, torch.Generator().manual_seed(0), "cpu")
    per = m.view(50, 4, 4).sum(-1)
    assert per.min() == 1 and per.max() == 4 and set(per.flatten().tolist()) == {1, 2, 3, 4}


def test_off_policy_states_are_random_masks_of_the_rollout(world):
    """--policy off: the same rollout as on-policy (same generator state: same tokens), masked by random_states
    drawn next from that generator, not by the rollout's rounds; --policy data: the data continuation."""
    student = student_of(world, "block")
    items = [([1, 2, 3], [40 + i for i in range(20)]), ([4, 5, 6, 7, 8], [60 + i for i in range(20)])]
    kw = dict(eos_id=EOS, vocab_limit=256, threshold=0.001)
    on = distill.make_batch(student, items, 16, "on", torch.Generator().manual_seed(3), **kw)
    g = torch.Generator().manual_seed(3)
    off = distill.make_batch(student, items, 16, "off", g, **kw)
    assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1]) and on[2] == off[2] == 8
    assert off[4]["tokens_per_forward"] == on[4]["tokens_per_forward"] == 4  # the same rollout: one round a block
    g2 = torch.Generator().manual_seed(3)
    block_generate(student, [i for i, _ in items], 16, 4, threshold=0.001, temperature=1.0, record=True,
                   eos_id=EOS, generator=g2, vocab_limit=256)  # replays the rollout's draws on g2
    assert torch.equal(off[3], distill.random_states(2, 16, 4, g2, "cpu"))  # the next draw of the same generator
    assert not torch.equal(off[3], on[3])
    x, lens, P, masked, st = distill.make_batch(student, items, 16, "data", torch.Generator().manual_seed(3), **kw)
    assert x[0, P:].tolist() == list(range(40, 56)) and x[1, P:].tolist() == list(range(60, 76)) and st == {}
    assert masked.view(2, 4, 4).any(-1).all()


def slow_data_kl(student, teacher, items, L, batch_size, vocab=256):
    """val_kl_data by its definition, row by row: x0 the continuation cut to L and eos-padded; the block masks of
    random_states drawn batch after batch from one EVAL_SEED generator; for each block one student forward over
    [left pads, prompt, x0_<b, xt_b] under a block rule built here (pads hidden, RoPE positions from the first
    real token); the teacher's causal forward over [prompt, x0] without pads; KL(p_T || p_θ) in float64 over
    the first `vocab` ids; each row's mean over its masked positions before the first eos, then the mean over
    the batch's rows that have one, batches weighted by their rows."""
    bs, shift, mask_id = student.config.block_size, int(student.config.shift), student.config.mask_token_id
    g, total = torch.Generator().manual_seed(diffusion.EVAL_SEED), 0.0
    for k in range(0, len(items), batch_size):
        batch = items[k:k + batch_size]
        masks = distill.random_states(len(batch), L, bs, g, "cpu")
        P = -(-max(len(pr) for pr, _ in batch) // bs) * bs
        per_row = []
        for (prompt, tail), m in zip(batch, masks.tolist()):
            x0 = (tail[:L] + [EOS] * L)[:L]
            valid = [i < x0.index(EOS) if EOS in x0 else True for i in range(L)]
            pads = P - len(prompt)
            row = [0] * pads + prompt + x0
            t_logits = teacher(torch.tensor([prompt + x0]), attn="causal")[0]
            kls = []
            for blk in range(L // bs):
                idx = [i for i in range(blk * bs, (blk + 1) * bs) if m[i] and valid[i]]
                if not idx:
                    continue
                xt = [mask_id if m[i] else x0[i] for i in range(blk * bs, (blk + 1) * bs)]
                seq = row[:P + blk * bs] + xt
                T = len(seq)
                rule = torch.tensor([[(k >= pads and k // bs <= q // bs) or q == k for k in range(T)]
                                     for q in range(T)])
                pos = torch.tensor([max(0, s - pads) for s in range(T)])
                s_logits = student(torch.tensor([seq]), attn=rule[None, None], pos=pos[None])[0]
                for i in idx:
                    lt = t_logits[len(prompt) + i - 1, :vocab].double().log_softmax(-1)  # p_AR(. | prompt, x0_<i)
                    ls = s_logits[P + i - shift, :vocab].double().log_softmax(-1)
                    kls.append(float((lt.exp() * (lt - ls)).sum()))
            if kls:
                per_row.append(sum(kls) / len(kls))
        total += sum(per_row) / len(per_row) * len(batch)
    return total / len(items)


@pytest.mark.parametrize("name", ["block", "block_shift"])
def test_val_kl_data_against_slow_reference(world, name):
    """val_kl_data: fixed random block masks of the real continuations, the same for every rollout setting;
    against the row-by-row, block-by-block reference. Ragged prompts (left pads), one continuation shorter than
    L (eos-padded: its tail is not scored), two batches of unequal size."""
    student, teacher = student_of(world, name), Qwen3.from_pretrained(world / "ar")
    g = torch.Generator().manual_seed(5)
    def rand(n):
        return torch.randint(0, 250, (n,), generator=g).tolist()
    items = [(rand(8), rand(20)), (rand(5), rand(6)), (rand(3), rand(16))]
    kw = dict(batch_size=2, eos_id=EOS, vocab_size=256)
    with torch.no_grad():
        got = distill.evaluate(student, teacher, items, 12, **kw)
        want = slow_data_kl(student, teacher, items, 12, 2)
        other = distill.evaluate(student, teacher, items, 12, **kw, threshold=0.3, temperature=0.7)
    assert got["val_kl_data"] == pytest.approx(want, rel=1e-4) and want > 0
    assert other["val_kl_data"] == got["val_kl_data"] and other["val_kl"] != got["val_kl"]  # rollouts differ
    assert "val_kl_data" not in distill.evaluate(student, teacher, [(p, []) for p, _ in items], 12, **kw)


def test_rollout_tokens_per_forward_counts_each_row_up_to_its_eos(world, monkeypatch):
    """make_batch's tokens_per_forward: the mean over rows of a row's tokens up to and including its first eos over
    the forwards of its blocks up to that one (max recorded round + 1 each), recomputed here from the rollout's
    rounds, with an eos in the middle of a block (the slots after it are not tokens)."""
    student, seen, real = student_of(world, "block"), [], distill.block_generate
    monkeypatch.setattr(distill, "block_generate", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    items, kw = [([1, 2, 3], []), ([4, 5, 6, 7, 8], [])], dict(vocab_limit=256, threshold=0.3)
    distill.make_batch(student, items, 16, "on", torch.Generator().manual_seed(3), eos_id=[EOS], **kw)
    eos = int(seen[-1].generated[0, 5])  # a token row 0 writes in its second block: now an end token
    stats = distill.make_batch(student, items, 16, "on", torch.Generator().manual_seed(3), eos_id=[eos], **kw)[4]
    g, want, ends = seen[-1], [], []
    for b in range(2):
        ids = g.generated[b].tolist()
        n = next((i + 1 for i, t in enumerate(ids) if t == eos), len(ids))  # tokens up to and including the eos
        want.append(n / sum(int(g.rounds[b, k:k + 4].max()) + 1 for k in range(0, n, 4)))
        ends.append(n)
    r = g.rounds[0].view(4, 4)  # row 0 keeps filling slots after its eos while row 1 decodes: not its tokens
    every_slot = int((r >= 0).sum()) / int((r.max(-1).values + 1).sum())
    assert ends[0] <= 6 and want[0] != pytest.approx(every_slot)
    assert stats["tokens_per_forward"] == pytest.approx(sum(want) / 2)


def test_teacher_targets_condition_on_the_exact_prefix(world):
    teacher = Qwen3.from_pretrained(world / "ar")
    x, lens, P, _ = ragged_batch()
    real, pos = distill.left_padded(lens, P, x.shape[1])
    sel = torch.ones(3, x.shape[1] - P, dtype=torch.bool)
    got = distill.teacher_logits(teacher, x, real, pos, P, sel).view(3, -1, 320)
    for b in range(3):
        seq = x[b, P - int(lens[b]):]  # the prompt without pads, then x0
        for i in range(x.shape[1] - P):
            want = teacher(seq[None, :int(lens[b]) + i], attn="causal")[0, -1]  # p_AR(. | prompt, x0_<i)
            assert torch.allclose(got[b, i], want, atol=1e-5), (b, i)


def slow_div(t, s, kind):
    out = []
    for tr, sr in zip(t.double(), s.double()):
        pt, ps = tr.softmax(-1), sr.softmax(-1)
        def kl(a, b):
            return sum(a[v] * math.log(a[v] / b[v]) for v in range(len(a)) if a[v] > 0)
        m = (pt + ps) / 2
        out.append({"fkl": kl(pt, ps), "rkl": kl(ps, pt), "jsd": 0.5 * kl(pt, m) + 0.5 * kl(ps, m)}[kind])
    return torch.tensor(out)


@pytest.mark.parametrize("kind", ["fkl", "rkl", "jsd"])
def test_divergences_against_slow_loops(kind):
    g = torch.Generator().manual_seed(0)
    t, s = 3 * torch.randn(5, 11, generator=g), 3 * torch.randn(5, 11, generator=g)
    assert torch.allclose(distill.token_divergence(t, s, kind).double(), slow_div(t, s, kind), atol=1e-5)
    assert distill.token_divergence(t, t, kind).abs().max() < 1e-6
    assert (distill.token_divergence(t, s, kind) > 0).all()


def test_sparse_top_k_forward_kl_is_not_renormalised():
    g = torch.Generator().manual_seed(1)
    t, s = 3 * torch.randn(4, 20, generator=g), 3 * torch.randn(4, 20, generator=g)
    got = distill.token_divergence(t, s, "fkl", top_k=5)
    for r in range(4):
        ids = sorted(range(20), key=lambda v: -float(t[r, v]))[:5]  # the teacher's 5 most likely ids
        zt = math.log(sum(math.exp(float(v)) for v in t[r]))  # log Σ_v exp(t_v): the full softmax
        zs = math.log(sum(math.exp(float(v)) for v in s[r]))
        want = sum(math.exp(float(t[r, v]) - zt) * ((float(t[r, v]) - zt) - (float(s[r, v]) - zs)) for v in ids)
        assert abs(float(got[r]) - want) < 1e-5
    assert torch.allclose(distill.token_divergence(t, t, "fkl", top_k=20), torch.zeros(4), atol=1e-6)
    assert torch.allclose(distill.token_divergence(t, s, "fkl", top_k=20), distill.token_divergence(t, s), atol=1e-6)
    with pytest.raises(ValueError, match="forward KL"):
        distill.token_divergence(t, s, "rkl", top_k=5)


def test_eos_and_padding_excluded(world):
    gen_tokens = torch.tensor([[5, 6, EOS, EOS, EOS, 7], [5, 6, 7, 8, 9, 10], [EOS, 1, 2, 3, 4, 5]])
    v = distill.valid_positions(gen_tokens, EOS)
    assert v.tolist() == [[1, 1, 0, 0, 0, 0], [1] * 6, [0] * 6]
    assert distill.valid_positions(gen_tokens, EOS, train_eos=True)[0].tolist() == [1, 1, 1, 0, 0, 0]
    student, teacher = student_of(world, "block"), Qwen3.from_pretrained(world / "ar")
    x, lens, P, masked = ragged_batch()
    x[0, P + 5] = EOS  # row 0 ends at position 5
    masked[:] = True
    _, st = distill.distill_loss(student, teacher, x, lens, P, masked, **loss_kw())
    assert st["masked"] == 5 + 12 + 12  # never the eos, nor anything after it; left pads are not positions
    l1, _ = distill.distill_loss(student, teacher, x, lens, P, masked, **loss_kw())
    x1 = x.clone()
    x1[0, P + 6:] = torch.randint(0, 250, (6,))  # what follows row 0's eos changes nothing
    x1[1:, 0] = 7  # nor what the left pads of rows 1, 2 hold
    la, _ = distill.distill_loss(student, teacher, x1, lens, P, masked, **loss_kw())
    assert torch.allclose(la, l1, atol=1e-6)


def slow_valid(row, ends, train_eos):
    """Position by position: valid until the first token in `ends`, which is valid itself only with train_eos."""
    out, ended = [], False
    for t in row:
        out.append(not ended and (t not in ends or train_eos))
        ended = ended or t in ends
    return out


def test_valid_positions_with_several_end_ids_against_a_loop():
    g = torch.Generator().manual_seed(0)
    gen_tokens = torch.randint(0, 8, (64, 12), generator=g)  # ids 5 and 6 end a row: most rows meet one
    for ends in (5, [5, 6], (6, 5), [6]):
        for train_eos in (False, True):
            ids = {ends} if isinstance(ends, int) else set(ends)
            want = [slow_valid(r, ids, train_eos) for r in gen_tokens.tolist()]
            assert distill.valid_positions(gen_tokens, ends, train_eos).tolist() == want, (ends, train_eos)
    both, first = distill.valid_positions(gen_tokens, [5, 6]), distill.valid_positions(gen_tokens, 5)
    assert (both.sum(1) < first.sum(1)).any() and (both <= first).all()  # the second id ends rows earlier


def test_loss_ends_at_either_end_id(world):
    """distill_loss with eos_id a list: a row that ends at the second id trains the positions before it only."""
    student, teacher = student_of(world, "block"), Qwen3.from_pretrained(world / "ar")
    x, lens, P, masked = ragged_batch()
    x[0, P + 5], x[1, P + 8] = 258, EOS  # row 0 ends at the second id, row 1 at eos
    masked[:] = True
    kw = dict(vocab_size=256)
    _, st = distill.distill_loss(student, teacher, x, lens, P, masked, eos_id=[EOS, 258], **kw)
    assert st["masked"] == 5 + 8 + 12 and st["rollout_len"] == pytest.approx((6 + 9 + 12) / 3)
    _, st = distill.distill_loss(student, teacher, x, lens, P, masked, eos_id=EOS, **kw)
    assert st["masked"] == 12 + 8 + 12  # one id: row 0 runs on past 258
    l1, _ = distill.distill_loss(student, teacher, x, lens, P, masked, eos_id=(258, EOS), **kw)
    x[0, P + 6:] = torch.randint(0, 250, (6,))  # what follows row 0's end changes nothing
    l2, _ = distill.distill_loss(student, teacher, x, lens, P, masked, eos_id=(258, EOS), **kw)
    assert torch.allclose(l1, l2, atol=1e-6)


def test_rollouts_stop_at_every_end_id_and_data_windows_are_padded():
    """make_batch on a stand-in block student (test_sample's oracle: the token at RoPE position p is f(p)) that emits
    the second end id 2 at position 9: each rollout stops there (it fills the rest of the row), and the loss's valid
    positions end there. Data windows are padded with pad_id (default: the first end id)."""
    from test_sample import make, oracle
    def f(p):
        return torch.where(p == 9, 2, p % 40 + 3)
    student = oracle(make("block", shift=False, block_size=4), f, by="pos")
    items = [([3, 4, 5], [6, 7]), ([6, 7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17])]
    g = torch.Generator().manual_seed(0)
    for ends in ([1, 2], [2, 1]):
        x, lens, P, masked, st = distill.make_batch(student, items, 12, "on", g, eos_id=ends, vocab_limit=47)
        for b, (prompt, _) in enumerate(items):
            j = 9 - len(prompt)  # the generated index at position 9
            assert x[b, P:P + j].tolist() == f(torch.arange(len(prompt), 9)).tolist()
            assert (x[b, P + j:] == 2).all()
        assert distill.valid_positions(x[:, P:], ends).sum(1).tolist() == [6, 2]
        assert distill.valid_positions(x[:, P:], 1).sum(1).tolist() == [12, 12]
    for pad_id, want in ((None, 1), (2, 2)):
        x, lens, P, masked, st = distill.make_batch(student, items, 12, "data", g, eos_id=[1, 2], vocab_limit=47,
                                                    pad_id=pad_id)
        assert x[0, P:].tolist() == [6, 7] + [want] * 10 and x[1, P:].tolist() == [13, 14, 15, 16, 17] + [want] * 7


def test_script_rolls_out_and_pads_with_the_declared_end_ids(world, tmp_path, monkeypatch):
    """distill.py on a student whose generation_config.json declares [<|im_end|>, <|endoftext|>]: its rollouts get
    both end ids; data windows (the evaluation's val_kl_data) are padded with <|endoftext|>, the documents'
    separator (a rollout's left pads are the sampler's: the first end id)."""
    import shutil

    import model
    import sample
    student = tmp_path / "student"
    shutil.copytree(world / "block", student)
    (student / "generation_config.json").write_text(json.dumps({"eos_token_id": [258, EOS]}))
    seen, gen, canvas = [], sample.block_generate, model.canvas

    def spy(*a, **k):  # the canvas of a rollout (in sample.py) or of a data window (in distill.py)
        seen.append(("pad", a[3:5]))
        return canvas(*a, **k)
    monkeypatch.setattr(sample, "block_generate", lambda *a, **k: seen.append(("ends", k["eos_id"])) or gen(*a, **k))
    monkeypatch.setattr(sample, "canvas", spy)
    monkeypatch.setattr(model, "canvas", spy)
    r = run_script("distill.py", *common(world, tmp_path / "out"), "--init", student, "--max_iters", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    assert ("ends", [258, EOS]) in seen and all(v == [258, EOS] for k, v in seen if k == "ends")
    assert ("pad", (EOS, EOS)) in seen and ("pad", (258, 259)) in seen  # data windows; a rollout (pad, mask fill)


def test_curriculum_is_a_quarter_cosine():
    assert distill.curriculum(0, 100, 4000, 100, 4) == 100
    mid = 100 + 3900 * (1 - math.cos(math.pi / 4))  # 1242.3: a quarter-cosine is past a third of the way at half time
    assert distill.curriculum(50, 100, 4000, 100, 4) == 4 * round(mid / 4) == 1244
    assert distill.curriculum(100, 100, 4000, 100, 4) == 4000 == distill.curriculum(500, 100, 4000, 100, 4)
    vals = [distill.curriculum(s, 8, 64, 10, 4) for s in range(12)]
    assert vals == sorted(vals) and all(v % 4 == 0 for v in vals) and vals[0] == 8 and vals[-1] == 64
    assert vals[1] == 8 and vals[5] == 24 and vals[9] == 56  # 8 + 56 (1 - cos(π/2 · s/10)): 8.7, 24.4, 55.2
    assert distill.curriculum(0, 1, 3, 10, 4) == 4 and distill.curriculum(0, 8, 64, 0, 4) == 64


def common(world, out, *extra):
    return ["--init", world / "block", "--teacher", world / "ar", "--data", world / "data", "--out_dir", out, *SMALL,
            *extra]


def log(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def test_compile_makes_a_bounded_number_of_graphs(world, tmp_path, monkeypatch):
    """--compile over a curriculum of 7 lengths: one graph per kind of call (the student's rollout forward, its
    training forward with and without grad, the teacher's forward), not one per length. A counting backend
    stands in for inductor (it only counts the graphs dynamo captures and runs them eagerly)."""
    cnt, compile = CompileCounter(), torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compile(self, **kw, backend=cnt))
    out = tmp_path / "compiled"
    torch._dynamo.reset()
    try:
        r = run_script("distill.py", *common(world, out), "--compile", "--rollout_max", "40", "--curriculum_steps", "8",
                       "--max_iters", "10", "--eval_interval", "4")
        assert r.returncode == 0, r.stderr[-2000:]
        lengths = {x["max_len"] for x in log(out)}
        assert len(lengths) == 7 and cnt.frame_count <= 4, (lengths, cnt.frame_count)
        # the FlexAttention path (CUDA's) likewise: one graph over lengths below and above one 128-tile
        student, cnt.frame_count = student_of(world, "block"), 0
        student.model.compile(dynamic=True)
        with torch.no_grad():
            for N in (8, 24, 48, 64, 96):
                x, lens, P, masked = ragged_batch(N=N)
                real, pos = distill.left_padded(lens, P, x.shape[1])
                xt = x[:, P:].masked_fill(masked, 259)
                diffusion.block_logits(student, x, xt, masked, P=P, real=real, pos=pos, flex=True)
        assert cnt.frame_count <= 2, cnt.frame_count
    finally:
        torch._dynamo.reset()


def test_learns_and_logs(world, tmp_path):
    out = tmp_path / "learn"
    r = run_script("distill.py", *common(world, out), "--max_iters", "25", "--eval_interval", "24", "--lr", "3e-3")
    assert r.returncode == 0, r.stderr[-2000:]
    recs = log(out)
    assert len(recs) == 25 and all({"kl", "loss", "rollout_len", "tokens_per_forward", "tokens_per_s", "max_len"}
                                   <= set(x) for x in recs)
    assert [x["max_len"] for x in recs[:6]] == [8, 8, 12, 12, 16, 16]  # 8 + 8 (1 - cos(π/2 · s/4)), multiples of 4
    assert recs[-1]["val_kl"] < 0.8 * recs[0]["val_kl"], (recs[0]["val_kl"], recs[-1]["val_kl"])
    res = json.loads((out / "results.json").read_text())
    assert res["steps"] == 25 and res["eval_len"] == 16 and res["kl_reduction"] == "seq"
    student = Qwen3.from_pretrained(out)
    assert student.config.attn == "block"
    # the final evaluation is evaluate() at --rollout_max (16, not the curriculum's 8) on the first eval prompts
    args = distill.p.parse_args([str(a) for a in common(world, out)])
    tok = Tokenizer.byte_level()
    items = data.prompt_pool(tok, args.rollout_max, prompts=args.prompts, data_dir=args.data, seq_len=args.seq_len,
                             n=args.num_prompts)[:args.batch_size]
    teacher = Qwen3.from_pretrained(world / "ar")
    kw = dict(batch_size=4, eos_id=tok.eos_id, vocab_size=tok.vocab_size)
    want = distill.evaluate(student, teacher, items, 16, **kw)
    assert res["val_kl"] == pytest.approx(want["val_kl"], rel=1e-5)
    assert res["val_tokens_per_forward"] == pytest.approx(want["val_tokens_per_forward"], rel=1e-6)
    assert res["val_kl_data"] == pytest.approx(want["val_kl_data"], rel=1e-5) and "val_kl_data" in recs[0]
    assert distill.evaluate(student, teacher, items, 8, **kw)["val_kl"] != pytest.approx(want["val_kl"], rel=1e-3)


@pytest.mark.parametrize("flags", [[], ["--policy", "off"], ["--policy", "data", "--grad_accum", "2"]])
def test_resume_after_kill(world, tmp_path, flags):
    """Killed after its step-3 checkpoint and resumed, a run logs what the uninterrupted one logs: the published
    method, both ablations' states (their own draws of the run's generator), and micro-batches of --grad_accum."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    args = ["--max_iters", "6", "--eval_interval", "3", *flags]
    assert run_script("distill.py", *common(world, full), *args).returncode == 0
    with killed_after_checkpoint(3):
        assert run_script("distill.py", *common(world, cut), *args).returncode == 3
    r = run_script("distill.py", *common(world, cut), *args, "--resume")
    assert r.returncode == 0, r.stderr[-2000:]
    def key(recs):
        return [(x["step"], x["loss"], x["kl"], x["rollout_len"], x["masked"]) for x in recs]
    assert len({x["loss"] for x in log(full)}) == 6  # the steps differ: a resume that repeated one would show
    got, want = log(cut), log(full)
    assert key(got) == key(want[:3]) + key(want[4:])  # step 3's own record was lost with the kill
    assert got[-1]["val_kl"] == want[-1]["val_kl"]


def test_ablations_flags_and_refusals(world, tmp_path):
    for policy in ("off", "data"):
        out = tmp_path / policy
        r = run_script("distill.py", *common(world, out), "--policy", policy, "--max_iters", "2")
        assert r.returncode == 0, r.stderr[-2000:]
        recs = log(out)
        assert len(recs) == 2 and recs[0]["kl"] > 0 and "val_kl" in recs[-1]
        assert ("tokens_per_forward" in recs[0]) == (policy == "off")  # off trains on rollouts, data on data windows
    for flags in (["--divergence", "jsd"], ["--divergence", "rkl"], ["--teacher_top_k", "8", "--grad_accum", "2"],
                  ["--kl_reduction", "token"]):
        out = tmp_path / flags[1]
        r = run_script("distill.py", *common(world, out), "--init", world / "block_shift", "--max_iters", "2", *flags)
        assert r.returncode == 0, r.stderr[-2000:]
        assert all(x["loss"] > 0 for x in log(out)) and "shift=True" in r.stdout
    first = {}  # step 0 of each: the same weights, rollouts and states (same --seed), only the loss differs
    for name, flags in (("fkl", []), ("jsd", ["--divergence", "jsd"]), ("rkl", ["--divergence", "rkl"]),
                        ("top8", ["--teacher_top_k", "8"]), ("token", ["--kl_reduction", "token"]),
                        ("off", ["--policy", "off"])):
        out = tmp_path / f"step0-{name}"
        r = run_script("distill.py", *common(world, out), "--init", world / "block_shift", "--max_iters", "1", *flags)
        assert r.returncode == 0, r.stderr[-2000:]
        first[name] = log(out)[0]
    fkl = first["fkl"]
    assert fkl["loss"] == pytest.approx(fkl["kl"], rel=1e-6)  # fkl trains the KL it reports
    for name in ("jsd", "rkl", "top8"):  # the same states (kl: the full forward KL) under another divergence
        assert first[name]["kl"] == pytest.approx(fkl["kl"], rel=1e-6), name
        assert first[name]["loss"] != pytest.approx(fkl["loss"], rel=1e-3), name
    assert 0 < first["jsd"]["loss"] <= math.log(2)  # JSD is bounded by ln 2
    assert first["token"]["kl"] != pytest.approx(fkl["kl"], rel=1e-4)  # each position weighs the same, not each row
    off = first["off"]  # the same rollout, masked at random instead of at its own trajectory's states
    assert off["rollout_len"] == fkl["rollout_len"] and off["tokens_per_forward"] == fkl["tokens_per_forward"]
    assert off["loss"] != pytest.approx(fkl["loss"], rel=1e-3)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n{"prompt": "import os"}\n')
    r = run_script("distill.py", *common(world, tmp_path / "pj"), "--prompts", prompts, "--max_iters", "1")
    assert r.returncode == 0 and "2 prompts" in r.stdout, r.stderr[-2000:]
    assert "val_kl" in log(tmp_path / "pj")[-1] and "val_kl_data" not in log(tmp_path / "pj")[-1]  # no real text
    r = run_script("distill.py", *common(world, tmp_path / "pjd"), "--prompts", prompts, "--policy", "data")
    assert r.returncode == 2
    r = run_script("distill.py", *common(world, tmp_path / "bad"), "--init", world / "ar")
    assert r.returncode == 1 and "not a block DLM" in r.stderr
    r = run_script("distill.py", *common(world, tmp_path / "bad1"), "--teacher", world / "block_shift")
    assert r.returncode == 1 and "attn='causal' checkpoint is needed" in r.stderr and "AR checkpoint" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run_script("distill.py", *common(world, tmp_path / "bad2"), "--divergence", "rkl", "--teacher_top_k", "4")
    assert r.returncode == 2
    r = run_script("distill.py", *common(world, tmp_path / "nan"), "--max_iters", "5", "--eval_interval", "1",
                   "--lr", "1e12", "--grad_clip", "1e30")
    assert r.returncode == 1 and "at step" in r.stderr


def test_bf16_teacher(world, tmp_path, monkeypatch):
    """--frozen_dtype bfloat16 (the default on CUDA) on a CPU: the teacher is loaded in bf16, and training runs with
    losses those of an fp32 teacher up to bf16 rounding (the student, its rollouts and states are the same)."""
    loads, load = {}, distill.training.load_model
    monkeypatch.setattr(distill.training, "load_model", lambda path, device, what, **kw: loads.setdefault(
        what, []).append(load(path, device, what, **kw)) or loads[what][-1])
    for dtype in ("bfloat16", "float32"):
        r = run_script("distill.py", *common(world, tmp_path / dtype), "--max_iters", "2", "--frozen_dtype", dtype)
        assert r.returncode == 0, r.stderr[-2000:]
        assert f"({dtype}); " in r.stdout
    bf16, f32 = loads["distill: teacher"]
    assert {q.dtype for q in bf16.parameters()} == {torch.bfloat16} and {q.dtype for q in f32.parameters()} == {
        torch.float32}
    assert {q.dtype for s in loads["distill: student"] for q in s.parameters()} == {torch.float32}
    a, b = log(tmp_path / "bfloat16"), log(tmp_path / "float32")
    assert [x["max_len"] for x in a] == [x["max_len"] for x in b] and a[0]["loss"] != b[0]["loss"]
    for x, y in zip(a, b):  # measured: 3e-6 and 1e-4 apart (relative)
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-2) and x["kl"] == pytest.approx(y["kl"], rel=1e-2)
    assert a[-1]["val_kl"] == pytest.approx(b[-1]["val_kl"], rel=1e-2, abs=1e-3)  # KL ~0.01: bf16 rounds absolutely
