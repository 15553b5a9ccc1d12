"""Our Qwen3 against the reference: transformers' Qwen3ForCausalLM on tiny random configs, every tensor
randomised (norm weights included); the attention modes position by position; the KV-cache path against
the full forward (checkpoint files: test_checkpoint.py)."""
import pytest
import torch

from conftest import TINY, ids, randomise  # the pair fixture comes from conftest too
from model import KVCache, Qwen3, Qwen3Config, attention_mask, preset
from lib import training



def test_config_maps_hf_json(pair):
    ref, ours, _ = pair
    c = ours.config
    assert (c.hidden_size, c.head_dim, c.num_key_value_heads, c.tie_word_embeddings) == \
           (64, 24, 2, ref.config.tie_word_embeddings)
    assert c.rope_theta == 10_000.0


def test_causal_logits_and_hidden_states_match_hf(pair):
    ref, ours, _ = pair
    x = ids()
    with torch.no_grad():
        out = ref(x, output_hidden_states=True)
        logits, hidden = ours(x, attn="causal", output_hidden_states=True)
    assert len(hidden) == len(out.hidden_states) == TINY["num_hidden_layers"] + 1
    torch.testing.assert_close(logits, out.logits, atol=1e-5, rtol=1e-5)
    for a, b in zip(hidden, out.hidden_states):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attn,block_size", [("bidirectional", None), ("block", 4), ("block", 5)])
