"""Parallel decoding counted per row (Generation.row_nfe, row_tokens, tasks.throughput) against slow
references written here: a model whose prediction and confidence at each RoPE position are chosen by the
test (so each row of a ragged batch needs its own number of rounds and meets eos in its own block), every
row decoded alone at batch 1, the recorded rounds; the per-row figures by hand; sample.generate's dispatch
and refusals; the --show_rounds rendering on a hand-made Generation."""
import re

import pytest
import torch

import sample as S
from sample import Generation, ar_generate, block_generate, diffusion_generate
from lib import chat
from worlds import tasks
from test_sample import EOS, PROMPTS, V, make
from lib.tokenizer import Tokenizer

P_EOS = 13  # the RoPE position whose prediction is eos


def token_at(p):
    return torch.where(p == P_EOS, EOS, p % 40 + 2)


def height_at(p):  # the logit of the predicted token (all others 0): p % 3 == 0 is unsure; no two alike nearby
    return torch.where(p % 3 == 0, 3.0, 8.0) + (p % 7) / 10


def confidence_at(p):  # its raw softmax probability: e^h / (e^h + the V - 2 other ids that are not the mask)
    e = height_at(p).exp()
    return e / (e + V - 2)


def positional(m):
    """The model's logits at a fed position with RoPE position p: height_at(p) * one_hot(token_at(p))."""
    def hook(mod, args, kwargs, out):
        p = kwargs["pos"]  # (B, T): per row, so the rows of a ragged batch differ at the same slot
        p = p if kwargs.get("rows") is None else p[kwargs["rows"]]  # the head on some rows only -> (n, V)
        return height_at(p)[..., None] * torch.nn.functional.one_hot(token_at(p), V).float()
    m.register_forward_hook(hook, with_kwargs=True)
    return m


def rounds_needed(confs, threshold=None, per_step=None, upto=None):
    """Rounds to decode one block whose positions keep fixed confidences: each round commits the most confident
    masked position (the first of equals) and every one at or above the threshold, or (per_step: LLaDA's fixed
    steps) the per_step most confident; until every position, or (upto) every one before `upto`, is committed."""
    left, n, upto = list(range(len(confs))), 0, len(confs) if upto is None else upto
    while any(i < upto for i in left):
        order = sorted(left, key=lambda i: (-confs[i], i))
        take = order[:per_step] if per_step else order[:1] + [i for i in order[1:] if confs[i] >= threshold]
        left, n = [i for i in left if i not in take], n + 1
    return n


def slow_counts(ids, N, block, threshold, shift, steps_per_block=None, finish_block=False):
    """-> (row_nfe, row_tokens) of one row by the rules above: the prediction for generated token j (RoPE
    position len + j) is read at position len + j - shift; block k holds the generated tokens k*block..; the
    row is charged through the block that holds eos, in it only until eos and every token before it are
    committed (finish_block: to the block's end)."""
    pos = [len(ids) + j - shift for j in range(N)]
    j_eos = next((j for j, p in enumerate(pos) if p == P_EOS), None)
    tokens = N if j_eos is None else j_eos + 1
    last = N // block - 1 if j_eos is None else j_eos // block  # the block that holds eos
    confs = [float(confidence_at(torch.tensor(p))) for p in pos]
    per_step = None if steps_per_block is None else block // steps_per_block
    return sum(rounds_needed(confs[k * block:(k + 1) * block], threshold, per_step,
                             j_eos - k * block + 1 if k == last and j_eos is not None and not finish_block else None)
               for k in range(last + 1)), tokens


def check_rows(run, block, threshold, shift, steps_per_block=None, finish_block=False):
    """Each row of the ragged batch: its counts equal the slow reference's and that prompt's decoded alone."""
    gen = run(PROMPTS)
    N = gen.generated.shape[1]
    for b, ids in enumerate(PROMPTS):
        want = slow_counts(ids, N, block, threshold, shift, steps_per_block, finish_block)
        assert (int(gen.row_nfe[b]), int(gen.row_tokens[b])) == want, b
        alone = run([ids])
        assert (int(alone.row_nfe[0]), int(alone.row_tokens[0])) == want and alone.nfe == want[0], b
        assert torch.equal(alone.generated[0], gen.generated[b])
    assert len(set(gen.row_nfe.tolist())) > 1 and len(set(gen.row_tokens.tolist())) > 1  # rows differ
    assert gen.nfe >= int(gen.row_nfe.max())
    return gen


