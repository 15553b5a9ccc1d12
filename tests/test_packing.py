"""Packed rows (data.packed_batch, model.packed_mask, the doc/pos path of diffusion.py and align.py): several
conversations in one row, each attending only within itself at its own positions, give each conversation the same
per-token losses and the same gradient as the conversations run alone, one per row, for every attention kind: causal
(the teacher), bidirectional (masked diffusion), the plain block rule, and the block DLM's two-stream [x0, xt] forward
(against the slow one-forward-per-block definition too)."""
import numpy as np
import pytest
import torch

import align
import diffusion
from model import Qwen3, packed_mask, preset
from lib import data

MASK, EOS = 259, 256
LENGTHS = (5, 9, 4, 7, 6, 3, 8)


def micro(attn, shift, seed=0):
    kw = dict(block_size=4) if attn == "block" else {}
    return Qwen3(preset("micro", attn=attn, mask_token_id=MASK, shift=shift, **kw)).init_weights(seed)


def corpus(seed=0):
    """Conversations of LENGTHS tokens (the last one an eos) back to back, and 0/1 answer marks along them."""
    g = torch.Generator().manual_seed(seed)
    convs = [torch.cat([torch.randint(0, 256, (n - 1,), generator=g), torch.tensor([EOS])]) for n in LENGTHS]
    marks = [torch.cat([torch.zeros(2, dtype=torch.uint8), torch.ones(n - 2, dtype=torch.uint8)]) for n in LENGTHS]
    return torch.cat(convs).numpy().astype(np.uint16), torch.cat(marks).numpy()


def packed(seed=0, batch_size=3, seq_len=16):
    tokens, marks = corpus()
    spans = data.conversation_spans(tokens, EOS, seq_len)
    return tokens, spans, data.packed_batch(tokens, marks, spans, batch_size, seq_len,
                                            generator=torch.Generator().manual_seed(seed), pad_id=EOS)


def conversations_of(x, doc):
    """[(row, slots)] of each packed conversation."""
    return [(b, (doc[b] == k).nonzero()[:, 0]) for b in range(x.shape[0]) for k in range(int(doc[b].max()) + 1)]


def test_packed_batch_holds_whole_conversations_at_their_own_positions():
    tokens, spans, (x, ans, doc, pos) = packed()
    _, marks = corpus()
    starts = {tuple(tokens[s:s + n].tolist()): (s, n) for s, n in spans}
    seen = 0
    for b, slots in conversations_of(x, doc):
        s, n = starts[tuple(x[b, slots].tolist())]  # a whole conversation of the corpus
        assert slots.tolist() == list(range(slots[0], slots[0] + n)) and pos[b, slots].tolist() == list(range(n))
        assert ans[b, slots].tolist() == marks[s:s + n].astype(bool).tolist()
        seen += n
    assert seen == int((doc >= 0).sum()) and (x[doc < 0] == EOS).all() and not ans[doc < 0].any()
    assert (doc[:, 0] == 0).all()  # every row opens with a conversation
    # the same generator state draws the same batch; longer conversations are left out, not cut
    assert all(torch.equal(a, b) for a, b in zip(packed()[2], (x, ans, doc, pos)))
    assert (data.conversation_spans(tokens, EOS, 6)[:, 1] <= 6).all()
    with pytest.raises(SystemExit, match="no train conversation fits --seq_len 2"):
        data.conversation_spans(tokens, EOS, 2, "align")


def test_end_pad_follows_each_short_answer_with_trained_end_tokens():
    tokens, marks = corpus()
    spans = data.conversation_spans(tokens, EOS, 16)
    x, ans, doc, pos = data.packed_batch(tokens, marks, spans, 3, 16, generator=torch.Generator().manual_seed(0),
                                         pad_id=0, end_pad=6, end_id=EOS)
    starts = {tuple(tokens[s:s + n].tolist()): (s, n) for s, n in spans}
    for b, slots in conversations_of(x, doc):  # the conversation, then end tokens until 6 are trained (or the row ends)
        n = int((x[b, slots] == EOS).nonzero()[0]) + 1  # the conversation's own eos, then the pads
        s, _ = starts[tuple(x[b, slots[:n]].tolist())]
        assert (x[b, slots[n:]] == EOS).all()
        trained = int(marks[s:s + n].sum())
        assert len(slots) == n + min(max(6 - trained, 0), 16 - n) and pos[b, slots].tolist() == list(range(len(slots)))
        assert ans[b, slots[n:]].all() and int(ans[b, slots].sum()) == max(trained, min(6, trained + 16 - n))
    assert (x[doc < 0] == 0).all() and not ans[doc < 0].any()


def test_packed_mask_is_each_conversation_alone():
    doc = torch.tensor([[0, 0, 0, 1, 1, -1]])
    pos = torch.tensor([[0, 1, 2, 0, 1, 0]])
    m = packed_mask("causal", doc, pos)[0, 0].int().tolist()
    assert m == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                 [0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 1]]
    assert packed_mask("bidirectional", doc, pos)[0, 0, 4].int().tolist() == [0, 0, 0, 1, 1, 0]
    assert packed_mask("block", doc, pos, 2)[0, 0, 0].int().tolist() == [1, 1, 0, 0, 0, 0]


