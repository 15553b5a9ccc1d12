"""Our Qwen3 against the reference: transformers' Qwen3ForCausalLM on tiny random configs, every tensor
randomised (norm weights included); the attention modes position by position; the KV-cache path against
the full forward; checkpoints both ways; and clear errors for bad checkpoints."""
import json

import pytest
import torch

from model import KVCache, Qwen3, Qwen3Config, attention_mask, preset

import transformers  # the reference implementation (requirements-dev.txt)

# head_dim 24 != hidden 64 / 4 heads; 4 query heads share 2 KV heads (GQA)
TINY = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=24, max_position_embeddings=256, rope_theta=10_000.0, rms_norm_eps=1e-6,
            bos_token_id=0, eos_token_id=0, torch_dtype="float32")


def randomise(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if name.endswith("norm.weight") else 0.0  # norms near 1, but not exactly
            p.copy_(base + torch.randn(p.shape, generator=g) * (0.3 if base else 0.1))
    return model


def hf_model(tied, **kw):
    cfg = transformers.Qwen3Config(**{**TINY, **kw}, tie_word_embeddings=tied, attn_implementation="eager")
    return randomise(transformers.Qwen3ForCausalLM(cfg).eval(), seed=1)


@pytest.fixture(params=[True, False], ids=["tied", "untied"])
def pair(request, tmp_path):
    """(reference HF model, our model loaded from the reference's saved checkpoint)."""
    ref = hf_model(request.param)
    ref.save_pretrained(tmp_path / "hf")
    ours = Qwen3.from_pretrained(tmp_path / "hf").eval()
    return ref, ours, tmp_path


def ids(B=2, T=13, vocab=101, seed=0):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


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


def test_our_checkpoint_loads_in_transformers(pair):
    ref, ours, tmp = pair
    randomise(ours, seed=7)  # new weights, so agreement cannot come from the original file
    ours.save_pretrained(tmp / "ours")
    assert not list((tmp / "ours").glob("*.tmp"))
    back = transformers.Qwen3ForCausalLM.from_pretrained(tmp / "ours").eval()
    x = ids(seed=3)
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, ours(x, attn="causal"), atol=1e-5, rtol=1e-5)
    again = Qwen3.from_pretrained(tmp / "ours")  # and our own round trip is exact
    for (n, a), (_, b) in zip(ours.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), n


def test_transformers_4x_and_5x_config_styles(tmp_path):
    d = {**TINY, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    v4 = dict(d, rope_theta=123.0, torch_dtype="bfloat16")
    v5 = {k: v for k, v in d.items() if k not in ("rope_theta", "torch_dtype")}
    v5.update(rope_parameters={"rope_type": "default", "rope_theta": 123.0}, dtype="bfloat16")
    for cfg in (v4, v5):
        c = Qwen3Config.from_dict(cfg)
        assert c.rope_theta == 123.0 and c.torch_dtype == "bfloat16"
    c = Qwen3Config.from_dict(dict(v4, some_future_key=5))
    assert c.to_dict()["some_future_key"] == 5  # unknown keys survive a save


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
    m.freeze(["embed", "mlp"])
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
    assert tied.param_group("lm_head") == tied.param_group("embed") == ["model.embed_tokens.weight"]
    with pytest.raises(ValueError, match="unknown parameter group"):
        tied.freeze(["embeddings"])


def test_bf16_loads_without_fp32_copy(tmp_path):
    m = randomise(Qwen3(Qwen3Config(**TINY))).to(torch.bfloat16)
    m.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    back = Qwen3.from_pretrained(tmp_path)
    assert all(p.dtype == torch.bfloat16 for p in back.parameters())
    assert back.lm_head.weight is back.model.embed_tokens.weight
    assert Qwen3.from_pretrained(tmp_path, dtype=torch.float32).lm_head.weight.dtype == torch.float32


def test_sharded_checkpoint(tmp_path):
    ref = hf_model(tied=False)
    ref.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    ours = Qwen3.from_pretrained(tmp_path)
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(ours(x, attn="causal"), ref(x).logits, atol=1e-5, rtol=1e-5)


def test_qwen_layout_stored_head_generation_config_and_saving_over_shards(tmp_path):
    """Qwen3-0.6B's file stores lm_head.weight although the config ties it: it is never read (here it is garbage, and
    the logits are still transformers'). generation_config.json (eos_token_id) survives a save. Saving into a
    directory that holds a sharded checkpoint replaces its index and shards by one model.safetensors."""
    from safetensors.torch import load_file, save_file
    ref = hf_model(tied=True)
    ref.generation_config.eos_token_id = [5, 0]
    ref.save_pretrained(tmp_path / "q")
    state = load_file(tmp_path / "q/model.safetensors")
    assert "lm_head.weight" not in state
    save_file({**state, "lm_head.weight": torch.full((101, 64), 7.0)}, tmp_path / "q/model.safetensors")
    ours = Qwen3.from_pretrained(tmp_path / "q").eval()
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(ours(x, attn="causal"), ref(x).logits, atol=1e-5, rtol=1e-5)
    assert ours.config.generation["eos_token_id"] == [5, 0]
    ours.save_pretrained(tmp_path / "back")
    assert json.loads((tmp_path / "back/generation_config.json").read_text()) == ours.config.generation

    ref.save_pretrained(tmp_path / "s", max_shard_size="20KB")
    shards = sorted((tmp_path / "s").glob("model-*.safetensors"))
    assert len(shards) > 1
    Qwen3.from_pretrained(tmp_path / "s").save_pretrained(tmp_path / "s")
    assert not (tmp_path / "s/model.safetensors.index.json").exists() and not any(f.exists() for f in shards)
    with torch.no_grad():
        torch.testing.assert_close(Qwen3.from_pretrained(tmp_path / "s")(x, attn="causal"), ref(x).logits,
                                   atol=1e-5, rtol=1e-5)


# ---- bad inputs: each a clear error naming the problem ----------------------------------------

def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        Qwen3.from_pretrained(tmp_path)
    Qwen3(Qwen3Config(**TINY)).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        Qwen3.from_pretrained(tmp_path)


def test_truncated_safetensors(tmp_path):
    Qwen3(Qwen3Config(**TINY)).save_pretrained(tmp_path)
    f = tmp_path / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        Qwen3.from_pretrained(tmp_path)


def test_shape_mismatch_and_other_architecture(tmp_path):
    Qwen3(Qwen3Config(**TINY)).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, intermediate_size=128)))
    with pytest.raises(ValueError, match=r"mlp\.\w+_proj\.weight has shape .* config.json implies"):
        Qwen3.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, model_type="llama", architectures=["LlamaForCausalLM"])))
    with pytest.raises(ValueError, match="not a Qwen3 checkpoint"):
        Qwen3Config.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, tie_word_embeddings=False)))
    with pytest.raises(ValueError, match="no lm_head.weight"):
        Qwen3.from_pretrained(tmp_path)


def test_bad_forward_arguments():
    m = Qwen3(Qwen3Config(**TINY))
    with pytest.raises(ValueError, match="LongTensor"):
        m(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="block_size"):
        m(ids(), attn="block")
    with pytest.raises(ValueError, match="attn must be one of"):
        m(ids(), attn="sliding")
