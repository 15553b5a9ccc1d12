"""sample.py against slow, obvious re-implementations written here: AR greedy with the static cache and
ragged batches against full recomputation of each prompt alone; LLaDA one-token-per-step against a
position-by-position loop; block diffusion with the cache against without, its recorded rounds replayed;
the shift convention on a model whose predictions are a known function of the slot; the mask token never
emitted even when it is the model's favourite; eos; seeds; and the CLI on a saved checkpoint of each kind."""
import io
import json
import shutil
import sys

import pytest
import torch
import torch.nn.functional as F

import sample as S
from conftest import ROOT, run_script
from model import Qwen3, Qwen3Config, preset
from sample import ar_generate, block_generate, diffusion_generate
from lib.tokenizer import Tokenizer

V, MASK, EOS = 48, 47, 1
CFG = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
           num_key_value_heads=1, head_dim=16, max_position_embeddings=512, rope_theta=10_000.0,
           bos_token_id=EOS, eos_token_id=EOS, torch_dtype="float32", mask_token_id=MASK)
PROMPTS = [[3, 4, 5], [6, 7, 8, 9, 10, 11, 12], [13]]  # ragged: left-padded in a batch


def make(attn="causal", shift=None, block_size=None, seed=0):
    """A random model with large weights: peaked, context-dependent logits, so greedy is deterministic."""
    m = Qwen3(Qwen3Config(**CFG, attn=attn, shift=shift, block_size=block_size)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            base = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(base + torch.randn(p.shape, generator=g) * (0.2 if base else 0.5))
    return m


def oracle(m, f, by="slot"):
    """Replace the logits by 10 * one_hot(f(i)) at each fed position, i its cache slot (or sequence index) or,
    by="pos", its RoPE position: the model's prediction at i is f(i), whatever the tokens."""
    def hook(mod, args, kwargs, out):
        i = kwargs.get("pos") if by == "pos" else kwargs.get("slots")
        i = torch.arange(args[0].shape[1]) if i is None else i
        logits = 10 * F.one_hot(f(i), V).float().expand(*args[0].shape, V)  # (B, T, V)
        rows = kwargs.get("rows")  # the head on some rows only -> (n, V)
        return (logits if rows is None else logits[rows]).clone()
    m.register_forward_hook(hook, with_kwargs=True)
    return m


def greedy(logits):
    logits = logits.clone()
    logits[..., MASK] = float("-inf")
    probs = logits.softmax(-1)
    return probs.max(-1)  # (confidence, token)


# ---- the shared sampling helper ---------------------------------------------------------------

def raw_probability(logits, tok):
    """By hand: exp(l_tok - max) / Σ_v exp(l_v - max) over the ids that are not banned (the mask token)."""
    logits = logits.clone()
    logits[..., MASK] = float("-inf")
    e = (logits - logits.max(-1, keepdim=True).values).exp()
    return e.gather(-1, tok[..., None])[..., 0] / e.sum(-1)


def test_sample_helper_filters():
    logits = torch.randn(64, V, generator=torch.Generator().manual_seed(0)) * 3
    ban = torch.zeros(V)
    ban[MASK] = float("-inf")
    tok, conf = S.sample(logits, ban=ban)
    want_conf, want_tok = greedy(logits)
    assert torch.equal(tok, want_tok) and torch.allclose(conf, want_conf)
    def g(s):
        return torch.Generator().manual_seed(s)
    for kw in (dict(top_k=1), dict(top_p=1e-6)):  # both leave only the top token
        tok, conf = S.sample(logits, 1.0, generator=g(0), ban=ban, **kw)
        # the confidence is the raw softmax probability, not the filtered distribution's (which would be 1)
        assert torch.equal(tok, want_tok) and torch.allclose(conf, want_conf) and (conf < 0.999).any()
    tok, conf = S.sample(logits.expand(50, 64, V), 2.0, top_k=3, generator=g(1), ban=ban)
    top3 = (logits + ban).topk(3, -1).indices
    assert (tok[..., None] == top3).any(-1).all() and (tok != top3[:, 0]).any()  # only the top 3, not only the top 1
    assert torch.allclose(conf, raw_probability(logits.expand(50, 64, V), tok))  # untempered, unfiltered
    tempered = ((logits + ban) / 2).topk(3, -1).values.softmax(-1).expand(50, 64, 3)  # what it was drawn from
    which = (tok[..., None] == top3).float().argmax(-1, keepdim=True)  # (50, 64, 1): the chosen one's rank
    assert not torch.allclose(conf, tempered.gather(-1, which)[..., 0])
    a, b = S.sample(logits, 1.0, generator=g(5))[0], S.sample(logits, 1.0, generator=g(5))[0]
    assert torch.equal(a, b) and not torch.equal(a, S.sample(logits, 1.0, generator=g(6))[0])


def test_confidence_is_raw_at_temperature_2():
    logits = torch.randn(8, 6, V, generator=torch.Generator().manual_seed(1)) * 2
    ban = torch.zeros(V)
    ban[MASK] = float("-inf")
    tok, conf = S.sample(logits, 2.0, generator=torch.Generator().manual_seed(0), ban=ban)
    assert torch.allclose(conf, raw_probability(logits, tok), rtol=1e-5, atol=0)
    assert (tok != logits.argmax(-1)).any()  # sampled, not greedy: the check covers non-top tokens too


def test_choose_matches_fast_dllm():
    """Threshold rule: every masked position at or above the threshold, plus the most confident one."""
    conf = torch.tensor([[0.95, 0.2, 0.91, 0.5], [0.3, 0.4, 0.1, 0.2], [0.99, 0.98, 0.1, 0.97]])
    masked = torch.tensor([[True, True, True, True], [True, True, True, False], [False, True, True, False]])
    got = S.choose(conf, masked, threshold=0.9)
    want = torch.tensor([[True, False, True, False], [False, True, False, False], [False, True, False, False]])
    assert torch.equal(got, want)
    want = torch.tensor([[True, False, True, False], [True, True, False, False], [False, True, True, False]])
    assert torch.equal(S.choose(conf, masked, n=torch.tensor(2)), want)  # fixed count: the 2 most confident masked


# ---- the sampling controls: transformers' meanings ---------------------------------------------------

@pytest.mark.parametrize("temperature,top_k,top_p,min_p", [(1.0, None, None, 0.1), (0.7, 10, None, None),
                                                           (1.3, None, 0.8, None), (0.5, 20, 0.9, 0.05),
                                                           (1.0, 5, 0.5, 0.3), (2.0, None, None, 1.0)])
def test_filters_equal_transformers_logits_warpers(temperature, top_k, top_p, min_p):
    """Temperature, top-k, top-p and min-p on fixed logits: the same ids kept, with the same logits, as
    transformers' warpers applied in the order its generate applies them."""
    from transformers.generation import logits_process as lp
    logits = torch.randn(4, 3, 50, generator=torch.Generator().manual_seed(0)) * 3
    warpers = [lp.TemperatureLogitsWarper(temperature)]
    warpers += [lp.TopKLogitsWarper(top_k)] if top_k else []
    warpers += [lp.TopPLogitsWarper(top_p)] if top_p else []
    warpers += [lp.MinPLogitsWarper(min_p)] if min_p else []
    want = logits.view(12, 50).clone()
    for w in warpers:
        want = w(None, want)
    got = S.filtered(logits, temperature, top_k, top_p, min_p).view(12, 50)
    assert torch.equal(got.isfinite(), want.isfinite()) and (got.isfinite().sum(-1) < 50).any()
    torch.testing.assert_close(got[got.isfinite()], want[want.isfinite()])


@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_repetition_penalty_equals_transformers_processor(penalty):
    """penalize over seen_ids (a row's ids, repeats counted once) = transformers' RepetitionPenaltyLogitsProcessor,
    which divides a seen id's positive logit by the penalty and multiplies a negative one."""
    from transformers.generation import logits_process as lp
    g = torch.Generator().manual_seed(0)
    ids, logits = torch.randint(0, 50, (3, 12), generator=g), torch.randn(3, 50, generator=g) * 3
    want = lp.RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.clone())
    got = S.penalize(logits, S.seen_ids(ids, torch.ones_like(ids, dtype=torch.bool), 50), penalty)
    assert torch.equal(got, want) and not torch.equal(got, logits)


