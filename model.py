"""
Qwen3 in plain PyTorch, with the attention mask chosen per call.

Notes on the design: docs/methods.md, "model.py" under §8.
"""
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask
from torch.utils.checkpoint import checkpoint

from lib import compiling
from lib.hf import ConfigFile, WeightsFile

ATTN_MODES = ("causal", "bidirectional", "block")
CE_ROWS = 1024  # Qwen3.cross_entropy without grad: rows of logits at a time (Qwen3: 1024 x 151936 fp32 = 0.6 GB)


@dataclass
class Qwen3Config(ConfigFile):  # config.json I/O: hf.ConfigFile; the field names are Hugging Face's
    model_type: str = "qwen3"  # or "llama": the same layer without the q/k RMSNorm (SmolLM2, Llama)
    vocab_size: int = 151936  # embedding rows (the tokenizer uses 151669 of them)
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128  # not hidden_size // num_attention_heads in general
    max_position_embeddings: int = 40960
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    bos_token_id: int | None = 151643
    eos_token_id: int | None = 151643
    torch_dtype: str = "bfloat16"
    # DLM fields, written by convert.py (an AR checkpoint has attn="causal" and no mask token)
    attn: str = "causal"  # default attention mode of this checkpoint
    block_size: int | None = None  # for attn="block"
    mask_token_id: int | None = None  # an unused embedding row; never sampled as an output
    shift: bool | None = None  # True: the logits at i-1 denoise position i (the AR head's meaning)
    converted_from: str | None = None
    # checkpoint bookkeeping (hf.ConfigFile): the tokenizer's fingerprint, the directory read from (not
    # saved), other config.json keys (kept on save), generation_config.json (None: the checkpoint has none)
    tokenizer_sha256: str | None = None
    path: str | None = field(default=None, repr=False, compare=False)
    extra: dict = field(default_factory=dict, repr=False)
    generation: dict | None = field(default=None, repr=False)

    def validate(self, source="config"):
        bad = {f"attn must be one of {ATTN_MODES}, got {self.attn!r}": self.attn not in ATTN_MODES,
               f"model_type must be qwen3 or llama, got {self.model_type!r}": self.model_type not in ("qwen3", "llama"),
               "attn='block' needs a positive block_size": self.attn == "block" and not (self.block_size or 0) > 0,
               "num_key_value_heads must divide the query heads": self.num_attention_heads % self.num_key_value_heads,
               f"mask_token_id {self.mask_token_id} outside the {self.vocab_size} embedding rows":
                   self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size}
        if problems := [k for k, v in bad.items() if v]:
            raise ValueError(f"{source}: {problems[0]}")


# Presets: the published Qwen3 shapes (docs/methods.md §0) and tiny ones for CPU work.
PRESETS = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    # the embedded default's AR teacher: lib/corpus.py's learnt BPE (1024 ids, eos 1021; row 1024 free for the mask)
    "tiny": dict(vocab_size=1088, hidden_size=128, intermediate_size=384, num_hidden_layers=6, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, max_position_embeddings=4096, rope_theta=10_000.0,
                 tie_word_embeddings=True, bos_token_id=1021, eos_token_id=1021, torch_dtype="float32"),
}
# a model small enough for the tests, with the byte-level vocabulary (259 ids, row 259 free for the mask)
PRESETS["micro"] = dict(PRESETS["tiny"], vocab_size=320, bos_token_id=256, eos_token_id=256, hidden_size=64,
                        intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                        head_dim=32)


def preset(name, **overrides):
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return Qwen3Config(**{**PRESETS[name], **overrides})


# ----------------------------------------------------------------------------------------------
# Modules (names and math as in Hugging Face's modeling_qwen3.py)

