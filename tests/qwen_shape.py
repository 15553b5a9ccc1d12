"""A checkpoint directory laid out exactly like Qwen3-0.6B, built offline with random weights: what
tests/test_scale.py runs every script on. Written here from the published files' contents, independently of the
code under test (model.py, lib/tokenizer.py):

    config.json              Qwen3-0.6B's published config (151,936 rows, 28 layers, 16/8 heads, head_dim 128, tied)
    generation_config.json   its published one: eos_token_id [151645, 151643] (<|im_end|>, <|endoftext|>)
    tokenizer.json           Qwen's real BPE ranks (the qwen.tiktoken the `dashscope` package ships), converted by
                             transformers' TikTokenConverter with Qwen's regex, NFC and Qwen3's 26 added tokens
    tokenizer_config.json    Qwen's settings (Qwen2Tokenizer, eos_token <|im_end|>, pad_token <|endoftext|>) and a
                             ChatML chat template of the form Qwen3's takes (system, user and assistant turns, the
                             generation prompt, an empty think block when enable_thinking is false), written here
    model.safetensors        random bf16 weights (std 0.02, norms 1), lm_head.weight stored beside the tied embedding
                             (Qwen3-0.6B's file does so); with `sharded`, a second directory holding the same tensors
                             in two shards and a model.safetensors.index.json

    python tests/qwen_shape.py OUT_DIR [--sharded OUT_DIR2]     # ~1.5 GB each; ~1 minute on a 2-core CPU
"""
import argparse
import json
from pathlib import Path

import dashscope
import torch

QWEN_TIKTOKEN = Path(dashscope.__file__).parent / "resources" / "qwen.tiktoken"
QWEN_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
              r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN3_ADDED = {  # id -> (text, special?) as in Qwen3's tokenizer.json
    151643: ("<|endoftext|>", True), 151644: ("<|im_start|>", True), 151645: ("<|im_end|>", True),
    151646: ("<|object_ref_start|>", True), 151647: ("<|object_ref_end|>", True),
    151648: ("<|box_start|>", True), 151649: ("<|box_end|>", True), 151650: ("<|quad_start|>", True),
    151651: ("<|quad_end|>", True), 151652: ("<|vision_start|>", True), 151653: ("<|vision_end|>", True),
    151654: ("<|vision_pad|>", True), 151655: ("<|image_pad|>", True), 151656: ("<|video_pad|>", True),
    151657: ("<tool_call>", False), 151658: ("</tool_call>", False), 151659: ("<|fim_prefix|>", False),
    151660: ("<|fim_middle|>", False), 151661: ("<|fim_suffix|>", False), 151662: ("<|fim_pad|>", False),
    151663: ("<|repo_name|>", False), 151664: ("<|file_sep|>", False), 151665: ("<tool_response>", False),
    151666: ("</tool_response>", False), 151667: ("<think>", False), 151668: ("</think>", False),
}
CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
    "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 151936,
}
GENERATION_CONFIG = {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
                     "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
                     "transformers_version": "4.51.0"}
CHAT_TEMPLATE = (
    "{%- for message in messages %}\n"
    "    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n")


def write_tokenizer(d):
    """tokenizer.json from Qwen's ranks with transformers' converter, and Qwen3's tokenizer_config.json settings."""
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    hf = TikTokenConverter(vocab_file=str(QWEN_TIKTOKEN), pattern=QWEN_REGEX).converted()
    hf.model.ignore_merges = False  # as in Qwen's published tokenizer.json: ids come from merges only
    hf.normalizer = normalizers.NFC()
    for i in sorted(QWEN3_ADDED):
        text, special = QWEN3_ADDED[i]
        token = AddedToken(text, special=special, normalized=False)
        hf.add_special_tokens([token]) if special else hf.add_tokens([token])
    hf.save(str(Path(d) / "tokenizer.json"))
    decoder = {str(i): dict(content=t, lstrip=False, normalized=False, rstrip=False, single_word=False, special=s)
               for i, (t, s) in QWEN3_ADDED.items()}
    config = dict(add_bos_token=False, add_prefix_space=False, added_tokens_decoder=decoder,
                  additional_special_tokens=[t for t, s in QWEN3_ADDED.values() if s and t != "<|endoftext|>"],
                  bos_token=None, chat_template=CHAT_TEMPLATE, clean_up_tokenization_spaces=False,
                  eos_token="<|im_end|>", errors="replace", model_max_length=131072, pad_token="<|endoftext|>",
                  split_special_tokens=False, tokenizer_class="Qwen2Tokenizer", unk_token=None)
    (Path(d) / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def shapes(c=CONFIG):
    """Hugging Face's tensor names and shapes for a Qwen3 config, lm_head included."""
    C, H, L = c["hidden_size"], c["head_dim"], c["num_hidden_layers"]
    q, kv, F = c["num_attention_heads"] * H, c["num_key_value_heads"] * H, c["intermediate_size"]
    out = {"model.embed_tokens.weight": (c["vocab_size"], C)}
    for i in range(L):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
                    p + "self_attn.q_proj.weight": (q, C), p + "self_attn.k_proj.weight": (kv, C),
                    p + "self_attn.v_proj.weight": (kv, C), p + "self_attn.o_proj.weight": (C, q),
                    p + "self_attn.q_norm.weight": (H,), p + "self_attn.k_norm.weight": (H,),
                    p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
                    p + "mlp.down_proj.weight": (C, F)})
    out["model.norm.weight"] = (C,)
    out["lm_head.weight"] = (c["vocab_size"], C)
    return out


def build(out, *, sharded=None, seed=0, layers=28):
    """Write the Qwen3-0.6B-shaped checkpoint to `out` (and its two-shard copy to `sharded`); -> out. `layers`: the
    first of its 28 layers only (every width, the vocabulary and the tokenizer as published)."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = dict(CONFIG, num_hidden_layers=layers, max_window_layers=layers)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2))
    write_tokenizer(out)
    g, state = torch.Generator().manual_seed(seed), {}
    for name, shape in shapes(config).items():
        if name == "lm_head.weight":
            state[name] = state["model.embed_tokens.weight"].clone()  # tied, but stored (as in Qwen's file)
        elif name.endswith("norm.weight"):
            state[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            state[name] = torch.empty(shape, dtype=torch.bfloat16).normal_(0, 0.02, generator=g)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    del state
    if sharded is not None:
        sharded = Path(sharded)
        sharded.mkdir(parents=True, exist_ok=True)
        for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            (sharded / f).write_bytes((out / f).read_bytes())
        names = list(shapes(config))
        half = [n for n in names if n.startswith("model.embed") or any(f"layers.{i}." in n for i in range(layers // 2))]
        parts = [half, [n for n in names if n not in half]]
        weight_map, total = {}, 0
        with safe_open(out / "model.safetensors", "pt") as f:
            for k, part in enumerate(parts, 1):  # one shard in memory at a time
                shard = f"model-{k:05d}-of-{len(parts):05d}.safetensors"
                tensors = {n: f.get_tensor(n) for n in part}
                save_file(tensors, str(sharded / shard), metadata={"format": "pt"})
                weight_map.update({n: shard for n in part})
                total += sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (sharded / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--sharded", default=None, help="also write the two-shard copy here")
    args = p.parse_args()
    build(args.out_dir, sharded=args.sharded)