@pytest.mark.parametrize("finish_block", [False, True])
@pytest.mark.parametrize("shift", [False, True])
def test_block_rows_counted_alone(shift, finish_block):
    m = positional(make("block", shift=shift, block_size=4))
    for thr in (0.5, 0.9):
        def run(p):
            return block_generate(m, p, 16, threshold=thr, eos_id=EOS, record=True,
                                  finish_block=finish_block)
        gen = check_rows(run, 4, thr, shift, finish_block=finish_block)
        assert gen.nfe > int(gen.row_nfe.min())  # the batch waited for its slowest row: per batch undercounts
        r = gen.rounds.view(3, 4, 4)
        for b in range(3):  # recorded rounds agree: the row's rounds per block, through its eos block
            last = (int(gen.row_tokens[b]) - 1) // 4
            assert int(gen.row_nfe[b]) == int((r[b, :last + 1].max(-1).values + 1).sum())


@pytest.mark.parametrize("finish_block", [False, True])
@pytest.mark.parametrize("cache", ["none", "dual"])
@pytest.mark.parametrize("shift", [False, True])
def test_diffusion_rows_counted_alone(shift, cache, finish_block):
    m = positional(make("bidirectional", shift=shift))  # its logits depend on the position alone: any cache is exact
    check_rows(lambda p: diffusion_generate(m, p, 16, 4, 16, threshold=0.9, eos_id=EOS, cache=cache,
                                         finish_block=finish_block), 4,
               0.9, shift, finish_block=finish_block)
    for steps in (16, 8):  # fixed steps: every step counts until the row is done
        check_rows(lambda p: diffusion_generate(m, p, 16, 4, steps, eos_id=EOS, cache=cache,
                                                     finish_block=finish_block), 4, None,
                   shift, steps_per_block=steps // 4, finish_block=finish_block)


def test_ar_rows_counted_alone():
    m = positional(make())
    gen = ar_generate(m, PROMPTS, 16, eos_id=EOS)
    for b, ids in enumerate(PROMPTS):  # AR: slot P + j comes from position len + j - 1; one forward a token
        want = P_EOS - (len(ids) - 1) + 1  # eos comes from position P_EOS = len - 1 + (want - 1)
        assert int(gen.row_tokens[b]) == int(gen.row_nfe[b]) == want, b
        alone = ar_generate(m, [ids], 16, eos_id=EOS)
        assert int(alone.row_nfe[0]) == int(alone.row_tokens[0]) == want
        assert (gen.generated[b, want:] == EOS).all() and (gen.generated[b, :want - 1] != EOS).all()
    assert gen.tokens_per_forward.eq(1).all()
    free = ar_generate(m, PROMPTS, 16)  # no eos: every row counts all N
    assert free.row_tokens.eq(16).all() and free.row_nfe.eq(16).all()


@pytest.mark.parametrize("thr", [0.5, 0.7])
def test_random_model_rows_equal_alone(thr):
    """A random model (no oracle): each row's counts in the ragged batch equal that prompt decoded alone."""
    runs = ((make("block", shift=True, block_size=4), lambda m, p: block_generate(m, p, 16, threshold=thr)),
            (make("bidirectional", shift=True), lambda m, p: diffusion_generate(m, p, 16, 8, 16, threshold=thr)))
    for m, run in runs:
        gen = run(m, PROMPTS)
        for b, ids in enumerate(PROMPTS):
            alone = run(m, [ids])
            assert int(gen.row_nfe[b]) == int(alone.row_nfe[0]) == alone.nfe, b
        assert gen.row_tokens.eq(16).all() and gen.nfe >= int(gen.row_nfe.max())


@pytest.mark.parametrize("shift", [False, True])
def test_done_at_the_end_token_keeps_the_tokens_and_charges_no_more(shift):
    """A row done at its end token against finish_block (the end token's block finished, as before) on random
    models, with an end id each row meets early: the same tokens (greedy, batched; sampled, one row: the same
    draws until it is done), the same row_tokens, never more forwards, and fewer for some row."""
    runs = [(make("block", shift=shift, block_size=4), lambda m, p, **kw: block_generate(m, p, 16, threshold=t, **kw))
            for t in (0.5, 0.9, 1.0)]
    runs += [(make("bidirectional", shift=shift), lambda m, p, **kw: diffusion_generate(
        m, p, 16, 8, 16, threshold=t, cache=c, **kw)) for t in (0.5, 1.0) for c in ("none", "prefix", "dual")]
    runs += [(make("bidirectional", shift=shift), lambda m, p, **kw: diffusion_generate(m, p, 16, 4, 8, **kw))]
    fewer = 0
    for m, run in runs:
        eos = int(run(m, PROMPTS).generated[0, 5])  # a token row 0 produces: every row may meet it
        new, old = run(m, PROMPTS, eos_id=eos), run(m, PROMPTS, eos_id=eos, finish_block=True)
        assert torch.equal(new.tokens, old.tokens) and torch.equal(new.row_tokens, old.row_tokens)
        assert (new.row_nfe <= old.row_nfe).all() and new.nfe <= old.nfe
        fewer += int((new.row_nfe < old.row_nfe).sum())
        for seed in range(3):
            def g():
                return torch.Generator().manual_seed(seed)
            a = run(m, PROMPTS[:1], eos_id=eos, temperature=1.0, generator=g())
            b = run(m, PROMPTS[:1], eos_id=eos, temperature=1.0, generator=g(), finish_block=True)
            assert torch.equal(a.tokens, b.tokens) and int(a.row_nfe[0]) <= int(b.row_nfe[0]) == b.nfe
    assert fewer > 0, fewer


def test_throughput_by_hand():
    def gen(row_nfe, row_tokens, N, nfe):
        return Generation(torch.zeros(len(row_nfe), 2 + N, dtype=torch.long), torch.ones(len(row_nfe)), 2, nfe,
                          torch.tensor(row_nfe), torch.tensor(row_tokens))
    gens = [gen([4, 8], [8, 8], 8, 8), gen([2], [3], 8, 2)]  # two batches of one run
    s = tasks.throughput(gens, 0.5)
    per_row = [8 / 4, 8 / 8, 3 / 2]
    mean = sum(per_row) / 3
    assert s["tokens_per_forward"] == pytest.approx(mean)
    assert s["tokens_per_forward_std"] == pytest.approx((sum((x - mean) ** 2 for x in per_row) / 3) ** 0.5)
    assert (s["tokens_per_forward_min"], s["tokens_per_forward_max"]) == (1.0, 2.0)
    assert s["forwards_per_row"] == pytest.approx(14 / 3) and s["nfe"] == 10
    assert s["tokens_per_s"] == pytest.approx(19 / 0.5) and s["raw_tokens_per_s"] == pytest.approx(24 / 0.5)


# ---- the one dispatch and its refusals -------------------------------------------------------------

def test_generate_dispatches_on_attn():
    prompts = [[3, 4, 5, 6]]
    ar, dlm, blk = make(), make("bidirectional", shift=True), make("block", shift=False, block_size=4)
    assert torch.equal(S.generate(ar, prompts, 8).tokens, ar_generate(ar, prompts, 8).tokens)
    assert torch.equal(S.generate(dlm, prompts, 8).tokens, diffusion_generate(dlm, prompts, 8, 8, 8).tokens)
    assert torch.equal(S.generate(dlm, prompts, 8, threshold=0.6).tokens,
                       diffusion_generate(dlm, prompts, 8, 8, 8, threshold=0.6).tokens)
    assert torch.equal(S.generate(blk, prompts, 8).tokens, block_generate(blk, prompts, 8, threshold=0.9).tokens)
    assert S.generate(blk, prompts, 8, record=True).rounds is not None


@pytest.mark.parametrize("model,kw,msg", [
    ("causal", dict(threshold=0.9), "threshold: not used by the AR sampler"),
    ("causal", dict(steps=8, block_size=4), "steps, block_size: not used by the AR sampler"),
    ("block", dict(steps=8), "steps: not used by the block diffusion sampler"),
    ("bidirectional", dict(use_cache=False), "no_cache: not used by the masked diffusion sampler"),
    ("block", dict(threshold=0.0), "threshold must be in (0, 1]"),
    ("bidirectional", dict(threshold=1.5), "threshold must be in (0, 1]"),
    ("causal", dict(temperature=-1.0), "temperature -1.0: need temperature >= 0"),
    ("causal", dict(repetition_penalty=0.0), "repetition_penalty 0.0: need"),
    ("bidirectional", dict(min_p=1.5, temperature=1.0), "min_p 1.5: need"),
    ("block", dict(top_p=0.0, temperature=1.0), "top_p in (0, 1]"),
])
def test_generate_refuses(model, kw, msg):
    m = make(model, shift=None if model == "causal" else True, block_size=4)
    with pytest.raises(ValueError, match=re.escape(msg)):
        S.generate(m, [[3, 4]], 8, **kw)


def test_each_sampler_called_directly_refuses_bad_sampling_settings():
    """The samplers themselves, not only generate, refuse a negative temperature, top_k < 1, top_p outside (0, 1],
    min_p outside [0, 1] and a repetition penalty <= 0, each named."""
    samplers = {"causal": lambda m, **kw: S.ar_generate(m, [[3, 4]], 8, **kw),
                "bidirectional": lambda m, **kw: S.diffusion_generate(m, [[3, 4]], 8, 8, 8, **kw),
                "block": lambda m, **kw: S.block_generate(m, [[3, 4]], 8, **kw)}
    for attn, run in samplers.items():
        m = make(attn, shift=None if attn == "causal" else True, block_size=4)
        for kw in (dict(temperature=-1.0), dict(temperature=1.0, top_k=0), dict(temperature=1.0, top_p=1.5),
                   dict(min_p=-0.1), dict(repetition_penalty=-1.0)):
            (name, value), = [(k, v) for k, v in kw.items() if k != "temperature" or len(kw) == 1]
            with pytest.raises(ValueError, match=re.escape(f"{name} {value}: need temperature >= 0, top_k >= 1")):
                run(m, **kw)


def test_prompt_longer_than_positions_is_refused():
    m = make("block", shift=True, block_size=4)  # max_position_embeddings 512
    S.generate(m, [[3] * 504], 8)  # exactly fits
    for fn in (lambda: S.generate(m, [[3] * 505], 8), lambda: ar_generate(make(), [[3], [3] * 600], 4)):
        with pytest.raises(ValueError, match="exceeds the model's 512 positions"):
            fn()


# ---- --show_rounds --------------------------------------------------------------------------------

def test_token_pieces_give_a_split_character_to_the_completing_token():
    tok = Tokenizer.byte_level()
    ids = list(b"a\xc3\xa9\tb")  # "aé\tb": é is two byte tokens
    assert chat.token_pieces(tok, ids) == ["a", "", "é", "\t", "b"]
    assert "".join(chat.token_pieces(tok, ids)) == tok.decode(ids)


def test_show_rounds_renders_a_hand_made_generation():
    tok = Tokenizer.byte_level()
    prompt, new = list(b"ab"), list(b"cd\n\te") + [256]  # eos is <|endoftext|>, 13 characters
    x = torch.tensor([[0] * 2 + prompt + new])  # two left pads
    rounds = torch.tensor([[0, 1, 1, 0, 2, 11]])
    gen = Generation(x, torch.tensor([2]), 4, 5, torch.tensor([5]), torch.tensor([6]), rounds)
    n = int(gen.row_tokens[0])
    seq = gen.sequence(0)[:2 + n].tolist()
    assert seq == prompt + new[:6]
    got = chat.show_rounds(chat.token_pieces(tok, seq), [-1, -1] + gen.rounds[0, :n].tolist())
    assert got == "abcd\n  01\n    e<|endoftext|>\n00002" + "b" * 13  # a tab: 4 spaces; round 11: b
    assert chat.show_rounds(["abcdef"], [3], width=4) == "abcd\n3333\nef\n33"  # wrapped
    assert chat.show_rounds(["x\n", "y"], [-1, 40]) == "x\ny\n+"  # a prompt-only line gets no mark line
    assert chat.show_rounds(["ab", "c"], [-1, 0], colour=True) == "ab\x1b[32mc\x1b[0m\n  \x1b[32m0\x1b[0m"