@pytest.mark.parametrize("shift", [True, False])
def test_corrupt_packed_draws_a_rate_per_conversation(shift):
    _, _, (x, ans, doc, pos) = packed(batch_size=4, seq_len=20)
    xt, masked, t = diffusion.corrupt(x, MASK, shift, torch.Generator().manual_seed(0), where=ans, doc=doc, pos=pos)
    assert not masked[doc < 0].any() and not (masked & ~ans).any() and (xt[masked] == MASK).all()
    assert not (shift and masked[pos == 0].any())
    for b, slots in conversations_of(x, doc):  # one rate per conversation, different ones across them
        assert (t[b, slots] == t[b, slots[0]]).all()
    firsts = t[doc >= 0].unique()
    assert len(firsts) == len(conversations_of(x, doc))


def ce_alone(model, x0, xt, masked, doc):
    """Each masked token's CE with its conversation run alone (B = 1, no pads), in the packed rows' row-major
    order (conversations_of's)."""
    out = []
    for b, slots in conversations_of(x0, doc):
        s, e = int(slots[0]), int(slots[-1]) + 1
        out.append(diffusion.denoiser_ce(model, x0[b:b + 1, s:e], xt[b:b + 1, s:e], masked[b:b + 1, s:e]))
    return torch.cat(out)


@pytest.mark.parametrize("attn,shift", [("bidirectional", True), ("bidirectional", False), ("block", True),
                                        ("block", False)])
def test_packed_losses_and_gradients_equal_unpacked(attn, shift):
    """Per-token CE and the gradient of their sum: packed rows against each conversation alone. For the block DLM
    the packed two-stream forward is also checked against the one-forward-per-block definition."""
    torch.manual_seed(0)
    _, _, (x0, ans, doc, pos) = packed(batch_size=3, seq_len=16)
    model = micro(attn, shift).double()
    xt, masked, t = diffusion.corrupt(x0, MASK, shift, torch.Generator().manual_seed(1), 0.8, where=ans, doc=doc,
                                      pos=pos, block_size=4 if attn == "block" else None)
    assert masked.sum() >= 8
    ce = diffusion.denoiser_ce(model, x0, xt, masked, doc=doc, pos=pos)
    ce.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    alone = ce_alone(model, x0, xt, masked, doc)
    alone.sum().backward()
    assert torch.allclose(ce, alone, atol=1e-10)
    for n, p in model.named_parameters():
        assert torch.allclose(grads[n], p.grad, atol=1e-10), n
    if attn == "block":
        with torch.no_grad():
            ref = []
            for b, slots in conversations_of(x0, doc):
                s, e = int(slots[0]), int(slots[-1]) + 1
                m = masked[b:b + 1, s:e]
                logits = diffusion.per_block_logits(model, x0[b:b + 1, s:e], xt[b:b + 1, s:e], m)
                ref.append(torch.nn.functional.cross_entropy(logits, x0[b:b + 1, s:e][m], reduction="none"))
        assert torch.allclose(ce.detach().float(), torch.cat(ref), atol=1e-5)


def test_packed_teacher_and_align_loss_equal_unpacked():
    """REPR-ALIGN's step on packed rows: the causal teacher's hidden states and the student's, hence the loss and
    its gradient, are those of the conversations alone (the mean over all masked tokens of the batch)."""
    _, _, (x0, ans, doc, pos) = packed(batch_size=2, seq_len=20)
    student, teacher = micro("bidirectional", True).double(), micro("causal", True, seed=1).double()
    xt, masked, t = diffusion.corrupt(x0, MASK, True, torch.Generator().manual_seed(2), where=ans, doc=doc, pos=pos)
    layers = list(range(3))
    loss, stats = align.loss_step(student, teacher, x0, xt, masked, t, layers=layers, doc=doc, pos=pos)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in student.named_parameters()}
    student.zero_grad()
    ce, cos, n_rows = [], [], 0
    for b, slots in conversations_of(x0, doc):
        s, e = int(slots[0]), int(slots[-1]) + 1
        m = masked[b:b + 1, s:e]
        out, hs = diffusion.denoiser_ce(student, x0[b:b + 1, s:e], xt[b:b + 1, s:e], m, output_hidden_states=True)
        _, ht = teacher(x0[b:b + 1, s:e], "causal", rows=align.NO_ROWS, output_hidden_states=True)
        S = diffusion.denoiser_rows(m, True)
        ce.append(out)
        cos.append(torch.stack([torch.nn.functional.cosine_similarity(hs[k][S], ht[k][S], dim=-1).sum()
                                for k in layers]))
        n_rows += int(S.sum())
    ce = torch.cat(ce)
    ref = ce.sum() / len(ce) + 10 * (1 - (sum(cos) / n_rows).mean())
    ref.backward()
    assert torch.allclose(loss.double(), ref.double(), atol=1e-6)  # the alignment's cosines are taken in fp32
    for n, p in student.named_parameters():
        assert torch.allclose(grads[n], p.grad, atol=1e-6), n


def test_samplers_run_under_bf16_autocast():
    """distill.py rolls out under the run's autocast (bf16 on CUDA, --autocast bf16 on a CPU): every sampler's KV
    cache holds the keys in autocast's dtype, so writing bf16 keys into it works."""
    import sample
    prompts = [[1, 2, 3], [4, 5]]
    with torch.autocast("cpu", torch.bfloat16):
        ar = sample.ar_generate(micro("causal", None), prompts, 6)
        block = sample.block_generate(micro("block", True), prompts, 8, 4, eos_id=EOS)
        masked = sample.diffusion_generate(micro("bidirectional", True), prompts, 8, 8, 8, cache="dual")
    assert ar.generated.shape == (2, 6) and block.generated.shape == (2, 8) and masked.generated.shape == (2, 8)
