"""
Qwen3 in plain PyTorch, with the attention mask chosen per call.

What is notable here:
- One decoder serves the AR teacher and every diffusion student: `model(idx, attn=...)` takes
  "causal" (AR), "bidirectional" (masked diffusion), "block" (block diffusion: position i sees j
  when j // block_size <= i // block_size) or an explicit boolean mask. Converting AR -> DLM
  changes no weights; the DLM fields (attn, block_size, mask_token_id, shift) live in config.json.
- Module names are Hugging Face's (model.layers.{i}.self_attn.q_proj, ...), so official Qwen3
  safetensors load with strict=True and no mapping table, and our checkpoints load in transformers.
- A static KV cache written in place at given slots (gpt-fast style) serves all three samplers.
- Attention is F.scaled_dot_product_attention; causal and bidirectional calls pass no mask tensor. A
  FlexAttention BlockMask goes to flex_attention instead (distill.py's training mask on CUDA): only the
  blocks the mask allows are computed, and no (T, T) mask exists.
"""
import contextlib
import json
import math
import os
import struct
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from torch.utils.checkpoint import checkpoint

import tokenizer
from tokenizer import atomic_write  # noqa: F401  (model.atomic_write: the one atomic writer, for the scripts)

ATTN_MODES = ("causal", "bidirectional", "block")


@dataclass
class Qwen3Config:
    # field names are Hugging Face's, so config.json maps onto this dataclass directly
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
    # Tokenizer.fingerprint of the tokenizer it was trained with (training.save_checkpoint, convert.py); when
    # config.json has none (older checkpoints, downloaded ones), load_config computes it from the tokenizer files
    tokenizer_sha256: str | None = None
    path: str | None = field(default=None, repr=False, compare=False)  # the directory it was read from; not saved
    extra: dict = field(default_factory=dict, repr=False)  # other config.json keys, kept on save
    # generation_config.json (eos_token_id: the ids that end a turn, Tokenizer.end_ids; sampling defaults), read and
    # written with config.json but not part of it; None when the checkpoint has none
    generation: dict | None = field(default=None, repr=False)

    @classmethod
    def from_dict(cls, d, source="config"):
        d = dict(d)
        arch = d.get("architectures") or []
        if d.get("model_type") != "qwen3" and "Qwen3ForCausalLM" not in arch:
            raise ValueError(f"{source}: not a Qwen3 checkpoint (model_type={d.get('model_type')!r}, "
                             f"architectures={arch}); only Qwen3 is supported")
        rope = d.pop("rope_parameters", None) or {}  # transformers 5.x style
        if "rope_theta" in rope:
            d.setdefault("rope_theta", rope["rope_theta"])
        if rope.get("rope_type", "default") != "default" or d.get("rope_scaling"):
            raise ValueError(f"{source}: RoPE scaling is not supported (got {rope or d.get('rope_scaling')})")
        if d.get("use_sliding_window"):
            raise ValueError(f"{source}: sliding-window attention is not supported")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{source}: hidden_act={d['hidden_act']!r}, Qwen3 uses 'silu'")
        if "dtype" in d:  # transformers 5.x name
            d["torch_dtype"] = d.pop("dtype")
        names = {f.name for f in fields(cls)} - {"extra", "path", "generation"}
        cfg = cls(**{k: v for k, v in d.items() if k in names}, extra={k: v for k, v in d.items() if k not in names})
        cfg.validate(source)
        return cfg

    def validate(self, source="config"):
        if self.attn not in ATTN_MODES:
            raise ValueError(f"{source}: attn must be one of {ATTN_MODES}, got {self.attn!r}")
        if self.attn == "block" and not (self.block_size and self.block_size > 0):
            raise ValueError(f"{source}: attn='block' needs a positive block_size")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"{source}: num_attention_heads must be a multiple of num_key_value_heads")
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"{source}: mask_token_id {self.mask_token_id} outside the {self.vocab_size} "
                             f"embedding rows")

    def to_dict(self):
        d = {k: v for k, v in asdict(self).items() if k not in ("extra", "path", "generation")}
        d["dtype"] = d["torch_dtype"]  # transformers 5.x reads "dtype", 4.x "torch_dtype"
        d["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta}  # 5.x; 4.x reads rope_theta
        hf = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_act="silu",
                  attention_dropout=0.0, initializer_range=0.02, use_cache=True, use_sliding_window=False)
        return {**hf, **self.extra, **d}


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
    # the embedded default's AR teacher: data.py's learnt BPE (1024 ids, eos 1021; row 1024 free for the mask)
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
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)  # in fp32, as HF does
        return self.weight * x32.to(x.dtype)


