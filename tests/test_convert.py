"""convert.py: weights copied byte for byte, the DLM fields in config.json, and each refusal."""
import json

import pytest
import torch

from conftest import run_script
from convert import convert
from model import Qwen3, preset
from lib.tokenizer import Tokenizer


@pytest.fixture
def ar(tmp_path):
    d = tmp_path / "ar"
    Qwen3(preset("micro", num_hidden_layers=1)).init_weights().save_pretrained(d)
    Tokenizer.byte_level().save_pretrained(d)
    return d


def test_bidirectional_defaults(ar, tmp_path):
    c = convert(ar, tmp_path / "dlm", "bidirectional")
    cfg = json.loads((tmp_path / "dlm/config.json").read_text())
    assert (cfg["attn"], cfg["block_size"], cfg["mask_token_id"], cfg["shift"]) == ("bidirectional", None, 259, True)
    assert cfg["converted_from"] == str(ar.resolve()) and cfg["model_type"] == "qwen3"
    assert (tmp_path / "dlm/model.safetensors").read_bytes() == (ar / "model.safetensors").read_bytes()
    m = Qwen3.from_pretrained(tmp_path / "dlm")
    assert m.config.attn == "bidirectional" and m.config.shift is True and c.mask_token_id == 259
    assert Tokenizer.from_pretrained(tmp_path / "dlm").encode("def f():") == list(b"def f():")
    # the checkpoint's mode is the default of a forward call; an explicit argument wins
    x = torch.randint(0, 259, (1, 8))
    with torch.no_grad():
        assert torch.equal(m(x), m(x, attn="bidirectional"))
        assert not torch.allclose(m(x), m(x, attn="causal"))


def test_tokenizer_config_chat_template_and_generation_config_carried(ar, tmp_path):
    """What a Qwen3 checkpoint comes with besides weights and vocabulary reaches the DLM unchanged: the end-of-turn id
    (generation_config.json), the chat template and tokenizer class (tokenizer_config.json, chat_template.jinja)."""
    gen = {"eos_token_id": [258, 256], "temperature": 0.6}
    tok_config = {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "chat_template": "{{ messages }}"}
    (ar / "generation_config.json").write_text(json.dumps(gen))
    (ar / "tokenizer_config.json").write_text(json.dumps(tok_config))
    (ar / "chat_template.jinja").write_text("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}")
    convert(ar, tmp_path / "dlm", "bidirectional")
    for f in ("tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / "dlm" / f).read_bytes() == (ar / f).read_bytes(), f
    assert json.loads((tmp_path / "dlm/generation_config.json").read_text()) == gen
    m, tok = Qwen3.from_pretrained(tmp_path / "dlm"), Tokenizer.from_pretrained(tmp_path / "dlm")
    assert tok.end_ids(m.config) == [258, 256]  # <|im_end|> first, as generation_config.json lists it
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == [257, *b"hi"]
    m.save_pretrained(tmp_path / "trained")  # and on through a training script's checkpoint
    tok.save_pretrained(tmp_path / "trained")
    for f in ("tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / "trained" / f).read_bytes() == (ar / f).read_bytes(), f
    assert json.loads((tmp_path / "trained/generation_config.json").read_text()) == gen


def test_block_defaults_and_overrides(ar, tmp_path):
    convert(ar, tmp_path / "blk", "block", block_size=4)
    cfg = json.loads((tmp_path / "blk/config.json").read_text())
    assert (cfg["attn"], cfg["block_size"], cfg["shift"]) == ("block", 4, False)
    convert(ar, tmp_path / "blk2", "block", block_size=8, mask_token_id=300, shift=True)
    cfg = json.loads((tmp_path / "blk2/config.json").read_text())
    assert (cfg["block_size"], cfg["mask_token_id"], cfg["shift"]) == (8, 300, True)


@pytest.mark.parametrize("kwargs,message", [
    (dict(attn="bidirectional", mask_token_id=65), "collides with a token"),
    (dict(attn="bidirectional", mask_token_id=320), "outside the 320 embedding rows"),
    (dict(attn="block"), "needs a positive --block_size"),
    (dict(attn="bidirectional", block_size=4), "only applies to --attn block"),
])
def test_refusals(ar, tmp_path, kwargs, message):
    with pytest.raises(SystemExit, match=message):
        convert(ar, tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_refuses_non_empty_out_dir_unless_overwrite(ar, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(SystemExit, match="not empty"):
        convert(ar, out, "bidirectional")
    assert (out / "precious.txt").exists()
    convert(ar, out, "bidirectional", overwrite=True)
    assert not (out / "precious.txt").exists() and (out / "config.json").exists()


def test_refuses_dlm_source_and_other_architectures(ar, tmp_path):
    convert(ar, tmp_path / "dlm", "bidirectional")
    with pytest.raises(SystemExit, match="already a DLM"):
        convert(tmp_path / "dlm", tmp_path / "again", "block", block_size=4)
    cfg = json.loads((ar / "config.json").read_text())
    (ar / "config.json").write_text(json.dumps(dict(cfg, model_type="mistral", architectures=["MistralForCausalLM"])))
    with pytest.raises(SystemExit, match="not a Qwen3 or Llama checkpoint"):
        convert(ar, tmp_path / "x", "bidirectional")
    with pytest.raises(SystemExit, match="config.json not found"):
        convert(tmp_path / "missing", tmp_path / "y", "bidirectional")


def test_cli(ar, tmp_path):
    def run(*a):
        return run_script("convert.py", *a)
    r = run("--ar", str(ar), "--out_dir", str(tmp_path / "c"), "--attn", "block", "--block_size", "4")
    assert r.returncode == 0 and '"attn": "block"' in r.stdout, r.stderr
    r = run("--ar", str(ar), "--out_dir", str(tmp_path / "d"), "--attn", "sideways")
    assert r.returncode == 2 and "invalid choice" in r.stderr
    r = run("--ar", str(ar), "--out_dir", str(tmp_path / "c"), "--attn", "block", "--block_size", "4")
    assert r.returncode == 1 and "not empty" in r.stderr