@pytest.mark.parametrize("penalty", [1.5, 0.8])
def test_ar_greedy_repetition_penalty_equals_transformers_generate(pair, penalty):
    """Greedy with a repetition penalty, token for token against transformers' generate on a tiny Qwen3 (the
    penalty over the prompt and the text so far); it changes what greedy writes."""
    from conftest import ids
    ref, ours, _ = pair
    ref.generation_config.eos_token_id = None  # run the whole length, as ours without eos_id
    x = ids(B=1, T=9)
    with torch.no_grad():
        want = ref.generate(x, max_new_tokens=24, do_sample=False, repetition_penalty=penalty, pad_token_id=0)
    got = S.generate(ours, x, 24, repetition_penalty=penalty)
    assert got.generated.tolist() == want[:, 9:].tolist()
    assert not torch.equal(got.generated, S.generate(ours, x, 24).generated)


def slow_penalty(logits, rows, penalty):
    """By hand: for each row, each id it holds and each slot, the id's logit divided by the penalty if positive,
    multiplied if negative."""
    out = logits.clone()
    for b, held in enumerate(rows):
        for v in set(held):
            for j in range(out.shape[1]):
                out[b, j, v] = out[b, j, v] * penalty if out[b, j, v] < 0 else out[b, j, v] / penalty
    return out


@pytest.mark.parametrize("kind", ["bidirectional", "block"])
def test_dlm_repetition_penalty_equals_a_slow_per_slot_loop(kind, monkeypatch):
    """At every forward of a DLM sampler, the logits it samples from equal slow_penalty's over the row's real
    prompt tokens and the tokens committed so far (read from the canvas the forward was fed: no cache, so the
    whole canvas); and the penalty changes the answers."""
    m = make(kind, shift=True, block_size=4 if kind == "block" else None)
    run = {"bidirectional": lambda **kw: diffusion_generate(m, PROMPTS, 12, 4, steps=12, threshold=0.5, **kw),
           "block": lambda **kw: block_generate(m, PROMPTS, 12, threshold=0.5, use_cache=False, **kw)}[kind]
    fed, calls, penalize = [], [], S.penalize
    m.register_forward_pre_hook(lambda mod, args: fed.append(args[0].clone()))
    monkeypatch.setattr(S, "penalize", lambda logits, seen, p: calls.append((logits, penalize(logits, seen, p)))
                        or calls[-1][1])
    gen = run(repetition_penalty=3.0)
    P = gen.start
    assert len(calls) == len(fed) == gen.nfe > 3
    for x, (logits, used) in zip(fed, calls):
        rows = [prompt + [t for t in x[b, P:].tolist() if t != MASK] for b, prompt in enumerate(PROMPTS)]
        torch.testing.assert_close(used, slow_penalty(logits, rows, 3.0), rtol=0, atol=0)
    assert not torch.equal(gen.generated, run().generated)


def test_sampling_settings_from_generation_config_and_flags():
    """generation_config.json read as transformers reads it (do_sample false: greedy whatever its temperature;
    true: top_k 50 unless given), then each given flag overrides it; top_k 0 is off."""
    import argparse

    from lib import cli
    p = argparse.ArgumentParser()
    cli.sampler_args(p, 8)
    args = p.parse_args
    sampling = dict(do_sample=True, temperature=0.6, top_p=0.9, repetition_penalty=1.2)
    assert S.model_defaults(None) == dict(repetition_penalty=1.0)
    assert S.model_defaults(dict(temperature=0.6, repetition_penalty=1.1)) == dict(repetition_penalty=1.1)
    want = dict(temperature=0.6, top_k=50, top_p=0.9, min_p=None, repetition_penalty=1.2)
    assert cli.sampling(args([]), S.model_defaults(sampling)) == want
    assert cli.sampling(args(["--temperature", "0", "--top_k", "0"]), S.model_defaults(sampling)) == \
        want | dict(temperature=0.0, top_k=None)
    assert cli.sampling(args(["--repetition_penalty", "1", "--min_p", "0.1"]), S.model_defaults(sampling)) == \
        want | dict(repetition_penalty=1.0, min_p=0.1)
    assert cli.sampling(args([])) == dict(temperature=0.0, top_k=None, top_p=None, min_p=None, repetition_penalty=1.0)


