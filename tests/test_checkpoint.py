"""lib/hf.py: Hugging Face directories both ways (transformers writes, we read; we write, transformers reads),
config.json of transformers 4.x and 5.x, bf16 without an fp32 copy, shards, Qwen3-0.6B's stored tied head and
generation_config.json, saving over a sharded checkpoint; and a clear error for each bad checkpoint."""
import json

import pytest
import torch
import transformers  # the reference implementation (requirements-dev.txt)

from conftest import TINY, hf_model, ids, randomise  # the pair fixture comes from conftest too
from model import Qwen3, Qwen3Config


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


def test_bf16_loads_without_fp32_copy(tmp_path):
    m = randomise(Qwen3(Qwen3Config(**TINY))).to(torch.bfloat16)
    m.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    back = Qwen3.from_pretrained(tmp_path)
    assert all(p.dtype == torch.bfloat16 for p in back.parameters())
    assert back.lm_head.weight is back.model.embed_tokens.weight
    assert Qwen3.from_pretrained(tmp_path, dtype=torch.float32).lm_head.weight.dtype == torch.float32


def test_loading_builds_on_meta_without_torch_init_and_imports_no_compiler(tmp_path):
    """from_pretrained builds the model on the meta device without nn.Embedding's own init (which imports
    torch._dynamo there, seconds of every process), assigns every stored tensor, and leaves Embedding's init as it
    was: a model built after it is initialised as torch does."""
    import subprocess
    import sys

    from conftest import ROOT
    m = randomise(Qwen3(Qwen3Config(**TINY)))
    m.save_pretrained(tmp_path)
    code = ("import sys, torch; from model import Qwen3; m = Qwen3.from_pretrained(sys.argv[1]); "
            "print('torch._dynamo' in sys.modules, float(m.model.embed_tokens.weight.sum()))")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    dynamo, total = r.stdout.split()
    assert r.returncode == 0 and dynamo == "False", r.stderr[-2000:]
    assert float(total) == pytest.approx(float(m.model.embed_tokens.weight.sum()), rel=1e-5)
    torch.manual_seed(0)
    e = torch.nn.Embedding(50, 8)  # torch's N(0, 1) init is back
    assert 0.8 < e.weight.std().item() < 1.2


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
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, model_type="mistral", architectures=["Mistral"])))
    with pytest.raises(ValueError, match="not a Qwen3 or Llama checkpoint"):
        Qwen3Config.load(tmp_path)
    # read as Llama, the Qwen3 weights hold q/k norms a Llama layer has not
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, model_type="llama", architectures=["LlamaForCausalLM"])))
    with pytest.raises(ValueError, match=r"weights do not match the config: missing \[\], unexpected .*q_norm"):
        Qwen3.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, tie_word_embeddings=False)))
    with pytest.raises(ValueError, match="no lm_head.weight"):
        Qwen3.from_pretrained(tmp_path)


def test_a_model_id_resolves_from_a_local_hub_cache_offline(tmp_path):
    """A Hugging Face model id (org/name, @revision) in place of a directory: sample.py and convert.py read it from
    huggingface_hub's cache, built here in the cache's own layout, with HF_HUB_OFFLINE=1 (nothing downloaded). An id
    in no cache gets one line naming it and what was tried; a missing local path keeps its own message."""
    import os
    import subprocess
    import sys

    from conftest import ROOT
    from lib.tokenizer import Tokenizer
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = tmp_path / "hub" / "models--org--tiny" / "snapshots" / commit
    from model import preset
    Qwen3(preset("micro")).init_weights(0).save_pretrained(snap)  # room for the byte-level tokenizer's 259 ids
    Tokenizer.byte_level().save_pretrained(snap)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text(commit)
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")

    def run(*args):
        return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=ROOT, env=env,
                              timeout=300)
    for ckpt in ("org/tiny", f"org/tiny@{commit}"):
        r = run("sample.py", "--ckpt", ckpt, "--prompt", "ab", "--max_new_tokens", 4, "--device", "cpu")
        assert r.returncode == 0 and "--- sample 0" in r.stdout, r.stderr
    r = run("convert.py", "--ar", "org/tiny", "--out_dir", tmp_path / "dlm", "--attn", "bidirectional")
    assert r.returncode == 0 and Qwen3Config.load(tmp_path / "dlm").converted_from == str(snap), r.stderr
    r = run("sample.py", "--ckpt", "org/missing", "--device", "cpu")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "'org/missing'" in r.stderr and "HF_HUB_OFFLINE" in r.stderr and str(tmp_path / "hub") in r.stderr
    r = run("sample.py", "--ckpt", "tests/no-such-dir", "--device", "cpu")  # tests/ exists: a path, not an id
    assert r.returncode == 1 and "tests/no-such-dir" in r.stderr and "model id" not in r.stderr, r.stderr