class Qwen3RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()  # x / sqrt(mean(x²) + eps) in fp32, as HF does
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def rope_cos_sin(pos, head_dim, theta, dtype):
    """pos: (T,) or (B, T) positions -> cos, sin of shape (1 or B, 1, T, head_dim)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=pos.device).float() / head_dim))
    freqs = pos[..., None].float() * inv_freq  # (..., T, head_dim/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    emb = emb[None] if emb.dim() == 2 else emb  # (1 or B, T, head_dim)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def apply_rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class KVCache:
    """Static cache: per layer k, v (B, kv_heads, max_len, head_dim), written in place at the given slots."""

    def __init__(self, config, batch_size, max_len, device, dtype):
        shape = (batch_size, config.num_key_value_heads, max_len, config.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.max_len = max_len

    def update(self, layer, slots, k, v):  # under autocast k (after the fp32 q/k norm) and v may differ in dtype
        self.k[layer].index_copy_(2, slots, k.to(self.k[layer].dtype))
        self.v[layer].index_copy_(2, slots, v.to(self.v[layer].dtype))
        return self.k[layer], self.v[layer]


class Qwen3Attention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        c = config
        self.layer_idx, self.head_dim = layer_idx, c.head_dim
        self.n_head, self.n_kv = c.num_attention_heads, c.num_key_value_heads
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=c.attention_bias)
        norm = c.model_type == "qwen3"  # Qwen3: a per-head RMSNorm on q and k, before RoPE; Llama: none
        self.q_norm, self.k_norm = (Qwen3RMSNorm(c.head_dim, c.rms_norm_eps) if norm else nn.Identity() for _ in "qk")

    def forward(self, x, cos, sin, mask, is_causal, cache=None, slots=None):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.n_head, self.head_dim)).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv, self.head_dim)).transpose(1, 2)  # (B, nkv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(self.layer_idx, slots, k, v)  # (B, nkv, max_len, hd)
        if isinstance(mask, BlockMask):  # (B, 1, T, T) as blocks; the rule is its mask_mod
            y = compiling.flex(q, k, v, mask, enable_gqa=self.n_kv != self.n_head)  # (B, nh, T, hd)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                               enable_gqa=self.n_kv != self.n_head)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))  # (B, T, nh*hd) -> (B, T, C)


class Qwen3MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # SwiGLU


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.self_attn = Qwen3Attention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, mask, is_causal, cache=None, slots=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, is_causal, cache, slots)
        return x + self.mlp(self.post_attention_layernorm(x))


def attention_mask(attn, q_pos, k_pos, block_size=None, k_len=None):
    """Boolean (..., Tq, Tk) mask, True = may attend, for query/key sequence indices q_pos (..., Tq), k_pos (..., Tk).
    k_len (a 0-d tensor) additionally hides cache slots >= k_len that hold nothing yet."""
    q, k = q_pos[..., :, None], k_pos[..., None, :]
    if attn == "causal":
        m = k <= q
    elif attn == "block":
        m = torch.div(k, block_size, rounding_mode="floor") <= torch.div(q, block_size, rounding_mode="floor")
    else:  # bidirectional
        m = torch.ones(torch.broadcast_shapes(q.shape, k.shape), dtype=torch.bool, device=q.device)
    return m if k_len is None else m & (k < k_len)


def packed_mask(rule, doc, pos, block_size=None):
    """(B, 1, T, T) bool for rows that pack several conversations: doc (B, T) each slot's conversation (-1: a pad),
    pos (B, T) its position within it (from 0). A conversation attends only within itself, under the rule on its
    own positions, so each computes what it would alone (with pos as its RoPE positions); pads see pads."""
    same_conversation = doc[:, :, None] == doc[:, None, :]  # (B, T, T)
    return (same_conversation & attention_mask(rule, pos, pos, block_size))[:, None]


def attend(rule, q, real, block_size=None):
    """(B, 1, Tq, S) boolean mask for query slots q (Tq,) over key slots 0..S-1, S = real.shape[1]: the rule
    ("causal" | "bidirectional" | "block") in slot coordinates, pads (real False) hidden from every query.
    A pad query still sees itself, so no row is all False (SDPA would return NaN)."""
    k = torch.arange(real.shape[1], device=real.device)
    return ((attention_mask(rule, q, k, block_size) & real[:, None, :]) | (q[:, None] == k))[:, None]


def left_padded(lens, P, L):
    """A batch of prompts of lens (B,) tokens, left-padded to P slots, in L slots in all -> real (B, L) (the slot
    holds a token, not a pad) and the RoPE positions (B, L), counted from each row's first real token, so that a
    row of the batch computes what its prompt alone would."""
    rel = torch.arange(L, device=lens.device) - (P - lens)[:, None]  # slot minus the row's pad count
    return rel >= 0, rel.clamp(min=0)


def canvas(model, prompt, n_new, pad_id, fill, multiple=1):
    """A sampler's canvas: prompt (B, T) or token lists, left-padded with pad_id to P (a multiple of `multiple`),
    then n_new slots of `fill` -> x (B, P + n_new), prompt_lens (B,), P, and left_padded's real and positions."""
    dev = model.model.embed_tokens.weight.device
    if torch.is_tensor(prompt) and prompt.dim() != 2:
        raise ValueError(f"a prompt tensor must be (B, T), got {tuple(prompt.shape)}")
    rows = [torch.as_tensor(r, dtype=torch.long).reshape(-1) for r in prompt]
    if not rows or min(len(r) for r in rows) == 0:
        raise ValueError("every prompt needs at least one token")
    longest, limit = max(len(r) for r in rows), model.config.max_position_embeddings
    if longest + n_new > limit:
        raise ValueError(f"a prompt of {longest} tokens + {n_new} new tokens exceeds the model's {limit} positions "
                         "(config.max_position_embeddings); shorten the prompt or generate fewer tokens")
    P = -(-longest // multiple) * multiple
    x = torch.full((len(rows), P + n_new), fill, dtype=torch.long, device=dev)
    x[:, :P] = pad_id
    for b, r in enumerate(rows):
        x[b, P - len(r):P] = r.to(dev)
    lens = torch.tensor([len(r) for r in rows], device=dev)
    return x, lens, P, *left_padded(lens, P, P + n_new)


class Qwen3Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.config = config
        self.gradient_checkpointing = False

    def forward(self, idx, attn, *, block_size=None, output_hidden_states=False, pos=None, cache=None, slots=None):
        """-> the final normed hidden state (B, T, C) and, if asked, the hidden_states list (else None)."""
        dev = idx.device
        x = self.embed_tokens(idx)
        seq = torch.arange(idx.shape[1], device=dev) if slots is None else slots  # sequence index of each query
        cos, sin = rope_cos_sin(seq if pos is None else pos, self.config.head_dim, self.config.rope_theta, x.dtype)
        if isinstance(attn, (torch.Tensor, BlockMask)):
            mask = attn  # explicit boolean mask, broadcastable to (B, heads, T, keys), or a BlockMask
        elif cache is not None:  # keys are the cache slots; slots not yet written are hidden
            mask = attention_mask(attn, seq, torch.arange(cache.max_len, device=dev), block_size, k_len=seq.max() + 1)
        else:  # causal: SDPA's own causal kernel; bidirectional: no mask at all
            mask = attention_mask(attn, seq, seq, block_size) if attn == "block" else None
        is_causal = mask is None and attn == "causal"
        hidden = [x]
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                x = checkpoint(layer, x, cos, sin, mask, is_causal, cache, slots, use_reentrant=False)
            else:
                x = layer(x, cos, sin, mask, is_causal, cache, slots)
            hidden.append(x)
        x = self.norm(x)
        hidden[-1] = x
        return x, (hidden if output_hidden_states else None)


class Qwen3(WeightsFile, nn.Module):
    """Qwen3ForCausalLM: model (embeddings + decoder layers + final norm) and lm_head; from_pretrained and
    save_pretrained (Hugging Face directories) from hf.WeightsFile."""
    config_class = Qwen3Config

    def __init__(self, config):
        super().__init__()
        config.validate()
        self.config = config
        self.model = Qwen3Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, idx, attn=None, *, rows=None, targets=None, reduction="none", argmax=False,
                output_hidden_states=False, block_size=None, pos=None, cache=None, slots=None):
        """idx (B, T) token ids -> logits (B, T, V) [, hidden_states (output_hidden_states)].
        attn: "causal" | "bidirectional" | "block" | a bool mask | a BlockMask; default the checkpoint's mode.
        rows: lm_head on these rows only, a (B, T) bool mask or index tensors (b, i) -> logits (n, V), row-major.
        targets (n,): instead of logits, each row's -log softmax(logits)[target] (cross_entropy's reduction, argmax).
        pos: RoPE positions (T,) or (B, T), default the sequence index; cache, slots: a KVCache and the slots (T,)
        this call writes, its queries attending to the cached keys under the same rule."""
        if idx.dim() != 2 or idx.dtype != torch.long:
            raise ValueError(f"idx must be a (B, T) LongTensor, got {tuple(idx.shape)} {idx.dtype}")
        attn, block_size = self.config.attn if attn is None else attn, block_size or self.config.block_size
        if isinstance(attn, str) and attn not in ATTN_MODES:
            raise ValueError(f"attn must be one of {ATTN_MODES} or a boolean mask, got {attn!r}")
        if isinstance(attn, str) and attn == "block" and not block_size:
            raise ValueError("attn='block' needs block_size (argument or checkpoint config)")
        if (cache is None) != (slots is None):
            raise ValueError("cache and slots go together")
        h, hidden = self.model(idx, attn, block_size=block_size, output_hidden_states=output_hidden_states, pos=pos,
                               cache=cache, slots=slots)  # (B, T, C)
        h = h if rows is None else h[rows]  # (n, C)
        out = self.lm_head(h) if targets is None else self.cross_entropy(h.reshape(-1, h.shape[-1]), targets,
                                                                         reduction=reduction, argmax=argmax)
        return (out, hidden) if output_hidden_states else out

    def cross_entropy(self, h, targets, reduction="none", argmax=False):
        """h (n, C), targets (n,) -> CE (n,) fp32, or its sum [, argmax ids (n,)]; CE_ROWS rows at a time without
        grad (with grad one piece: the backward keeps the logits anyway)."""
        step = max(1, h.shape[0] if torch.is_grad_enabled() else CE_ROWS)
        ce, pred = [], []
        for hc, tc in zip(h.split(step), targets.split(step)):
            logits = self.lm_head(hc).float()  # (≤ step, V)
            ce.append(F.cross_entropy(logits, tc, reduction=reduction))  # -log softmax(logits)[target]
            if argmax:  # evaluation's accuracy: not worth a pass over the logits in training
                pred.append(logits.argmax(-1))
        ce = torch.cat(ce) if reduction == "none" else torch.stack(ce).sum()
        return (ce, torch.cat(pred)) if argmax else ce

    def new_cache(self, batch_size, max_len):
        """A KVCache in the dtype the keys will have: the weights', or autocast's where it is on (bf16 keys)."""
        w = self.model.embed_tokens.weight
        on = torch.is_autocast_enabled(w.device.type)
        return KVCache(self.config, batch_size, max_len, w.device,
                       torch.get_autocast_dtype(w.device.type) if on else w.dtype)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())  # tied weights are counted once

    @torch.no_grad()
    def init_weights(self, seed=0):
        """Random init (nanoGPT/HF): N(0, 0.02) matrices, zero biases, unit norms."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith(("norm.weight", ".bias")):
                p.fill_(float(name.endswith("norm.weight")))  # norms 1, biases 0
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        return self