def rope_cos_sin(pos, head_dim, theta, dtype):
    """pos: (T,) or (B, T) positions -> cos, sin of shape (1 or B, 1, T, head_dim)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=pos.device).float() / head_dim))
    freqs = pos[..., None].float() * inv_freq  # (..., T, head_dim/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    if emb.dim() == 2:
        emb = emb[None]
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def apply_rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class KVCache:
    """Static pre-allocated cache: per layer, k and v of shape (B, kv_heads, max_len, head_dim), each layer's its
    own tensor (gpt-fast), so that under torch.compile the in-place write stays in place (writing into a view of
    one (layers, ...) tensor makes the compiled step copy the whole cache every call). A forward writes its
    keys/values at the cache slots it is given (index_copy_, no reallocation)."""

    def __init__(self, config, batch_size, max_len, device, dtype):
        shape = (batch_size, config.num_key_value_heads, max_len, config.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.num_hidden_layers)]
        self.max_len = max_len

    def update(self, layer, slots, k, v):
        self.k[layer].index_copy_(2, slots, k)
        self.v[layer].index_copy_(2, slots, v)
        return self.k[layer], self.v[layer]


_compiled_flex = None


def flex(q, k, v, block_mask, enable_gqa):
    """flex_attention, compiled once on first use on CUDA (the fused kernel). Eager elsewhere: unfused, it
    materialises the scores (fine for CPU tests); inside a torch.compile'd model the outer compile fuses it."""
    global _compiled_flex
    if not q.is_cuda or torch.compiler.is_compiling():
        return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)


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
        self.q_norm = Qwen3RMSNorm(c.head_dim, c.rms_norm_eps)  # per-head RMSNorm on q and k, before RoPE
        self.k_norm = Qwen3RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x, cos, sin, mask, is_causal, cache=None, slots=None):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.n_head, self.head_dim)).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv, self.head_dim)).transpose(1, 2)  # (B, nkv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(self.layer_idx, slots, k, v)  # (B, nkv, max_len, hd)
        if isinstance(mask, BlockMask):  # (B, 1, T, T) as blocks; the rule is its mask_mod
            y = flex(q, k, v, mask, enable_gqa=self.n_kv != self.n_head)  # (B, nh, T, hd)
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
    """Boolean (Tq, Tk) mask, True = may attend, for query/key sequence indices q_pos, k_pos.
    k_len (a 0-d tensor) additionally hides cache slots >= k_len that hold nothing yet."""
    q, k = q_pos[:, None], k_pos[None, :]
    if attn == "causal":
        m = k <= q
    elif attn == "block":
        m = torch.div(k, block_size, rounding_mode="floor") <= torch.div(q, block_size, rounding_mode="floor")
    else:  # bidirectional
        m = torch.ones(q.shape[0], k.shape[1], dtype=torch.bool, device=q.device)
    return m if k_len is None else m & (k < k_len)


class Qwen3Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.config = config
        self.gradient_checkpointing = False

    def forward(self, idx, attn, *, block_size=None, output_hidden_states=False, pos=None, cache=None, slots=None):
        """Returns the final normed hidden state (B, T, C) and, if asked, Hugging Face's hidden_states list:
        the embedding output, each block's output, and the last one replaced by the final-norm output."""
        B, T = idx.shape
        dev = idx.device
        x = self.embed_tokens(idx)
        seq = torch.arange(T, device=dev) if slots is None else slots  # sequence index of each query
        cos, sin = rope_cos_sin(seq if pos is None else pos, self.config.head_dim, self.config.rope_theta, x.dtype)
        mask, is_causal = None, False
        if isinstance(attn, (torch.Tensor, BlockMask)):
            mask = attn  # explicit boolean mask, broadcastable to (B, heads, T, keys), or a BlockMask
        elif cache is not None:  # keys are the cache slots; slots not yet written are hidden
            k_pos = torch.arange(cache.max_len, device=dev)
            mask = attention_mask(attn, seq, k_pos, block_size, k_len=seq.max() + 1)
        elif attn == "causal":
            is_causal = True  # SDPA's own causal kernel, no mask tensor
        elif attn == "block":
            mask = attention_mask(attn, seq, seq, block_size)
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