def test_other_modes_match_hf_with_explicit_mask(pair, attn, block_size):
    ref, ours, _ = pair
    x = ids(T=14)
    T = x.shape[1]
    q = torch.arange(T)
    if attn == "bidirectional":
        m = torch.ones(T, T, dtype=torch.bool)
    else:  # written out the slow, obvious way: i sees j iff block(j) <= block(i)
        m = torch.tensor([[j // block_size <= i // block_size for j in range(T)] for i in range(T)])
    with torch.no_grad():
        additive = torch.zeros(T, T).masked_fill(~m, float("-inf"))  # HF's eager attention adds the mask
        want = ref(x, attention_mask=additive[None, None].expand(2, 1, T, T), output_hidden_states=True)
        got, hidden = ours(x, attn=attn, block_size=block_size, output_hidden_states=True)
    torch.testing.assert_close(got, want.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hidden[2], want.hidden_states[2], atol=1e-5, rtol=1e-5)
    assert torch.equal(attention_mask(attn, q, q, block_size), m)


def test_presets_match_published_shapes():
    shapes = {"qwen3-0.6b": (1024, 28, 16, 8, 3072, True), "qwen3-1.7b": (2048, 28, 16, 8, 6144, True),
              "qwen3-4b": (2560, 36, 32, 8, 9728, True), "qwen3-8b": (4096, 36, 32, 8, 12288, False)}
    for name, (h, L, nh, nkv, mlp, tied) in shapes.items():
        c = preset(name)
        assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
                c.intermediate_size, c.tie_word_embeddings) == (h, L, nh, nkv, mlp, tied)
        assert (c.vocab_size, c.rope_theta, c.rms_norm_eps, c.head_dim) == (151936, 1e6, 1e-6, 128)
    with torch.device("meta"):
        assert 590e6 < Qwen3(preset("qwen3-0.6b")).num_params() < 610e6  # "0.6B" (tied, 596M)


@pytest.mark.parametrize("attn,bs", [("causal", None), ("bidirectional", None), ("block", 3)])
def test_modes_position_by_position(attn, bs):
    """Change one input token; exactly the positions allowed to see it must change."""
    torch.manual_seed(0)
    m = randomise(Qwen3(Qwen3Config(**TINY)).eval())
    T = 10
    x = ids(B=1, T=T)
    with torch.no_grad():
        base = m(x, attn=attn, block_size=bs)
        for j in range(T):
            y = x.clone()
            y[0, j] = (y[0, j] + 1) % 101
            changed = (m(y, attn=attn, block_size=bs) - base).abs().amax(-1)[0] > 1e-6
            want = [attn == "bidirectional" or (j <= i if attn == "causal" else j // bs <= i // bs) for i in range(T)]
            assert changed.tolist() == want, (attn, j)


@pytest.mark.parametrize("attn,bs", [("causal", None), ("block", 4), ("bidirectional", None)])
def test_kv_cache_matches_full_forward(attn, bs):
    """Feed the sequence in chunks through a static cache: logits equal the one-shot forward."""
    m = randomise(Qwen3(Qwen3Config(**TINY)).eval())
    x = ids(B=2, T=12)
    with torch.no_grad():
        full = m(x, attn=attn, block_size=bs)
        cache = m.new_cache(2, 16)
        assert isinstance(cache, KVCache) and len(cache.k) == 3 and cache.k[0].shape == (2, 2, 16, 24)
        outs = []
        for s, e in [(0, 4), (4, 8), (8, 12)]:  # block-aligned chunks
            outs.append(m(x[:, s:e], attn=attn, block_size=bs, cache=cache, slots=torch.arange(s, e)))
    got = torch.cat(outs, 1)
    if attn == "bidirectional":
        # cached chunks never saw later chunks (Fast-dLLM's approximate prefix cache): that is exactly
        # block attention with the chunk as the block, and differs from the true bidirectional forward
        with torch.no_grad():
            torch.testing.assert_close(got, m(x, attn="block", block_size=4), atol=1e-5, rtol=1e-5)
        assert (got - full).abs().max() > 1e-3
    else:
        torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)


def test_rope_positions_and_explicit_mask():
    """Explicit per-row positions and a boolean mask reproduce a left-padded row's logits."""
    m = randomise(Qwen3(Qwen3Config(**TINY)).eval())
    x = ids(B=1, T=6)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), x], 1)
    T = padded.shape[1]
    pos = (torch.arange(T) - 3).clamp(min=0)[None]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    mask[3:, :3] = False  # real tokens never see the pads
    with torch.no_grad():
        got = m(padded, attn=mask[None, None], pos=pos)[:, 3:]
        torch.testing.assert_close(got, m(x, attn="causal"), atol=1e-5, rtol=1e-5)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_block_mask_equals_dense_mask():
    """A FlexAttention BlockMask gives the logits of the same rule as a dense boolean mask (GQA, 2 x 2 tiles of
    128, per-row left pads). flex_attention runs eagerly on CPU, forward only."""
    from torch.nn.attention.flex_attention import create_block_mask
    m = randomise(Qwen3(Qwen3Config(**TINY)).eval())
    B, T, bs = 2, 150, 5
    x = ids(B=B, T=T)
    pads = torch.tensor([0, 7])

    def rule(b, h, q, k):  # block rule, row b's first pads[b] slots hidden, the diagonal always allowed
        return ((k // bs <= q // bs) & (k >= pads[b])) | (q == k)
    i = torch.arange(T)
    dense = rule(torch.arange(B)[:, None, None, None], None, i[:, None], i)  # (B, 1, T, T)
    with torch.no_grad():
        want = m(x, attn=dense)
        got = m(x, attn=create_block_mask(rule, B, None, T, T, device="cpu"))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_freeze_groups_and_checkpointing_grads():
    m = randomise(Qwen3(Qwen3Config(**TINY, tie_word_embeddings=False)))
    training.freeze(m, ["embed", "mlp"])
    frozen = {n for n, p in m.named_parameters() if not p.requires_grad}
    assert frozen == {"model.embed_tokens.weight"} | {n for n, _ in m.named_parameters() if ".mlp." in n}
    x = ids(B=2, T=8)
    loss = m(x, attn="bidirectional").logsumexp(-1).mean()
    loss.backward()
    g1 = {n: p.grad.clone() for n, p in m.named_parameters() if p.requires_grad}
    m.zero_grad(set_to_none=True)
    m.model.gradient_checkpointing = True
    m.train()
    m(x, attn="bidirectional").logsumexp(-1).mean().backward()
    for n, p in m.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p.grad, g1[n], atol=1e-6, rtol=1e-5)
    tied = Qwen3(Qwen3Config(**TINY))
    def group(name):
        return training.param_group(tied, name)
    assert group("lm_head") == group("embed") == ["model.embed_tokens.weight"]
    with pytest.raises(ValueError, match="unknown parameter group"):
        training.freeze(tied, ["embeddings"])


# ---- bad inputs: each a clear error naming the problem ----------------------------------------


def test_bad_forward_arguments():
    m = Qwen3(Qwen3Config(**TINY))
    with pytest.raises(ValueError, match="LongTensor"):
        m(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="block_size"):
        m(ids(), attn="block")
    with pytest.raises(ValueError, match="attn must be one of"):
        m(ids(), attn="sliding")
