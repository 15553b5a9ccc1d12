"""Shared test helpers. Scripts run in-process (runpy) rather than in a subprocess: importing torch
costs seconds per process on a 2-core machine, and in-process runs can be patched (e.g. to simulate a kill)."""
import contextlib
import io
import random
import runpy
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def seeded():
    """Every test starts from the same global RNG state (torch, numpy, random), so that a failure repeats, whatever
    ran before it."""
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def run_script(name, *args):
    """Run `python name args...` in this process -> Result(returncode, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    argv, code = sys.argv, 0
    sys.argv = [name, *map(str, args)]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(str(ROOT / name), run_name="__main__")
    except SystemExit as e:
        if isinstance(e.code, str):
            err.write(e.code + "\n")
            code = 1
        else:
            code = e.code or 0
    finally:
        sys.argv = argv
        sys.excepthook = sys.__excepthook__  # a script's Ctrl-C message (its Run's) must not outlive it
    return Result(code, out.getvalue(), err.getvalue())


@pytest.fixture
def script():
    return run_script


@pytest.fixture(scope="session")
def base_world(tmp_path_factory):
    """Built once per session: tiny_world's corpus and micro AR model, and its four conversions: dlm (bidirectional,
    shifted), dlm_noshift, block (block 4, unshifted, as OPDLM publishes) and block_shift. Read-only: a module takes
    its own copy (world_copy) and adds what it needs there."""
    import convert
    root = tiny_world(tmp_path_factory.mktemp("base"))
    convert.convert(root / "ar", root / "dlm", "bidirectional")
    convert.convert(root / "ar", root / "dlm_noshift", "bidirectional", shift=False)
    convert.convert(root / "ar", root / "block", "block", block_size=4)
    convert.convert(root / "ar", root / "block_shift", "block", block_size=4, shift=True)
    return root


def world_copy(base, tmp_path_factory, name="world"):
    """A module's own copy of the base world (what its tests write there stays there)."""
    root = tmp_path_factory.mktemp(name) / "w"
    shutil.copytree(base, root)
    return root


def tiny_world(root, ar=True):
    """root/data: a tiny, repetitive "codebase" prepared by lib/corpus.py (a small model learns it quickly);
    root/ar (ar=True): a micro AR model with random weights and the byte-level tokenizer."""
    from model import Qwen3, preset
    from lib import corpus
    from lib.tokenizer import Tokenizer
    src = root / "src"
    src.mkdir(parents=True)
    for i in range(12):
        (src / f"m{i}.py").write_text("".join(f"def f{j}(x):\n    return x + {j}\n\n" for j in range(i, i + 40)))
    corpus.prepare(str(root / "data"), source=str(src), val_fraction=0.2, tokenizer="byte")
    if ar:
        Qwen3(preset("micro")).init_weights(0).save_pretrained(root / "ar")
        Tokenizer.byte_level().save_pretrained(root / "ar")
    return root


@contextlib.contextmanager
def killed_after_checkpoint(step):
    """Inside the block, a training script "dies" (exit code 3) right after writing its step-`step` checkpoint."""
    from lib import checkpoint
    orig = checkpoint.save_checkpoint

    def save_and_die(out_dir, model, tok, opt, s, *a, **kw):
        orig(out_dir, model, tok, opt, s, *a, **kw)
        if s == step:
            raise SystemExit(3)

    checkpoint.save_checkpoint = save_and_die
    try:
        yield
    finally:
        checkpoint.save_checkpoint = orig


# ---- tiny random Qwen3s: ours against transformers' (test_model.py, test_checkpoint.py) ----------------------

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
    import transformers  # the reference implementation (requirements-dev.txt)
    cfg = transformers.Qwen3Config(**{**TINY, **kw}, tie_word_embeddings=tied, attn_implementation="eager")
    return randomise(transformers.Qwen3ForCausalLM(cfg).eval(), seed=1)


@pytest.fixture(params=[True, False], ids=["tied", "untied"])
def pair(request, tmp_path):
    """(reference HF model, our model loaded from the reference's saved checkpoint)."""
    from model import Qwen3
    ref = hf_model(request.param)
    ref.save_pretrained(tmp_path / "hf")
    ours = Qwen3.from_pretrained(tmp_path / "hf").eval()
    return ref, ours, tmp_path


def ids(B=2, T=13, vocab=101, seed=0):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))
