"""convert.py --gguf on tiny GGUF files written here with the gguf package's writer under llama.cpp's tensor names (a
random Qwen3, and a random Llama whose q/k rows are permuted as llama.cpp's converter permutes them): the import
equals its source. And each bad input refused in one line with nothing written."""
import json

import numpy as np
import pytest
import torch

import gguf  # requirements-dev.txt pins it; convert.py --gguf needs it, nothing else does
from conftest import TINY, randomise, run_script
from model import Qwen3, Qwen3Config
from lib.tokenizer import Tokenizer, bytes_to_unicode

# llama.cpp's names (gguf-py's tensor_mapping.py), written out here rather than inverted from gguf_import's table
LLAMA_CPP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def llama_cpp_name(hf):
    """model.layers.3.self_attn.q_proj.weight -> blk.3.attn_q.weight (the names llama.cpp's converter writes)."""
    part = hf.split(".")
    if part[1] == "layers":
        return f"blk.{part[2]}.{LLAMA_CPP['.'.join(part[3:-1])]}.{part[-1]}"
    return f"{LLAMA_CPP['.'.join(part[:-1])]}.{part[-1]}"


def permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute, as published: HF's rotary halves interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, model, arch=None, qtype=None, pad_to=None):
    """The model as llama.cpp writes it (arch: general.architecture, default its model_type), with the byte-level
    tokenizer (ChatML template) and the token list padded with [PAD{i}] fillers of type UNUSED up to pad_to, as
    llama.cpp pads Qwen3's. qtype: every 2-D tensor stored in that quantization type instead of F32."""
    c, tok = model.config, Tokenizer.byte_level()
    arch = arch or c.model_type
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    u = bytes_to_unicode()
    tokens = [u[b] for b in range(256)] + list(tok.special_tokens)
    types = [1] * 256 + [3] * len(tok.special_tokens)
    tokens += [f"[PAD{i}]" for i in range(len(tokens), pad_to or len(tokens))]
    types += [5] * (len(tokens) - len(types))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if arch == "qwen3" else "smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([])
    w.add_bos_token_id(257)
    w.add_eos_token_id(258)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        t = t.float().numpy()
        if c.model_type == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            t = permute(t, c.num_attention_heads if "q_proj" in name else c.num_key_value_heads)
        if qtype is not None and t.ndim == 2:
            w.add_tensor(llama_cpp_name(name), gguf.quants.quantize(t, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(llama_cpp_name(name), t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny(model_type, tied=True):
    cfg = Qwen3Config(**dict(TINY, vocab_size=264), model_type=model_type, tie_word_embeddings=tied)
    return randomise(Qwen3(cfg).eval(), seed=3)


@pytest.mark.parametrize("model_type,tied", [("qwen3", True), ("llama", False)])
def test_import_equals_its_source(tmp_path, model_type, tied):
    """Every tensor comes back exactly (F32 in the file), q/k un-permuted for Llama; the logits are the source's;
    config.json is read by transformers as the right architecture; the tokenizer leaves llama.cpp's fillers out."""
    import transformers
    src = tiny(model_type, tied)
    f = write_gguf(tmp_path / "m.gguf", src, pad_to=264)
    r = run_script("convert.py", "--gguf", f, "--out_dir", tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    got = Qwen3.from_pretrained(tmp_path / "hf").eval()
    assert got.config.model_type == model_type and got.config.tie_word_embeddings == tied
    for k, v in src.state_dict().items():
        assert torch.equal(got.state_dict()[k], v), k
    x = torch.randint(0, 259, (2, 11))
    with torch.no_grad():
        assert torch.equal(got(x), src(x))
        ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
        assert type(ref).__name__ == {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}[model_type]
        torch.testing.assert_close(ref(x).logits, src(x), atol=1e-5, rtol=1e-5)
    tok = Tokenizer.from_pretrained(tmp_path / "hf")
    assert tok.vocab_size == 259 and tok.mask_id == 259  # the [PAD...] fillers are no tokens: row 259 is free
    assert tok.encode("hi 12") == list(b"hi 12")
    assert tok.apply_chat_template([{"role": "user", "content": "a"}]) == [257, *b"user\na", 258, 10, 257,
                                                                            *b"assistant\n"]
    assert tok.end_ids(got.config) == [258, 256]  # the file's eos (<|im_end|>) first, then <|endoftext|>


def test_quantized_tensors_dequantize_as_the_gguf_package_does(tmp_path):
    """Q8_0 in the file: the imported weights are the gguf package's dequantization, within Q8_0's error of the
    source; --dtype bf16 stores them in bfloat16."""
    src = tiny("llama")
    f = write_gguf(tmp_path / "q.gguf", src, qtype=gguf.GGMLQuantizationType.Q8_0)
    r = run_script("convert.py", "--gguf", f, "--out_dir", tmp_path / "hf", "--dtype", "bf16")
    assert r.returncode == 0, r.stderr
    got = Qwen3.from_pretrained(tmp_path / "hf")
    assert json.loads((tmp_path / "hf/config.json").read_text())["torch_dtype"] == "bfloat16"
    w = src.model.layers[0].mlp.up_proj.weight.detach().numpy()
    deq = gguf.quants.dequantize(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0),
                                 gguf.GGMLQuantizationType.Q8_0)
    assert torch.equal(got.model.layers[0].mlp.up_proj.weight, torch.from_numpy(deq).to(torch.bfloat16))
    assert 0 < np.abs(deq - w).max() < 0.01


def refused(tmp_path, *args):
    r = run_script("convert.py", *args, "--out_dir", tmp_path / "out")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    return r.stderr


def test_bad_input_is_refused_in_one_line_with_nothing_written(tmp_path, monkeypatch):
    good = write_gguf(tmp_path / "good.gguf", tiny("llama"))
    assert "architecture 'gpt2' is not supported" in refused(tmp_path, "--gguf", write_gguf(
        tmp_path / "gpt2.gguf", tiny("llama"), arch="gpt2"))
    q81 = tmp_path / "q81.gguf"
    w = gguf.GGUFWriter(str(q81), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tensor("token_embd.weight", np.zeros((264, 2 * 40), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert "quantization type Q8_1 cannot be dequantized" in refused(tmp_path, "--gguf", q81)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size * 2 // 3])
    assert "truncated or corrupt" in refused(tmp_path, "--gguf", cut)
    (tmp_path / "not.gguf").write_text("hello")
    assert "not a GGUF file" in refused(tmp_path, "--gguf", tmp_path / "not.gguf")
    assert "no such file, nor an installed package" in refused(tmp_path, "--gguf", "no_such_package_here")
    (tmp_path / "out").mkdir()
    (tmp_path / "out/config.json").write_text("{}")
    r = run_script("convert.py", "--gguf", good, "--out_dir", tmp_path / "out")
    assert r.returncode == 1 and "not empty; pass --overwrite" in r.stderr
    assert (tmp_path / "out/config.json").read_text() == "{}"
    assert run_script("convert.py", "--gguf", good, "--out_dir", tmp_path / "out", "--overwrite").returncode == 0
    (tmp_path / "out").rename(tmp_path / "done")
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)  # the package missing
    assert "needs the gguf package: pip install gguf" in refused(tmp_path, "--gguf", good)
    r = run_script("convert.py", "--gguf", good, "--attn", "block", "--out_dir", tmp_path / "x")
    assert r.returncode == 2 and "convert it with --ar --attn afterwards" in r.stderr


def test_convert_appends_rows_when_the_tokenizer_uses_every_embedding_row(tmp_path):
    """A vocabulary with no free row (SmolLM2's) gets rows up to a multiple of 64, each the mean embedding; the old
    rows and every other tensor are unchanged, and the mask token is the first new row."""
    full = Qwen3(Qwen3Config(**dict(TINY, vocab_size=259), model_type="llama")).init_weights()
    f = write_gguf(tmp_path / "m.gguf", full)
    assert run_script("convert.py", "--gguf", f, "--out_dir", tmp_path / "ar").returncode == 0
    r = run_script("convert.py", "--ar", tmp_path / "ar", "--out_dir", tmp_path / "dlm", "--attn", "bidirectional")
    assert r.returncode == 0 and "appended 61 (the mean embedding), the mask token is row 259" in r.stdout, r.stderr
    ar, dlm = Qwen3.from_pretrained(tmp_path / "ar"), Qwen3.from_pretrained(tmp_path / "dlm")
    assert dlm.config.vocab_size == 320 and dlm.config.mask_token_id == 259 and dlm.config.model_type == "llama"
    e_ar, e_dlm = ar.model.embed_tokens.weight, dlm.model.embed_tokens.weight
    assert torch.equal(e_dlm[:259], e_ar) and torch.allclose(e_dlm[259:], e_ar.mean(0).expand(61, -1))
    assert dlm.lm_head.weight is e_dlm
    for k, v in ar.state_dict().items():
        if "embed_tokens" not in k and "lm_head" not in k:
            assert torch.equal(dlm.state_dict()[k], v), k
