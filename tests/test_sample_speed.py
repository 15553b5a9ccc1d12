"""The fast paths of sample.py against slow references written here: Fast-dLLM's approximate KV cache
(diffusion_generate cache="prefix" | "dual") against a full forward per step in which every decoder layer's
input at the cached positions is replaced by the one recorded at the block's first step (so their keys and
values are that step's, as a cache would hold them); and the compiled samplers (torch.compile, inductor, CPU)
against the eager ones token for token (the compile machinery itself: test_compiling.py)."""
import pytest
import torch

import sample as S
from sample import ar_generate, block_generate, diffusion_generate
from test_sample import EOS, MASK, PROMPTS, greedy, make


@torch.no_grad()
def slow_cached_llada(m, ids, gen_length, block_length, shift, cache, threshold=None):
    """One prompt, no padding. Each step: a full bidirectional forward; then (threshold None) the single most
    confident masked position of the current block is committed (the first on ties), or every one at or above
    the threshold plus the most confident. With a cache, the block's first step records each decoder layer's
    input at every position; its later steps compute afresh only the fed positions (from the block's first
    slot, or the slot before it when shifted, to the end: "prefix", or to the block's end: "dual") and give
    every other position, at every layer, its recorded input."""
    x, P, L = list(ids) + [MASK] * gen_length, len(ids), len(ids) + gen_length
    record, fresh = {}, None  # fresh: (L,) bool, the positions computed afresh in this step (None: all)

    def pre_hook(layer, args):
        h = args[0]
        if fresh is None:
            record[layer] = h.clone()
            return None
        h = torch.where(fresh[None, :, None], h, record[layer])  # (1, L, C)
        return (h, *args[1:])
    hooks = [layer.register_forward_pre_hook(pre_hook) for layer in m.model.layers]
    try:
        for blk in range(gen_length // block_length):
            s, e = P + blk * block_length, P + (blk + 1) * block_length
            for step in range(block_length):
                slot = torch.arange(L)
                fed = (slot >= s - shift) & (slot < (e if cache == "dual" else L))
                fresh = None if cache == "none" or step == 0 else fed
                conf, tok = greedy(m(torch.tensor([x]), attn="bidirectional")[0])  # (L,) each
                cands = [(float(conf[i - shift]), -i) for i in range(s, e) if x[i] == MASK]
                best = -max(cands)[1]  # the most confident, the first on ties
                for i in range(s, e):
                    if i == best or (threshold is not None and x[i] == MASK and conf[i - shift] >= threshold):
                        x[i] = int(tok[i - shift])
                if MASK not in x[s:e]:
                    break
    finally:
        for h in hooks:
            h.remove()
    return torch.tensor(x)


@pytest.mark.parametrize("shift", [True, False])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_diffusion_cache_equals_slow_reference(shift, cache):
    m = make("bidirectional", shift=shift)
    for thr in (None, 0.6):
        gen = diffusion_generate(m, PROMPTS, 12, 4, 12, threshold=thr, cache=cache)
        for b, ids in enumerate(PROMPTS):  # each row of the ragged batch (pads hidden from the cache too)
            want = slow_cached_llada(m, ids, 12, 4, shift, cache, thr)
            assert torch.equal(gen.sequence(b), want), (b, thr)
        exact = diffusion_generate(m, PROMPTS, 12, 4, 12, threshold=thr)
        if thr is None:  # the approximation is real: the uncached sampler differs somewhere (else the test is weak)
            assert not torch.equal(exact.tokens, gen.tokens)
            assert gen.nfe == exact.nfe == 12  # a refresh is a step: the cache saves no forward, only their cost
    assert torch.equal(slow_cached_llada(m, PROMPTS[1], 8, 4, shift, "none"),
                       diffusion_generate(m, PROMPTS[1:2], 8, 4, 8).tokens[0])  # the reference's own uncached case


def test_diffusion_cache_refused():
    m = make("bidirectional", shift=True)
    with pytest.raises(ValueError, match="cache must be one of none, prefix, dual"):
        diffusion_generate(m, PROMPTS, 8, 4, 8, cache="full")
    with pytest.raises(ValueError, match="cache: not used by the AR sampler"):
        S.generate(make(), PROMPTS, 8, cache="dual")


# ---- torch.compile ------------------------------------------------------------------------------------

def test_compiled_samplers_equal_eager():
    """Inductor on the CPU: the same tokens, rounds and counts as eager, for a ragged batch (eos: two ids)."""
    torch._dynamo.reset()
    ar, blk = make(), make("block", shift=True, block_size=4)
    runs = {"ar": lambda **kw: ar_generate(ar, PROMPTS, 12, eos_id=[EOS, 2], **kw),
            "ar, batch 1": lambda **kw: ar_generate(ar, PROMPTS[1:2], 12, **kw),  # one-row matmuls (one_row_mm)
            "block": lambda **kw: block_generate(blk, PROMPTS, 16, threshold=0.7, record=True, eos_id=EOS, **kw)}
    for name, run in runs.items():
        eager, compiled = run(), run(compile=True)
        assert torch.equal(eager.tokens, compiled.tokens), name
        assert torch.equal(eager.row_nfe, compiled.row_nfe) and eager.nfe == compiled.nfe, name
        if name == "block":
            assert torch.equal(eager.rounds, compiled.rounds)


