"""The DLM samplers' end-token rules (eos_rule free / last / penalty) against a slow per-row reference written here
(a full forward per round of one row alone, the rule applied by hand, commits chosen by a Python loop); the "last"
invariant (no end token committed while a slot before it is masked); a stub whose most likely token after the answer
is the end token decoding exactly one token per forward under "last" at threshold 1.0; penalty 0 equal to free;
each row's forwards split into answer forwards and forwards after the answer, adding up; refusals."""
import pytest
import torch

import sample as S
from conftest import run_script
from sample import block_generate, diffusion_generate
from worlds import tasks
from test_sample import EOS, MASK, PROMPTS, V, make
from test_sample_rows import height_at, positional, token_at

NEG = float("-inf")


def slow_row(model, ids, N, block, threshold, rule, penalty, shift):
    """One row decoded by the rules spelled out: per round a full forward of [prompt, canvas] alone (attention as
    the model's config says), each slot's prediction read at slot - shift, the penalty off the end id's logit, the
    greedy token and its raw probability; the masked slots of the current block are the candidates, under "last"
    without those predicting the end token while a slot before them is masked; the most confident candidate (the
    first of equals) and every one at or above the threshold are committed. The row is done once its first end
    token has nothing masked before it. -> (generated tokens, forwards)."""
    x, P, forwards = list(ids) + [MASK] * N, len(ids), 0
    for k in range(N // block):
        s, e = P + k * block, P + (k + 1) * block
        while any(t == MASK for t in x[s:e]):
            first = next(j for j in range(P, P + N) if x[j] in (MASK, EOS))
            if x[first] == EOS:  # done: its answer is complete
                return x[P:first] + [EOS] * (P + N - first), forwards
            with torch.no_grad():
                logits = model(torch.tensor([x]), pos=torch.arange(len(x))[None])[0].float()  # (T, V)
            forwards += 1
            logits[:, MASK] = NEG
            logits[:, EOS] -= penalty if rule == "penalty" else 0.0
            cand = []
            for j in range(s, e):
                row = logits[j - shift]
                tok, conf = int(row.argmax()), float(row.softmax(-1).max())
                held = rule == "last" and tok == EOS and any(t == MASK for t in x[s:j])
                if x[j] == MASK and not held:
                    cand.append((conf, j, tok))
            best = max(cand, key=lambda c: (c[0], -c[1]))
            for conf, j, tok in cand:
                if conf >= threshold or (conf, j) == best[:2]:
                    x[j] = tok
    first = next((j for j in range(P, P + N) if x[j] == EOS), P + N)
    return x[P:first] + [EOS] * (P + N - first), forwards


def batched(kind, model, prompts, N, block, threshold, **kw):
    if kind == "block":
        return block_generate(model, prompts, N, block, threshold=threshold, eos_id=EOS, record=True, **kw)
    return diffusion_generate(model, prompts, N, block, N, threshold=threshold, eos_id=EOS, record=True, **kw)


@pytest.mark.parametrize("rule,penalty", [("free", 0.0), ("last", 0.0), ("penalty", 2.0), ("penalty", 9.0)])
@pytest.mark.parametrize("kind,shift", [("bidirectional", True), ("bidirectional", False), ("block", False),
                                        ("block", True)])
def test_each_rule_equals_the_slow_reference(kind, shift, rule, penalty):
    """Batch-1 rows (prompts of whole blocks, so no padding) on a positional model (eos predicted at one RoPE
    position: the rules change the decoding) and on a random one, at thresholds 0.5 and 0.9, blocks of 4 and
    (masked diffusion) the whole canvas: the same tokens and forwards as the slow loop."""
    models = [positional(make(kind, shift=shift, block_size=4)), make(kind, shift=shift, block_size=4, seed=3)]
    for m in models:
        for ids in ([3, 4, 5, 6], [6, 7, 8, 9, 10, 11, 12, 2]):
            for thr in (0.5, 0.9):
                for block in ([4] if kind == "block" else [4, 16]):
                    g = batched(kind, m, [ids], 16, block, thr, eos_rule=rule, eos_penalty=penalty)
                    want = slow_row(m, ids, 16, block, thr, rule, penalty, int(shift))
                    assert (g.generated[0].tolist(), int(g.row_nfe[0])) == want, (ids, thr, block)


def committed_before_done(g, block, eos):
    """Per row, whether its first end token was committed while a slot before it was still masked: a slot before
    it committed by a later forward, or by the same one. (The slots after it are closed, not committed.)"""
    B, N = g.rounds.shape
    key = torch.arange(N) // block * block + g.rounds  # the forward that committed each slot
    bad = []
    for b in range(B):
        j = int(g.row_tokens[b]) - 1
        assert j == N - 1 or (int(g.generated[b, j]) in eos and g.rounds[b, j] >= 0)
        bad.append(int(g.generated[b, j]) in eos and any(key[b, i] >= key[b, j] for i in range(j)))
    return bad


@pytest.mark.parametrize("kind", ["bidirectional", "block"])
def test_last_never_commits_an_end_token_with_a_masked_slot_before_it(kind):
    """Ragged batches on the positional model and on random ones, at several thresholds and (masked diffusion)
    LLaDA's fixed steps too: under "last" never; under "free" it happens (so the check can fail)."""
    seen_free = False
    for m in [positional(make(kind, shift=False, block_size=4))] + [make(kind, shift=False, block_size=4, seed=s)
                                                                    for s in range(3)]:
        runs = [dict(threshold=t) for t in (0.3, 0.9, 1.0)]
        if kind == "bidirectional":
            runs.append(dict(threshold=None, steps=8))  # two tokens a step: "last" may need extra steps
        for r in runs:
            for rule in ("free", "last"):
                if kind == "block":
                    g = block_generate(m, PROMPTS, 16, 4, threshold=r["threshold"], eos_id=[EOS, 2], record=True,
                                       eos_rule=rule)
                else:
                    g = diffusion_generate(m, PROMPTS, 16, 16, r.get("steps", 16), threshold=r["threshold"],
                                           eos_id=[EOS, 2], record=True, eos_rule=rule)
                assert not (g.generated == MASK).any()  # every slot decided, extra steps or not
                bad = committed_before_done(g, 4 if kind == "block" else 16, {EOS, 2})
                if rule == "last":
                    assert not any(bad), r
                seen_free |= rule == "free" and any(bad)
    assert seen_free


def stub(kind):
    """Before RoPE position 13 an answer token (confidence < 1), from 13 on the end token, more confident than any
    answer token: the end-of-sequence trap at its plainest."""
    m = make(kind, shift=False, block_size=4)

    def hook(mod, args, kwargs, out):
        p = kwargs["pos"] if kwargs.get("rows") is None else kwargs["pos"][kwargs["rows"]]  # the head's rows
        tok = torch.where(p >= 13, EOS, token_at(p))
        h = torch.where(p >= 13, 12.0, height_at(p))
        return h[..., None] * torch.nn.functional.one_hot(tok, V).float()
    m.register_forward_hook(hook, with_kwargs=True)
    return m


@pytest.mark.parametrize("kind", ["bidirectional", "block"])
def test_last_decodes_one_token_per_forward_at_threshold_one_where_free_wastes_forwards(kind):
    m = stub(kind)
    def run(rule):
        return batched(kind, m, PROMPTS, 16, 16 if kind == "bidirectional" else 4, 1.0,
                       eos_rule=rule)
    last, free = run("last"), run("free")
    assert torch.equal(last.tokens_per_forward, torch.ones(3))  # exactly 1.00 in every row
    assert torch.equal(last.generated, free.generated)  # the same answers
    # free commits end tokens after the answer first (block: unless the answer ends its block's first slot)
    assert (free.tokens_per_forward <= 1).all() and (free.tokens_per_forward < 1).sum() >= 2
    block = 16 if kind == "bidirectional" else 4
    for g in (last, free):  # the split adds up to each row's forwards; only free spends forwards after the answer
        answer, after = tasks.forwards_split(g, block)
        assert torch.equal(answer + after, g.row_nfe)
    after = tasks.forwards_split(free, block)[1]
    assert (tasks.forwards_split(last, block)[1] == 0).all() and torch.equal(after > 0, free.tokens_per_forward < 1)
    assert torch.equal(tasks.forwards_split(free, block)[0], free.row_tokens)  # one answer token per answer forward


@pytest.mark.parametrize("kind", ["bidirectional", "block"])
def test_penalty_zero_equals_free_token_for_token(kind):
    for seed in range(3):
        m = make(kind, shift=kind == "bidirectional", block_size=4, seed=seed)
        for temperature in (0.0, 1.0):
            out = [batched(kind, m, PROMPTS, 16, 4, 0.7, temperature=temperature, eos_rule=rule, eos_penalty=0.0,
                           generator=torch.Generator().manual_seed(seed)) for rule in ("free", "penalty")]
            assert torch.equal(out[0].tokens, out[1].tokens) and torch.equal(out[0].row_nfe, out[1].row_nfe)


def test_split_adds_up_on_random_models_and_every_rule():
    for kind in ("bidirectional", "block"):
        for seed in range(3):
            m = make(kind, shift=False, block_size=4, seed=seed)
            for rule in ("free", "last", "penalty"):
                g = batched(kind, m, PROMPTS, 16, 4, 0.6, eos_rule=rule)
                answer, after = tasks.forwards_split(g, 4)
                assert torch.equal(answer + after, g.row_nfe) and (answer >= 1).all()


def test_bad_rules_are_refused_in_one_line(tmp_path):
    m = make("block", shift=False, block_size=4)
    for kw, msg in [(dict(eos_rule="latest"), "eos_rule must be one of free, last, penalty"),
                    (dict(eos_rule="penalty", eos_penalty=-1.0), "eos_penalty >= 0")]:
        with pytest.raises(ValueError, match=msg):
            S.generate(m, PROMPTS, 8, eos_id=EOS, **kw)
    with pytest.raises(ValueError, match="eos_rule: not used by the AR sampler"):
        S.generate(make(), PROMPTS, 8, eos_id=EOS, eos_rule="last")
    r = run_script("sample.py", "--ckpt", tmp_path, "--eos_rule", "latest")
    assert r.returncode == 2 and "invalid choice: 'latest'" in r.stderr
    r = run_script("eval.py", "tasks", "--ckpt", tmp_path, "--eos_rule", "penalty", "--eos_penalty", "-1")
    assert r.returncode == 2 and "'-1' is not a number >= 0" in r.stderr