class Qwen3(nn.Module):
    """Qwen3ForCausalLM: model (embeddings + decoder layers + final norm) and lm_head."""

    def __init__(self, config):
        super().__init__()
        config.validate()
        self.config = config
        self.model = Qwen3Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, idx, attn=None, *, block_size=None, output_hidden_states=False, pos=None, cache=None,
                slots=None):
        """idx (B, T) token ids -> logits (B, T, vocab) [, hidden_states].
        attn: "causal" | "bidirectional" | "block" | a boolean mask | a FlexAttention BlockMask (no cache);
        default: the checkpoint's mode.
        pos: RoPE positions (T,) or (B, T); default the sequence index (or the cache slots).
        cache, slots: a KVCache and the LongTensor (T,) of cache slots this call's tokens are written to;
        queries then attend to the cached keys under the same rule, in cache-slot coordinates."""
        if idx.dim() != 2 or idx.dtype != torch.long:
            raise ValueError(f"idx must be a (B, T) LongTensor, got {tuple(idx.shape)} {idx.dtype}")
        attn = self.config.attn if attn is None else attn
        if isinstance(attn, str):
            if attn not in ATTN_MODES:
                raise ValueError(f"attn must be one of {ATTN_MODES} or a boolean mask, got {attn!r}")
            block_size = block_size or self.config.block_size
            if attn == "block" and not block_size:
                raise ValueError("attn='block' needs block_size (argument or checkpoint config)")
        if (cache is None) != (slots is None):
            raise ValueError("cache and slots go together")
        h, hidden = self.model(idx, attn, block_size=block_size, output_hidden_states=output_hidden_states, pos=pos,
                               cache=cache, slots=slots)
        logits = self.lm_head(h)
        return (logits, hidden) if output_hidden_states else logits

    # ---- what the samplers and trainers need -------------------------------------------------

    def new_cache(self, batch_size, max_len):
        w = self.model.embed_tokens.weight
        return KVCache(self.config, batch_size, max_len, w.device, w.dtype)

    def param_group(self, name):
        """The parameter names in a freezable group: embed, attn, mlp, lm_head (tied: lm_head is embed)."""
        keys = {"embed": "model.embed_tokens.", "attn": ".self_attn.", "mlp": ".mlp.", "lm_head": "lm_head."}
        if name not in keys:
            raise ValueError(f"unknown parameter group {name!r}; choose from {sorted(keys)}")
        if name == "lm_head" and self.config.tie_word_embeddings:
            name = "embed"  # tied: the output head is the embedding matrix
        return [n for n, _ in self.named_parameters() if keys[name] in n or n.startswith(keys[name])]

    def freeze(self, groups):
        for g in groups:
            names = set(self.param_group(g))
            for n, p in self.named_parameters():
                if n in names:
                    p.requires_grad_(False)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())  # tied weights are counted once

    def flops_per_token(self, seq_len):
        """Training FLOPs per token (forward + backward), as in the PaLM appendix / nanoGPT."""
        c = self.config
        n = self.num_params() - self.model.embed_tokens.weight.numel() * (not c.tie_word_embeddings)
        return 6 * n + 12 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * seq_len

    def init_weights(self, seed=0):
        """Random init (std 0.02, nanoGPT/HF style): the tiny teacher and the 'from scratch' baseline."""
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            with torch.no_grad():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith(".bias"):
                    p.zero_()
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        return self

    # ---- Hugging Face checkpoints -------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path, device=None, dtype=None):
        """Load a Hugging Face Qwen3 directory (config.json + model.safetensors or a sharded index).
        Tensors go straight to `device` in their stored dtype, or are cast to `dtype` there. A tied checkpoint that
        also stores lm_head.weight (Qwen3-0.6B does) has it skipped unread: the head is the embedding matrix."""
        from safetensors import SafetensorError, safe_open
        path = Path(path)
        config = load_config(path)
        files = weight_files(path)
        device = str(torch.device(device or "cpu"))
        state = {}
        for f in files:
            try:
                with safe_open(f, "pt", device=device) as sf:
                    for k in sf.keys():  # one tensor at a time: a dtype cast never holds two full copies
                        if k == "lm_head.weight" and config.tie_word_embeddings:
                            continue
                        t = sf.get_tensor(k)
                        state[k] = t if dtype is None else t.to(dtype)
            except (SafetensorError, OSError) as e:
                raise ValueError(f"{f}: cannot read safetensors file ({e}); is it truncated or corrupt?") from None
        if not config.tie_word_embeddings and "lm_head.weight" not in state:
            raise ValueError(f"{path}: untied config (tie_word_embeddings=false) but no lm_head.weight")
        with torch.device("meta"):
            model = cls(config)
        keys = set(model.state_dict()) - ({"lm_head.weight"} if config.tie_word_embeddings else set())
        missing, unexpected = sorted(keys - set(state)), sorted(set(state) - keys)
        if missing or unexpected:
            raise ValueError(f"{path}: weights do not match the config: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        expected = {k: v.shape for k, v in model.state_dict().items()}
        for k, v in state.items():
            if v.shape != expected[k]:
                raise ValueError(f"{path}: {k} has shape {tuple(v.shape)} but config.json implies {tuple(expected[k])}")
        model.load_state_dict(state, strict=False, assign=True)
        if config.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        return model

    def save_pretrained(self, path, metadata=None, *, dtype=None, state_dict=None):
        """Write config.json (and generation_config.json) + model.safetensors in Hugging Face's layout, each file
        atomically. `metadata` (str -> str) goes into the safetensors header (training scripts store the step there).
        dtype: the dtype the weights are stored in (default: the parameters'); config.json's torch_dtype names it.
        Each tensor is cast on its own device and moved to the CPU one at a time (no second copy of the model on a
        GPU); a sharded checkpoint already in `path` (index and shards) is replaced. state_dict: the tensors to write
        in place of self.state_dict() (training.py passes a model's whole tensors gathered from FSDP's shards)."""
        from safetensors.torch import save_file
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        dtype = dtype or next(self.parameters()).dtype
        tied = self.config.tie_word_embeddings
        state = {k: v.detach().to(dtype).cpu().contiguous() for k, v in (state_dict or self.state_dict()).items()
                 if not (tied and k == "lm_head.weight")}
        self.config.torch_dtype = str(dtype).removeprefix("torch.")
        meta = {"format": "pt", **(metadata or {})}
        atomic_write(path / "model.safetensors", lambda f: save_file(state, f, metadata=meta))
        index = path / "model.safetensors.index.json"
        if index.exists():  # a stale shard index would shadow the new file; its shards are stale weights
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
                for shard in set(json.loads(index.read_text())["weight_map"].values()) - {"model.safetensors"}:
                    (path / Path(shard).name).unlink(missing_ok=True)
            os.remove(index)
        save_config(self.config, path)


def load_config(path):
    """config.json of a checkpoint directory, with `path` set and `tokenizer_sha256` computed from the directory's
    tokenizer files when config.json does not record it."""
    f = Path(path) / "config.json"
    if not f.is_file():
        raise FileNotFoundError(f"{f} not found: expected a Hugging Face Qwen3 checkpoint directory")
    try:
        d = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{f}: not valid JSON ({e})") from None
    config = Qwen3Config.from_dict(d, source=str(f))
    config.path = str(path)
    g = Path(path) / "generation_config.json"
    if g.is_file():
        try:
            config.generation = json.loads(g.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{g}: not valid JSON ({e})") from None
    if config.tokenizer_sha256 is None:  # a checkpoint written before fingerprints were recorded, or downloaded
        config.tokenizer_sha256 = tokenizer.fingerprint_of(path)  # None when the directory holds no tokenizer
    return config


def save_config(config, path):
    """config.json, and generation_config.json when the config carries one (written first: config.json completes a
    checkpoint)."""
    if config.generation is not None:
        gen = json.dumps(config.generation, indent=2) + "\n"
        atomic_write(Path(path) / "generation_config.json", lambda f: Path(f).write_text(gen))
    text = json.dumps(config.to_dict(), indent=2) + "\n"
    atomic_write(Path(path) / "config.json", lambda f: Path(f).write_text(text))


# bytes per element of the safetensors dtypes
SAFETENSORS_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
                      "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def safetensors_names(f):
    """The tensor names in a safetensors file, after checking its header against the file without reading the
    tensors: 8 bytes of header length, a JSON header, each tensor's byte range as long as its dtype and shape
    need, and the ranges ending exactly at the end of the file (a truncated copy fails here)."""
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else size
        if 8 + n > size:
            raise ValueError(f"{f}: truncated or not a safetensors file ({size:,} bytes, shorter than its header)")
        try:
            header = json.loads(fh.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ValueError(f"{f}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise ValueError(f"{f}: not a safetensors file (its header is not a JSON object)")
    header.pop("__metadata__", None)
    end = 0
    for name, t in header.items():
        try:
            begin, stop = t["data_offsets"]
            need = math.prod(t["shape"]) * SAFETENSORS_DTYPES.get(t["dtype"], 0)
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{f}: malformed safetensors header entry for {name!r}") from None
        if stop < begin or (need and stop - begin != need):
            raise ValueError(f"{f}: {name} takes bytes {begin}..{stop} but its {t['dtype']} {t['shape']} needs {need}")
        end = max(end, stop)
    if 8 + n + end != size:
        raise ValueError(f"{f}: the header describes {8 + n + end:,} bytes but the file has {size:,}: "
                         f"truncated or corrupt; copy it again")
    return set(header)


def weight_files(path):
    """The safetensors files of a checkpoint (one, or the shards its model.safetensors.index.json names), each
    checked by safetensors_names, and the index checked against the shards: ValueError naming the bad file."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            shards = {s: {k for k, v in weight_map.items() if v == s} for s in set(weight_map.values())}
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            raise ValueError(f"{index}: not a valid shard index (JSON with a weight_map)") from None
    else:
        shards = {"model.safetensors": set()}
    files = []
    for s, names in sorted(shards.items()):
        f = path / s
        if not f.is_file():
            raise FileNotFoundError(f"{f} not found: no weights in {path}")
        if missing := names - safetensors_names(f):
            raise ValueError(f"{index} places {sorted(missing)[:3]} in {f}, which does not hold them")
        files.append(f)
    return files