# ---- AR ---------------------------------------------------------------------------------------

def slow_ar(m, ids, n):
    """Greedy by full recomputation, one prompt, no cache, no padding."""
    x = torch.tensor([ids])
    for _ in range(n):
        x = torch.cat([x, greedy(m(x, attn="causal")[0, -1])[1].view(1, 1)], 1)
    return x[0]


def test_ar_cache_equals_full_recomputation_ragged():
    m = make()
    gen = ar_generate(m, PROMPTS, 12)
    assert gen.tokens.shape == (3, 7 + 12) and gen.prompt_lens.tolist() == [3, 7, 1] and gen.nfe == 12
    assert (gen.tokens[0, :4] == 0).all()  # left-padded with pad_id (0 without eos)
    for b, ids in enumerate(PROMPTS):  # every row of the ragged batch equals that prompt generated alone
        assert torch.equal(gen.sequence(b), slow_ar(m, ids, 12)), b
    assert torch.equal(ar_generate(m, PROMPTS, 12, use_cache=False).tokens, gen.tokens)
    x = torch.tensor([PROMPTS[1], PROMPTS[1][::-1]])  # a (B, T) tensor prompt
    assert torch.equal(ar_generate(m, x, 12).generated[1], slow_ar(m, PROMPTS[1][::-1], 12)[7:])


def test_ar_shared_opening_runs_once():
    """share_opening: rows that open with the same tokens (a chat template's system prompt) run the opening once, its
    keys and values copied to each row's slots; every row still equals that prompt generated alone, and the cache
    holds what the plain prompt forward writes. Off (the default), the prompt forward reads every slot."""
    from model import canvas
    m = make()
    head = [20, 21, 22, 23, 24]
    prompts = [head + [3, 4], head + [6, 7, 8, 9, 10, 11], head, head + [13]]  # the third is the opening alone
    calls = []
    hook = m.register_forward_pre_hook(lambda mod, args: calls.append(tuple(args[0].shape)))
    gen = ar_generate(m, prompts, 10, share_opening=True)
    assert calls[:2] == [(1, 5), (4, 6)]  # the opening once, then the last 11 - 5 slots of every row
    for b, ids in enumerate(prompts):
        assert torch.equal(gen.sequence(b), slow_ar(m, ids, 10)), b
    calls.clear()
    assert torch.equal(ar_generate(m, prompts, 10).tokens, gen.tokens) and calls[0] == (4, 11)
    hook.remove()
    x, lens, P, real, pos = canvas(m, prompts, 1, 0, 0)
    shared, plain = m.new_cache(4, P + 1), m.new_cache(4, P + 1)
    with torch.no_grad():
        S.prefill(m, x, P, lens, real, pos, shared, share_opening=True)
        S.forward(m, x[:, :P], torch.arange(P), pos[:, :P], real, "causal", plain)
    for a, b in zip(shared.k + shared.v, plain.k + plain.v):
        for r in range(4):  # the real slots of each row (pad slots are never read)
            assert torch.allclose(a[r, :, P - lens[r]:P], b[r, :, P - lens[r]:P], atol=1e-5)
    with pytest.raises(ValueError, match="share_opening"):  # an AR setting: refused for a DLM
        S.generate(make(attn="block", block_size=2), prompts, 4, share_opening=True)


def test_ar_eos_rows_stop():
    def f(p):
        return torch.where(p == 6, EOS, (3 * p + 2) % 40 + 2)
    m = oracle(make(), f, by="pos")
    n = S.STOP_EVERY + 8
    gen = ar_generate(m, PROMPTS, n, eos_id=EOS)
    firsts = []
    for b, ids in enumerate(PROMPTS):
        want = f(torch.arange(len(ids) - 1, len(ids) - 1 + n))  # AR: slot t comes from position t-1
        firsts.append(int((want == EOS).nonzero()[0]))
        want[firsts[-1]:] = EOS
        assert torch.equal(gen.sequence(b)[len(ids):], want), b
    assert max(firsts) < S.STOP_EVERY - 1 and gen.nfe == max(firsts) + 1  # on a CPU the loop ends once every row
    # has its end token (checked every token; on a GPU every STOP_EVERY, a host sync)
    free = ar_generate(m, PROMPTS, 8)  # without eos_id, rows go on
    assert torch.equal(free.sequence(0)[3:], f(torch.arange(2, 10)))


# ---- masked diffusion ---------------------------------------------------------------------------

def slow_llada(m, ids, gen_length, block_length, shift):
    """LLaDA with one token per step, position by position: full bidirectional forward, then commit the single
    most confident masked position of the current block (the first on ties); shift reads position i at i-1."""
    x, P = list(ids) + [MASK] * gen_length, len(ids)
    for blk in range(gen_length // block_length):
        for _ in range(block_length):
            conf, tok = greedy(m(torch.tensor([x]), attn="bidirectional")[0])
            best = None
            for i in range(P + blk * block_length, P + (blk + 1) * block_length):
                j = i - 1 if shift else i
                if x[i] == MASK and (best is None or conf[j] > conf[best[1]]):
                    best = (i, j)
            x[best[0]] = int(tok[best[1]])
    return torch.tensor(x)


@pytest.mark.parametrize("shift", [True, False])
def test_diffusion_one_token_per_step_equals_slow_reference(shift):
    m = make("bidirectional", shift=shift)
    gen = diffusion_generate(m, PROMPTS, 8, 4, steps=8)
    assert gen.nfe == 8
    for b, ids in enumerate(PROMPTS):
        assert torch.equal(gen.sequence(b), slow_llada(m, ids, 8, 4, shift)), b
    # an unreachable threshold degrades to one token per step: the same tokens, one forward per token
    slow = diffusion_generate(m, PROMPTS, 8, 4, steps=2, threshold=1.01)
    assert slow.nfe == 8 and torch.equal(slow.tokens, gen.tokens)
    assert diffusion_generate(m, PROMPTS, 8, 4, steps=8, threshold=0.0).nfe == 2  # all at once: a forward a block
    two = diffusion_generate(m, PROMPTS, 8, 4, steps=4)  # two tokens per step
    assert two.nfe == 4 and (two.generated != MASK).all()


def test_diffusion_random_remasking_and_eos():
    m = make("bidirectional", shift=True)
    g = torch.Generator().manual_seed(0)
    gen = diffusion_generate(m, PROMPTS, 8, 8, steps=8, remasking="random", generator=g)
    assert gen.nfe == 8 and (gen.generated != MASK).all()
    P = 7
    m = oracle(make("bidirectional", shift=False), lambda i: torch.where(i == P + 5, EOS, i % 40 + 2))
    gen = diffusion_generate(m, PROMPTS, 16, 4, steps=16, eos_id=EOS)
    want = torch.arange(P, P + 16) % 40 + 2
    want[5:] = EOS  # everything after the first eos is eos
    assert (gen.generated == want).all() and gen.nfe == 6  # done once slots 4 and 5 (eos) are: 4 + 2 steps
    whole = diffusion_generate(m, PROMPTS, 16, 4, steps=16, eos_id=EOS, finish_block=True)
    assert torch.equal(whole.tokens, gen.tokens) and whole.nfe == 8  # stopped after block 1, which holds the eos
    for b, ids in enumerate(PROMPTS):  # prompts untouched
        assert gen.sequence(b)[:len(ids)].tolist() == ids
    assert torch.equal(gen.tokens[0, :4], torch.full((4,), EOS))  # pad_id defaults to eos_id


# ---- block diffusion ----------------------------------------------------------------------------

@pytest.mark.parametrize("shift", [True, False])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_block_cache_equals_no_cache(shift, temperature):
    m = make("block", shift=shift, block_size=4)
    runs = [block_generate(m, PROMPTS, 16, threshold=0.7, temperature=temperature, use_cache=c, record=True,
                           generator=torch.Generator().manual_seed(3)) for c in (True, False)]
    assert torch.equal(runs[0].tokens, runs[1].tokens) and torch.equal(runs[0].rounds, runs[1].rounds)
    assert runs[0].nfe == runs[1].nfe
    assert runs[0].start == 8 and runs[0].tokens.shape == (3, 8 + 16)  # the prompt padded to a multiple of 4
    if temperature == 0:  # each row of the ragged batch equals that prompt alone
        for b, ids in enumerate(PROMPTS):
            assert torch.equal(block_generate(m, [ids], 16, threshold=0.7).generated[0], runs[0].generated[b])


def test_block_recorded_rounds():
    m = make("block", shift=False, block_size=4)
    ids = list(range(6, 14))  # 8 tokens: no pads, so the replay below needs no mask
    for thr in (0.0, 0.5, 0.9, 1.01):
        gen = block_generate(m, [ids], 16, threshold=thr, record=True)
        r = gen.rounds[0].view(4, 4)  # (blocks, bs)
        assert (r >= 0).all()  # every generated position was committed in some round
        for blk in r:  # rounds 0..R-1, each committing at least one token
            assert set(blk.tolist()) == set(range(int(blk.max()) + 1))
        assert gen.nfe == int((r.max(1).values + 1).sum())  # one forward per round, the cache costs none
        if thr > 1:  # one token per round
            assert all(sorted(blk.tolist()) == [0, 1, 2, 3] for blk in r) and gen.nfe == 16
        if thr == 0:
            assert (r == 0).all() and gen.nfe == 4
    # replay: re-mask the positions committed at or after round k; the slow full forward's most confident
    # masked prediction is the one committed in round k, with the token it got
    gen = block_generate(m, [ids], 16, threshold=1.01, record=True)
    x, rounds = gen.tokens[0], gen.rounds[0]
    for blk in range(4):
        s, e = 8 + 4 * blk, 8 + 4 * (blk + 1)
        for k in range(4):
            y = x[:e].clone()  # earlier blocks final (later ones are invisible under block attention anyway)
            y[s:e][rounds[s - 8:e - 8] >= k] = MASK
            conf, tok = greedy(m(y[None], attn="block", block_size=4)[0, s:e])  # unshifted: read at i
            conf[y[s:e] != MASK] = -1
            i = int(conf.argmax())
            assert rounds[s - 8 + i] == k and tok[i] == x[s + i], (blk, k)


def test_block_eos_stops_early():
    P = 8
    m = oracle(make("block", shift=False, block_size=4), lambda i: torch.where(i == P + 5, EOS, i % 40 + 2))
    gen = block_generate(m, PROMPTS, 16, eos_id=EOS, record=True)
    want = torch.arange(P, P + 16) % 40 + 2
    want[5:] = EOS
    assert (gen.generated == want).all() and gen.nfe == 2  # one round per block, stopped after block 1
    assert (gen.rounds[:, :8] == 0).all() and (gen.rounds[:, 8:] == -1).all()  # blocks 2, 3 never generated


# ---- several end ids ------------------------------------------------------------------------------

E2 = 2  # a second end id (Qwen instruct checkpoints declare <|im_end|> and <|endoftext|>)


@pytest.mark.parametrize("name", ["ar", "diffusion", "block"])
def test_several_end_ids(name):
    """eos_id a list/tuple: a row stops at the first of any; what follows repeats the end token it met; pad_id
    defaults to the first id; per-row counts as with one id. The model predicts E2 at RoPE position 9 and EOS at
    11 (prompt lengths 3, 7, 1: each row meets them at its own generated index), confidently, so the threshold
    samplers commit a block per round."""
    def f(p):
        return torch.where(p == 9, E2, torch.where(p == 11, EOS, p % 40 + 3))
    m = oracle(make({"ar": "causal", "diffusion": "bidirectional", "block": "block"}[name], shift=True,
                    block_size=4), f, by="pos")
    run = {"ar": lambda e: ar_generate(m, PROMPTS, 16, eos_id=e),
           "diffusion": lambda e: diffusion_generate(m, PROMPTS, 16, 4, 16, eos_id=e),
           "block": lambda e: block_generate(m, PROMPTS, 16, eos_id=e)}[name]
    for eos_id, ends in (([EOS, E2], {EOS, E2}), ((E2, EOS), {EOS, E2}), (EOS, {EOS}), ((E2,), {E2})):
        gen = run(eos_id)
        first = eos_id if isinstance(eos_id, int) else eos_id[0]
        assert (gen.tokens[0, :gen.start - 3] == first).all(), eos_id  # row 0's left pads: the first end id
        for b, ids in enumerate(PROMPTS):
            want = f(torch.arange(len(ids) - 1, len(ids) + 15)).tolist()  # generated j from position len - 1 + j
            j = next(i for i, t in enumerate(want) if t in ends)  # the first end token the row meets
            want[j:] = [want[j]] * (16 - j)
            assert gen.generated[b].tolist() == want and int(gen.row_tokens[b]) == j + 1, (eos_id, b)
            # forwards until the end token and all before it are committed: AR and diffusion (one token a step,
            # the leftmost of equally confident first) one a token; block one a block (all confident)
            assert int(gen.row_nfe[b]) == (j // 4 + 1 if name == "block" else j + 1), (eos_id, b)
    with pytest.raises(ValueError, match="eos_id must be an int or a non-empty list/tuple of ints"):
        run([])


def test_until_end():
    """A completion's ids: up to, not including, the first of any end id; all of them without one (or eos_id None)."""
    ids = [5, 7, E2, 9, EOS, E2]
    assert S.until_end(ids, [EOS, E2]) == S.until_end(ids, (E2,)) == [5, 7]
    assert S.until_end(ids, EOS) == [5, 7, E2, 9] and S.until_end(ids, None) == ids == S.until_end(ids, [3])
    assert S.until_end([EOS, 5], [E2, EOS]) == [] and S.until_end([], EOS) == []


# ---- every sampler: shift, the mask token, seeds ------------------------------------------------

def run_all(m_for, **kw):
    """{name: Generation} of the DLM samplers on models built by m_for(attn)."""
    return {"diffusion": diffusion_generate(m_for("bidirectional"), PROMPTS, 8, 4, steps=8, **kw),
            "block": block_generate(m_for("block"), PROMPTS, 8, threshold=0.9, **kw),
            "block (no cache)": block_generate(m_for("block"), PROMPTS, 8, threshold=0.9, use_cache=False, **kw)}


@pytest.mark.parametrize("shift", [True, False])
def test_shift_convention(shift):
    """The prediction for slot i is read at slot i-1 when shifted, at i otherwise (a model that predicts f(i) at i)."""
    def f(i):
        return (3 * i + 2) % 40 + 2
    gens = run_all(lambda attn: oracle(make(attn, shift=shift, block_size=4), f))
    for name, gen in gens.items():
        slots = torch.arange(gen.start, gen.start + 8)
        assert (gen.generated == (f(slots - 1) if shift else f(slots))).all(), name


def test_mask_token_never_emitted_even_when_favourite():
    def favour_mask(m):
        bias = torch.zeros(V)
        bias[MASK] = 100.0
        m.register_forward_hook(lambda mod, args, out: out + bias)
        return m
    m = favour_mask(make())
    assert (m(torch.tensor([PROMPTS[1]])).argmax(-1) == MASK).all()  # the raw model wants the mask everywhere
    for t in (0.0, 1.0):
        gens = run_all(lambda attn: favour_mask(make(attn, shift=True, block_size=4)), temperature=t)
        gens["ar"] = ar_generate(m, PROMPTS, 8, temperature=t)
        for name, gen in gens.items():
            assert (gen.tokens != MASK).all(), (name, t)


@pytest.mark.parametrize("name", ["ar", "diffusion", "block"])
def test_seeds(name):
    m = make({"ar": "causal", "diffusion": "bidirectional", "block": "block"}[name], shift=True, block_size=4)
    run = {"ar": lambda **kw: ar_generate(m, PROMPTS, 8, **kw),
           "diffusion": lambda **kw: diffusion_generate(m, PROMPTS, 8, 4, steps=8, **kw),
           "block": lambda **kw: block_generate(m, PROMPTS, 8, **kw)}[name]
    assert torch.equal(run().tokens, run().tokens)  # greedy: deterministic (any generator)
    def seeded(s):
        return run(temperature=1.0, generator=torch.Generator().manual_seed(s)).tokens
    assert torch.equal(seeded(0), seeded(0)) and not torch.equal(seeded(0), seeded(1))


def test_bad_arguments():
    m = make("bidirectional", shift=True)
    for call in (lambda: diffusion_generate(m, PROMPTS, 10, 4, steps=10),  # not a multiple of the block
                 lambda: diffusion_generate(m, PROMPTS, 8, 4, steps=3),
                 lambda: diffusion_generate(m, [[]], 8, 4, steps=8),
                 lambda: block_generate(m, PROMPTS, 8),  # no block size anywhere
                 lambda: diffusion_generate(make(), PROMPTS, 8, 4, steps=8, mask_token_id=MASK)):  # no shift
        with pytest.raises(ValueError):
            call()


# ---- CLI ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    for attn, shift, bs in [("causal", None, None), ("bidirectional", True, None), ("block", False, 4)]:
        cfg = preset("micro", attn=attn, shift=shift, block_size=bs, mask_token_id=None if shift is None else 259)
        Qwen3(cfg).init_weights(0).save_pretrained(root / attn)
        Tokenizer.byte_level().save_pretrained(root / attn)
    return root


def test_cli_help():
    r = run_script("sample.py", "--help")
    assert r.returncode == 0 and "--ckpt" in r.stdout and "--threshold" in r.stdout


@pytest.mark.parametrize("attn,sampler", [("causal", "AR"), ("bidirectional", "masked diffusion"),
                                          ("block", "block diffusion")])
def test_cli_each_kind(ckpts, attn, sampler):
    r = run_script("sample.py", "--ckpt", ckpts / attn, "--prompt", "def fib(n):", "--max_new_tokens", 8,
                   "--num_samples", 2, "--temperature", 0.8, "--top_k", 20, "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("--- sample") == 2 and r.stdout.count("def fib(n):") == 2
    assert f"{sampler}: 2 x 8 tokens" in r.stdout and "tokens/s" in r.stdout and "tokens per forward" in r.stdout


def test_cli_cache(ckpts):
    r = run_script("sample.py", "--ckpt", ckpts / "bidirectional", "--prompt", "def f", "--max_new_tokens", 8,
                   "--cache", "dual", "--threshold", 0.9, "--device", "cpu")
    assert r.returncode == 0 and "masked diffusion: 1 x 8 tokens" in r.stdout, r.stderr
    r = run_script("sample.py", "--ckpt", ckpts / "block", "--cache", "prefix", "--device", "cpu")
    assert r.returncode == 1 and "cache: not used by the block diffusion sampler" in r.stderr


def test_cli_errors(ckpts, tmp_path):
    r = run_script("sample.py", "--ckpt", tmp_path / "nope", "--device", "cpu")
    assert r.returncode == 1 and "config.json not found" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_script("sample.py", "--ckpt", ckpts / "block", "--max_new_tokens", 6, "--device", "cpu")
    assert r.returncode == 1 and "multiple of the block size 4" in r.stderr
    for attn, flags, msg in [("causal", ["--threshold", 0.9], "threshold: not used by the AR sampler"),
                             ("causal", ["--temperature", -1], "temperature -1.0: need temperature >= 0"),
                             ("block", ["--threshold", 0], "threshold must be in (0, 1]"),
                             ("bidirectional", ["--threshold", 1.1], "threshold must be in (0, 1]"),
                             ("causal", ["--prompt", "x" * 4090, "--max_new_tokens", 8], "exceeds the model's 4096"),
                             ("causal", ["--show_rounds"], "--show_rounds needs a block-diffusion checkpoint")]:
        r = run_script("sample.py", "--ckpt", ckpts / attn, *flags, "--device", "cpu")
        assert r.returncode == 1 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, (flags, r.stderr)


def test_cli_show_rounds(ckpts):
    r = run_script("sample.py", "--ckpt", ckpts / "block", "--prompt", "def f", "--max_new_tokens", 8, "--num_samples",
                   2, "--threshold", 0.5, "--ignore_eos", "--show_rounds", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    blocks = r.stdout.split("--- sample ")[1:]
    assert len(blocks) == 2 and "the round of its block that committed it" in r.stdout
    for blk in blocks:
        lines = blk.splitlines()[1:]
        marks = "".join(line for line in lines if set(line) <= set("0123 "))  # the mark rows: rounds 0..3
        assert marks.replace(" ", "") and "\x1b[" not in blk  # not a terminal: no colours


def test_cli_chat(ckpts, tmp_path):
    """--chat renders --prompt as a user turn of the checkpoint's chat template; without a template, one line."""
    r = run_script("sample.py", "--ckpt", ckpts / "causal", "--chat", "--prompt", "hi", "--device", "cpu")
    assert r.returncode == 1 and "--chat" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    shutil.copytree(ckpts / "causal", tmp_path / "chat")
    cfg = json.loads((tmp_path / "chat" / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]"
    (tmp_path / "chat" / "tokenizer_config.json").write_text(json.dumps(cfg))
    r = run_script("sample.py", "--ckpt", tmp_path / "chat", "--chat", "--prompt", "def f", "--max_new_tokens", 4,
                   "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "--- sample 0\n[user] def f\n[assistant]" in r.stdout  # the rendered prompt, then the sample


# ---- the chat session ------------------------------------------------------------------------------------------

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def chat_ckpt(ckpts, tmp_path, attn):
    d = tmp_path / f"chat-{attn}"
    shutil.copytree(ckpts / attn, d)
    from conftest import randomise
    randomise(Qwen3.from_pretrained(d), seed=3).save_pretrained(d)  # larger weights: varied answers, not one token
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps(cfg | {"chat_template": CHAT_TEMPLATE}))
    return d


def expected_reply(d, messages, n=8, **kw):
    """The answer to a conversation, computed here: the template by hand, generate (kw: sampling settings), the
    text up to <|im_end|> (which the byte-level tokenizer's config does not declare an end id: the chat adds it)
    -> (ids, printed)."""
    from lib import chat
    import sample
    tok, model = Tokenizer.from_pretrained(d), Qwen3.from_pretrained(d).eval()
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + "<|im_start|>assistant\n"
    ends = tok.end_ids(model.config) + [tok.special_tokens["<|im_end|>"]]
    gen = sample.generate(model, [tok.encode(text, allowed_special="all")], n, eos_id=ends,
                          generator=torch.Generator().manual_seed(1337), vocab_limit=tok.vocab_size,
                          record=model.config.attn == "block", **kw)
    ids = sample.until_end(gen.generated[0].tolist(), ends)
    if model.config.attn == "block":
        return ids, chat.show_rounds(chat.token_pieces(tok, ids), gen.rounds[0, :len(ids)].tolist())
    return ids, tok.decode(ids)


def run_chat(monkeypatch, capsys, d, lines, *flags):
    import sample
    monkeypatch.setattr(sys, "argv", ["sample.py", "--ckpt", str(d), "--chat", "--max_new_tokens", "8",
                                      "--device", "cpu", *flags])
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(x + "\n" for x in lines)))
    sample.main()
    return capsys.readouterr().out


@pytest.mark.parametrize("attn", ["causal", "bidirectional", "block"])
def test_chat_is_multi_turn(ckpts, tmp_path, monkeypatch, capsys, attn):
    """Piped standard input: each answer is the sampler's on the whole conversation so far, rendered by the
    template (earlier answers included); /reset forgets it; the session ends at end of input."""
    d = chat_ckpt(ckpts, tmp_path, attn)
    out = run_chat(monkeypatch, capsys, d, ["hi", "more", "/reset", "more"])
    a1, shown1 = expected_reply(d, [dict(role="user", content="hi")])
    history = [dict(role="user", content="hi"), dict(role="assistant", content=Tokenizer.from_pretrained(d).decode(a1))]
    _, shown2 = expected_reply(d, history + [dict(role="user", content="more")])
    _, shown3 = expected_reply(d, [dict(role="user", content="more")])
    head, *turns = out.split("you> ")
    assert head == "chat: greedy. /set NAME VALUE changes a setting, Ctrl-C ends a turn, /reset forgets the " \
                   "conversation, Ctrl-D or /quit ends the session\n"
    assert turns == [f"hi\n{shown1}\n", f"more\n{shown2}\n", "/reset\n(conversation forgotten)\n",
                     f"more\n{shown3}\n\n"]  # each piped line echoed, then its answer; the end of input
    assert shown1 != shown2 and len(set(a1)) > 2  # the history changed the answer; an answer of several tokens


def test_chat_ctrl_c_ends_the_turn_not_the_session(ckpts, tmp_path, monkeypatch, capsys):
    """Ctrl-C during an answer ends that turn and drops its question; the next question is answered alone."""
    import sample
    d, calls, generate = chat_ckpt(ckpts, tmp_path, "block"), [], sample.generate

    def interrupted_once(*a, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return generate(*a, **kw)
    monkeypatch.setattr(sample, "generate", interrupted_once)
    out = run_chat(monkeypatch, capsys, d, ["first", "second"])
    assert len(calls) == 2 and "(turn ended)" in out
    _, shown = expected_reply(d, [dict(role="user", content="second")])
    assert out.split("you> ")[2] == f"second\n{shown}\n\n"


def test_chat_set_changes_a_setting_and_refuses_bad_ones(ckpts, tmp_path, monkeypatch, capsys):
    """/set NAME VALUE changes one sampling setting for the next answers (here: sampling at temperature 2, top_k
    off, the same draws as generate's with those settings); an unknown name, a value that is not a number, a
    penalty <= 0 or a min_p outside [0, 1] gets one line and changes nothing."""
    d = chat_ckpt(ckpts, tmp_path, "causal")
    bad = ["/set bogus 1", "/set top_k x", "/set repetition_penalty 0", "/set min_p 1.5", "/set temperature"]
    out = run_chat(monkeypatch, capsys, d, bad + ["/set temperature 2", "/set top_k none", "hi"], "--top_k", "5")
    turns = out.split("you> ")[1:]
    assert [t.count("\n") for t in turns[:5]] == [2] * 5 and all("(/set: " in t for t in turns[:5])
    assert "bogus" in turns[0] and "'x' is not an integer" in turns[1] and "repetition_penalty 0.0" in turns[2]
    assert "min_p 1.5" in turns[3] and "usage: /set NAME VALUE" in turns[4]
    assert turns[5] == "/set temperature 2\n(temperature 2, top_k 5)\n"
    assert turns[6] == "/set top_k none\n(temperature 2)\n"
    _, shown = expected_reply(d, [dict(role="user", content="hi")], temperature=2.0)
    assert turns[7] == f"hi\n{shown}\n\n" and shown != expected_reply(d, [dict(role="user", content="hi")])[1]


def test_chat_reads_every_piped_line(ckpts, tmp_path):
    """Input piped from another program: every line is a turn or a command, answered in order, the last one
    without its newline too (a real pipe, as `printf ... | python sample.py --chat`)."""
    import subprocess
    d = chat_ckpt(ckpts, tmp_path, "causal")
    lines = ["What is 7 plus 5?", "/reset", "/set repetition_penalty 1.3", "What is the capital of Japan?", "/reset",
             "one more"]
    r = subprocess.run([sys.executable, str(ROOT / "sample.py"), "--ckpt", str(d), "--chat", "--max_new_tokens", "8",
                        "--device", "cpu"], input="\n".join(lines), capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    turns = r.stdout.split("you> ")[1:]
    assert [t.split("\n")[0] for t in turns] == lines
    assert turns[1] == turns[4] == "/reset\n(conversation forgotten)\n"
    assert turns[2] == "/set repetition_penalty 1.3\n(greedy, repetition_penalty 1.3)\n"
    _, shown = expected_reply(d, [dict(role="user", content=lines[3])], repetition_penalty=1.3)
    assert turns[3] == f"{lines[3]}\n{shown}\n"
    _, shown = expected_reply(d, [dict(role="user", content=lines[5])], repetition_penalty=1.3)
    assert turns[5] == f"{lines[5]}\n{shown}\n\n"


def test_chat_defaults_come_from_generation_config(ckpts, tmp_path, monkeypatch, capsys):
    """The checkpoint's generation_config.json sets the chat's sampling, said in its first line; flags override
    it; a penalty <= 0 or a min_p outside [0, 1] is refused in one line."""
    d = chat_ckpt(ckpts, tmp_path, "causal")
    (d / "generation_config.json").write_text(json.dumps(dict(do_sample=True, temperature=0.6, top_p=0.9,
                                                              repetition_penalty=1.2)))
    first = run_chat(monkeypatch, capsys, d, []).splitlines()[0]
    assert first.startswith("chat: temperature 0.6, top_k 50, top_p 0.9, repetition_penalty 1.2. /set")
    first = run_chat(monkeypatch, capsys, d, [], "--temperature", "0", "--repetition_penalty", "1.1").splitlines()[0]
    assert first.startswith("chat: greedy, repetition_penalty 1.1. /set")
    for flags, what in ((["--repetition_penalty", "0"], "repetition_penalty 0.0"), (["--min_p", "-0.1"], "min_p -0.1"),
                        (["--min_p", "2"], "min_p 2.0")):
        r = run_script("sample.py", "--ckpt", d, "--chat", "--device", "cpu", *flags)
        assert r.returncode == 1 and what in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_stream_view_prints_the_answer_as_it_is_fed(capsys):
    """An AR answer is printed token by token as each is fed back, up to the first end token; a character whose
    bytes span two tokens is printed when it is complete."""
    from lib import chat
    tok, P = Tokenizer.byte_level(), 3
    hook, printed = chat.stream_view(tok, P, [256])
    snow = list("☃".encode())  # three byte tokens, one character
    feeds = [([1, 2, 3], range(3)), ([ord("a")], [3]), ([snow[0]], [4]), ([snow[1]], [5]), ([snow[2]], [6]),
             ([256], [7]), ([ord("z")], [8])]
    seen = []
    for x, slots in feeds:
        hook(None, (torch.tensor([x]),), dict(slots=torch.tensor(list(slots))))
        seen.append(capsys.readouterr().out)
    assert seen == ["", "a", "", "", "☃", "", ""] and printed[0] == "a☃"


def test_loop_rule_and_the_loop_table(ckpts, tmp_path, monkeypatch):
    """scripts/loops.py: a reply loops when a 3-word sequence occurs three times or more; its table counts the
    replies of every prompt under each setting, written with every reply."""
    from scripts import loops
    assert loops.loops("a leaf's fate is determined, a leaf's fate is determined, a leaf's fate is determined")
    assert loops.loops("la la la la la") and not loops.loops("one two three one two three four")
    assert not loops.loops("Je suis bonjour, je suis bonjour")  # twice is not a loop
    d = chat_ckpt(ckpts, tmp_path, "causal")
    held = [dict(family="sum", prompt="What is 2 + 3?", answer="5"), dict(family="open", prompt="Why?"),
            dict(family="capital", prompt="The capital of France?", answer="Paris")]
    (tmp_path / "held.jsonl").write_text("".join(json.dumps(it) + "\n" for it in held))
    monkeypatch.setattr(sys, "argv", ["loops.py", "--ckpt", str(d), "--settings", "greedy",
                                      "greedy, repetition_penalty 1.2", "--max_new_tokens", "12",
                                      "--heldout", str(tmp_path / "held.jsonl"), "--out", str(tmp_path / "loops.json")])
    loops.main()
    assert torch.is_grad_enabled()  # nothing global changed for whatever runs next in this process
    res = json.loads((tmp_path / "loops.json").read_text())
    assert len(res["runs"]) == 2 and res["tokens_per_second"][str(d)]["value"] > 0
    for run in res["runs"].values():
        assert len(run["replies"]) == 1 and len(run["replies"][0]) == len(loops.OPEN_PROMPTS) == 30
        assert run["loop_share"] == sum(map(loops.loops, run["replies"][0])) / 30
        assert run["heldout_accuracy"] in (0, 0.5, 1)  # of the sum and the capital (the open prompt is left out)
    assert res["chosen"] == loops.choose({r["setting"]: r for r in res["runs"].values()})
    runs = {"greedy": dict(loop_share=0.5, heldout_accuracy=0.40), "a": dict(loop_share=0.0, heldout_accuracy=0.30),
            "b": dict(loop_share=0.0, heldout_accuracy=0.33), "c": dict(loop_share=0.0, heldout_accuracy=0.33)}
    assert loops.choose(runs) == "b"  # no loops, then the best accuracy; b and c tie: the earlier
    assert loops.choose(dict(runs, a=dict(loop_share=0.1, heldout_accuracy=0.9))) == "b"  # a loops once in ten
    assert loops.choose({"greedy": runs["greedy"]}) is None


def test_chat_through_a_pseudo_terminal(ckpts, tmp_path):
    """On a terminal: the block DLM's answer is redrawn as it is decoded (▒: still masked), then shown with its
    rounds; Ctrl-C at the prompt gives a fresh prompt; Ctrl-D ends the session, exit code 0."""
    import fcntl
    import os
    import pty
    import select
    import signal
    import subprocess
    import termios
    import time
    d = chat_ckpt(ckpts, tmp_path, "block")
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, str(ROOT / "sample.py"), "--ckpt", str(d), "--chat", "--max_new_tokens",
                             "8", "--device", "cpu"], stdin=slave, stdout=slave, stderr=slave, cwd=ROOT,
                            start_new_session=True, preexec_fn=lambda: (  # the terminal its own, Ctrl-C not ignored
                                fcntl.ioctl(0, termios.TIOCSCTTY, 0), signal.signal(signal.SIGINT, signal.SIG_DFL),
                                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})))
    os.close(slave)
    out = b""

    def read_until(marker, count, timeout=60):
        nonlocal out
        end = time.time() + timeout
        while out.count(marker) < count and time.time() < end and proc.poll() is None:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    out += os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
        return out.count(marker) >= count
    try:
        assert read_until(b"you> ", 1), out.decode(errors="replace")
        os.write(master, b"hi\n")
        assert read_until(b"you> ", 2), out.decode(errors="replace")
        os.write(master, b"\x03")  # Ctrl-C at the prompt: SIGINT from the terminal
        assert read_until(b"you> ", 3), out.decode(errors="replace")
        os.write(master, b"\x04")  # Ctrl-D: end of input
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        os.close(master)
    text = out.decode(errors="replace")
    assert "▒" in text and "\x1b[K" in text  # the live status line, redrawn
    assert "\x1b[3" in text.split("you> ")[1]  # the round view, coloured on a terminal


def test_ctrl_c_at_the_prompt_taken_by_another_thread():
    """The terminal's line reader: a SIGINT taken by a worker thread (as one of torch's may take it) still ends the
    wait at the prompt, where a read blocked in the main thread would wait for the next line; lines come one at a
    time with what was read past them kept; Ctrl-D after some text ends that line, on an empty line, input."""
    import os
    import signal
    import threading
    import time
    from lib import chat
    r, w = os.pipe()
    saved, outer = os.dup(0), signal.signal(signal.SIGINT, signal.default_int_handler)
    os.dup2(r, 0)

    def interrupt_from_this_thread():
        time.sleep(0.3)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        time.sleep(3)
        os.write(w, b"\n")  # a reader the signal did not reach wakes here, late: the test fails, not hangs
    try:
        worker = threading.Thread(target=interrupt_from_this_thread, daemon=True)
        worker.start()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            chat.terminal_line(b"")
        assert time.monotonic() - start < 2  # at the signal, not at the worker's line after it
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the outer handler is back
        worker.join()
        assert chat.terminal_line(b"") == ("", b"")  # the worker's late line, not lost either
        os.write(w, "héllo\nwor".encode())
        assert chat.terminal_line(b"") == ("héllo", b"wor")
        os.close(w)
        assert chat.terminal_line(b"wor") == ("wor", b"")
        assert chat.terminal_line(b"") == (None, b"")
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(r)
        signal.signal(signal.SIGINT, outer)
