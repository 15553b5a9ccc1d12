"""Every script at the real Qwen3-0.6B shape, on a CPU (marked `scale`; deselect locally with -m "not scale").

A checkpoint laid out exactly like Qwen3-0.6B (tests/qwen_shape.py: the published config, Qwen's real tokenizer,
random bf16 weights, a single-file and a sharded copy) is built once, then each command of docs/scale.md runs on it
as a separate process with tiny settings (one step, short sequences, small rollouts, a two-value γ grid, one
HumanEval problem): the corpus, both conversions, REPR-ALIGN (λ = 10 and 0, --grad_checkpoint), OPDLM, AR-MAP's
pairs / DPO (full and LoRA) / spectrum / merge, sampling from each DLM, and eval.py's likelihood (AR and DLM),
generate and humaneval. Each must exit 0 and write what it says; a saved checkpoint must load in transformers with
our logits, and keep Qwen's tokenizer_config.json, chat template and end-of-turn id.

The checkpoint keeps the first SCALE_LAYERS of the 28 layers (default 4: every width, the 151,936-row vocabulary,
the heads and the tokenizer as published, in about a third of the full depth's time, so that the suite stays
within its minutes); SCALE_LAYERS=28 runs the whole model. Each command's wall time and peak RSS (os.wait4) are
printed as a table at the end (and written to $SCALE_TABLE when set): docs/scale.md's measured table, at 28 layers.
One process of this file runs at a time (4.5 GiB of memory at most at 4 layers, 12.8 GiB at 28: the tests are skipped on
a machine with less than a GiB above that; test.sh's other worker runs other files beside it, its memory unmeasured);
each output directory is removed once nothing needs it (at most ~9 GB on disk at 28 layers), and the rest at the end.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

import qwen_shape

LAYERS = int(os.environ.get("SCALE_LAYERS", "4"))  # of Qwen3-0.6B's 28
PEAK_GIB = 3.1 + 0.35 * LAYERS  # the largest peak RSS of one command (the table at the end): 4.5 GiB at 4, 12.8 at 28
TOTAL_GIB = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
pytestmark = [pytest.mark.scale, pytest.mark.timeout(1800),  # a module's fixtures run several 0.6B commands
              pytest.mark.skipif(TOTAL_GIB < PEAK_GIB + 1, reason=f"the Qwen3-0.6B-shape tests need about "
                                 f"{PEAK_GIB:.1f} GiB of memory; this machine has {TOTAL_GIB:.1f} GiB")]
ROOT = Path(__file__).resolve().parents[1]
MEASURED = []  # (command, seconds, peak RSS in GiB)
PER_LAYER = 3 * 2048 * 1024 + 3 * 3072 * 1024 + 2 * 1024 + 2 * 128  # q+k+v+o, the MLP, two RMSNorms, q/k norms
PARAMS = 596_049_920 - (28 - LAYERS) * PER_LAYER  # Qwen3-0.6B's count at 28 layers (the head tied)
TRAIN = ["--max_iters", "1", "--batch_size", "1", "--eval_batches", "1", "--weights_only", "--device", "cpu"]


# Runs a command and writes [exit code, its peak RSS in KiB] to argv[1]. A process forked from pytest would count
# pytest's own memory in its ru_maxrss (the child is pytest's copy until it execs); forked from this small one, not.
MEASURE = ("import json, os, subprocess, sys\n"
           "p = subprocess.Popen(sys.argv[2:])\n"
           "_, status, usage = os.wait4(p.pid, 0)\n"
           "open(sys.argv[1], 'w').write(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_maxrss]))\n")


def run(label, script, *args, timeout=1200):
    """python script args... in its own process -> stdout; exit code 0 asserted (the stderr tail shown otherwise).
    Its wall time and peak RSS (ru_maxrss of that process alone) go into MEASURED."""
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-c", MEASURE, f"{d}/rc", sys.executable, script, *map(str, args)]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the command too
            out, err = proc.communicate()
        seconds = time.perf_counter() - t0
        rc, rss = json.loads(Path(d, "rc").read_text()) if Path(d, "rc").exists() else (proc.returncode, 0)
    MEASURED.append((label, seconds, rss / 2**20))
    assert proc.returncode == 0 and rc == 0, f"{label}: exit {rc} after {seconds:.0f} s\n{err[-3000:]}"
    return out


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """The working directory: the Qwen3-0.6B-shaped checkpoint Q (single file) and QS (sharded), and a place for
    every output. Removed at the end, and the measured table printed; in pytest's own temporary directory, so that
    what a killed run leaves behind goes with pytest's old runs (it keeps the last three)."""
    root = tmp_path_factory.mktemp("scale")
    t0 = time.perf_counter()
    qwen_shape.build(root / "q", sharded=root / "qs", layers=LAYERS)
    MEASURED.append((f"build the Qwen3-0.6B-shaped checkpoint, {LAYERS} layers (in the test process)",
                     time.perf_counter() - t0, None))
    yield root
    shutil.rmtree(root, ignore_errors=True)
    rows = [f"| {c} | {s:.0f} | {'-' if m is None else f'{m:.1f}'} |" for c, s, m in MEASURED]
    table = "| command | seconds | peak RSS (GiB) |\n|---|---|---|\n" + "\n".join(rows) + "\n"
    print("\n" + table)
    if os.environ.get("SCALE_TABLE"):
        Path(os.environ["SCALE_TABLE"]).write_text(table)


def same_files(a, b, names=("tokenizer.json", "tokenizer_config.json")):
    return all((Path(a) / n).read_bytes() == (Path(b) / n).read_bytes() for n in names)


def carried(d, q):
    """d keeps Q's tokenizer files and end ids: generation_config.json's eos_token_id, tokenizer_config's eos."""
    gen = json.loads((Path(d) / "generation_config.json").read_text())
    return same_files(d, q) and gen["eos_token_id"] == [151645, 151643]


def stored(d):
    """{dtype of the stored tensors}, the files of d."""
    from safetensors import safe_open
    with safe_open(Path(d) / "model.safetensors", "pt") as f:
        return {f.get_slice(k).get_dtype() for k in f.keys()}


# ---- the checkpoint itself --------------------------------------------------------------------------------------

def test_fixture_is_qwen3_06b(w):
    from model import Qwen3, Qwen3Config
    from lib.tokenizer import Tokenizer
    c = Qwen3Config.load(w / "q")
    assert (c.vocab_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
            c.tie_word_embeddings) == (151936, LAYERS, 16, 8, 128, True)
    assert c.generation["eos_token_id"] == [151645, 151643]
    one, shards = Qwen3.from_pretrained(w / "q"), Qwen3.from_pretrained(w / "qs")  # bf16, as stored
    assert one.num_params() == PARAMS and one.lm_head.weight is one.model.embed_tokens.weight
    assert all(torch.equal(a, b) for a, b in zip(one.state_dict().values(), shards.state_dict().values()))
    del one, shards
    tok = Tokenizer.from_pretrained(w / "q")
    assert tok.vocab_size == 151669 and tok.mask_id == 151669 and tok.end_ids(c) == [151645, 151643]
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == [151644, 872, 198, 6023, 151645, 198,
                                                                           151644, 77091, 198]


# ---- data and conversion ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(w):
    run("lib.corpus --tokenizer Q --max_mb 0.3", "-m", "lib.corpus", "--out_dir", w / "data", "--tokenizer", w / "q",
        "--max_mb", "0.3")
    return w / "data"


@pytest.fixture(scope="module")
def dlm(w):
    run("convert.py --attn bidirectional", "convert.py", "--ar", w / "q", "--out_dir", w / "dlm",
        "--attn", "bidirectional")
    return w / "dlm"


@pytest.fixture(scope="module")
def block(w):
    run("convert.py --attn block (sharded)", "convert.py", "--ar", w / "qs", "--out_dir", w / "block",
        "--attn", "block", "--block_size", "4")
    return w / "block"


def test_data_and_conversions(w, data, dlm, block):
    from lib.tokenizer import Tokenizer
    meta = json.loads((data / "meta.json").read_text())
    assert meta["vocab_size"] == 151669 and meta["dtype"] == "uint32"
    assert meta["tokenizer_sha256"] == Tokenizer.from_pretrained(w / "q").fingerprint
    assert (dlm / "model.safetensors").read_bytes() == (w / "q/model.safetensors").read_bytes()
    assert (block / "model.safetensors.index.json").read_bytes() == (w / "qs/model.safetensors.index.json").read_bytes()
    for d, attn, shift in ((dlm, "bidirectional", True), (block, "block", False)):
        cfg = json.loads((d / "config.json").read_text())
        assert (cfg["attn"], cfg["mask_token_id"], cfg["shift"], cfg["eos_token_id"]) == (attn, 151669, shift, 151645)
        assert carried(d, w / "q")


# ---- REPR-ALIGN, and what a saved checkpoint is --------------------------------------------------------------------

@pytest.fixture(scope="module")
def aligned(w, data, dlm):
    run("align.py λ=10 --grad_checkpoint, 1 step of 1 x 32", "align.py", "--init", dlm, "--data", data,
        "--out_dir", w / "align", "--seq_len", "32", "--samples", "0", "--grad_checkpoint", *TRAIN)
    return w / "align"


def test_align(w, aligned, data, dlm):
    res = json.loads((aligned / "results.json").read_text())
    assert len(res["val_cos"]) == LAYERS + 1 and 0 <= res["val_acc@0.5"] <= 1 and res["val_nelbo"] > 0
    assert stored(aligned) == {"BF16"} and not (aligned / "train_state.pt").exists()  # --weights_only, bf16
    assert carried(aligned, w / "q")
    run("align.py λ=0 --freeze embed,lm_head --grad_checkpoint", "align.py", "--init", dlm, "--data", data,
        "--out_dir", w / "align0", "--seq_len", "32", "--samples", "0", "--lambda_align", "0",
        "--freeze", "embed,lm_head", "--grad_checkpoint", *TRAIN)
    assert json.loads((w / "align0/results.json").read_text())["trainable_params"] == PARAMS - 151936 * 1024
    shutil.rmtree(w / "align0")
    shutil.rmtree(dlm)


def test_saved_checkpoint_loads_in_transformers_with_our_logits(w, aligned):
    """The REPR-ALIGN output (bf16, written by checkpoint.save_checkpoint) in transformers: the same logits as ours
    (causal: transformers' Qwen3 is an AR model), its generation config's end ids, and its chat template."""
    import transformers
    from model import Qwen3
    from lib.tokenizer import Tokenizer
    t0 = time.perf_counter()
    x = torch.randint(0, 151669, (1, 12), generator=torch.Generator().manual_seed(0))
    ours = Qwen3.from_pretrained(aligned, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = ours(x, attn="causal")
    del ours
    hf = transformers.Qwen3ForCausalLM.from_pretrained(aligned, dtype=torch.float32, attn_implementation="sdpa").eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, logits, atol=2e-4, rtol=1e-4)
    assert hf.generation_config.eos_token_id == [151645, 151643]
    del hf
    chat = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "def fib(n):"}]
    ref = transformers.AutoTokenizer.from_pretrained(str(aligned))
    ids = ref.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, enable_thinking=False)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert Tokenizer.from_pretrained(aligned).apply_chat_template(chat, enable_thinking=False) == list(ids)
    assert ref.eos_token == "<|im_end|>" and type(ref).__name__.startswith("Qwen2Tokenizer")
    MEASURED.append(("transformers: load the REPR-ALIGN output, logits (in the test process)",
                     time.perf_counter() - t0, None))


def test_sample_and_likelihood(w, aligned, data):
    out = run("sample.py on the REPR-ALIGN DLM, 8 tokens", "sample.py", "--ckpt", aligned, "--prompt", "def fib(n):",
              "--max_new_tokens", "8", "--block_length", "8", "--steps", "8", "--device", "cpu")
    assert "def fib(n):" in out
    res = w / "lk-ar.json"
    run("eval.py likelihood on Q (AR), 2 x 64", "eval.py", "likelihood", "--ckpt", w / "q", "--data", data,
        "--seq_len", "64", "--batch_size", "2", "--n_batches", "1", "--out", res, "--device", "cpu")
    ar = json.loads(res.read_text())["results"]
    assert ar["kind"] == "AR" and ar["tokens"] == 2 * 63 and ar["perplexity"] > 1000  # random weights: near uniform
    run("eval.py likelihood on the REPR-ALIGN DLM, 2 x 64, 2 draws", "eval.py", "likelihood", "--ckpt", aligned,
        "--data", data, "--seq_len", "64", "--batch_size", "2", "--n_batches", "1", "--n_draws", "2", "--out", res,
        "--device", "cpu")
    dl = json.loads(res.read_text())["results"]
    assert dl["kind"] == "DLM" and dl["n_samples"] == 4 and dl["nelbo_bits_per_token"] > 0


# ---- OPDLM ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def distilled(w, data, block):
    run("distill.py --grad_checkpoint, 1 step, rollouts 4-8 tokens", "distill.py", "--init", block, "--data", data,
        "--out_dir", w / "distill", "--seq_len", "8", "--rollout_min", "4", "--rollout_max", "8",
        "--num_prompts", "2", "--grad_checkpoint", *TRAIN)
    return w / "distill"


def test_distill_sample_humaneval(w, distilled):
    res = json.loads((distilled / "results.json").read_text())
    assert res["eval_len"] == 8 and res["val_kl"] >= 0 and carried(distilled, w / "q")
    assert json.loads((distilled / "config.json").read_text())["attn"] == "block"
    out = run("sample.py on the OPDLM DLM, 8 tokens", "sample.py", "--ckpt", distilled, "--prompt", "def fib(n):",
              "--max_new_tokens", "8", "--device", "cpu")
    assert "def fib(n):" in out
    res = w / "he.json"
    run("eval.py humaneval on the OPDLM DLM, 1 problem x 1 sample", "eval.py", "humaneval", "--ckpt", distilled,
        "--limit", "1", "--n_samples", "1", "--max_new_tokens", "8", "--batch_size", "1", "--workers", "1",
        "--out", res, "--device", "cpu")
    he = json.loads(res.read_text())["results"]
    assert he["problems"] == 1 and he["programs"] == 1 and he["pass@1"] in (0.0, 1.0)
    for d in (distilled, w / "block", w / "qs"):  # each directory goes once nothing needs it (qs: the block's teacher)
        shutil.rmtree(d)


# ---- AR-MAP -------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pairs(w, data):
    run("worlds.stdlib, 4 + 2 pairs", "-m", "worlds.stdlib", "--data", data, "--out_dir", w / "pairs", "--n_train", "4",
        "--n_heldout", "2", "--prompt_chars", "64", "--response_chars", "32")
    return w / "pairs"


def dpo(w, pairs, out, *extra):
    label = f"dpo.py {' '.join(extra) or 'full'}, 1 step of 1 pair"
    run(label, "dpo.py", "--ar", w / "q", "--pairs", pairs / "train.jsonl", "--heldout",
        pairs / "heldout.jsonl", "--out_dir", out, "--seq_len", "64", "--lr", "1e-6", "--min_lr", "1e-6",
        *TRAIN[:4], "--eval_batches", "2", *TRAIN[6:], *extra)
    return out


@pytest.fixture(scope="module")
def dpo_full(w, pairs):
    return dpo(w, pairs, w / "dpo", "--save_dtype", "float32")  # fp32: a small-lr update survives saving


def test_dpo(w, pairs, dpo_full):
    res = json.loads((dpo_full / "results.json").read_text())
    assert 0 <= res["heldout_reward_acc"] <= 1 and stored(dpo_full) == {"F32"} and carried(dpo_full, w / "q")
    lora = dpo(w, pairs, w / "dpo-lora", "--lora_rank", "2")
    # dpo's default --save_dtype is float32 (bf16 would round a small τ_pref away), LoRA's merged weights too
    assert stored(lora) == {"F32"} and json.loads((lora / "results.json").read_text())["lora_rank"] == 2
    shutil.rmtree(lora)


def test_spectrum_and_merge(w, aligned, dpo_full, pairs, data):
    out = w / "spectrum.json"
    run("merge.py spectrum", "merge.py", "spectrum", "--ar", w / "q", "--ar_aligned", dpo_full, "--dlm", aligned,
        "--out", out)
    rows = json.loads(out.read_text())["tensors"]
    assert len(rows) == 2 + 11 * LAYERS and all(r["diff"] >= 0 and r["pref"] >= 0 for r in rows)  # the head: tied
    # no win-rate samples: 2 x 64 forwards of 64-token diffusion sampling would double the command's time, and
    # sample.py and eval.py generate run the same sampler
    run("merge.py merge, γ ∈ {0, 1} chosen on 4 training pairs, 1 mask draw", "merge.py", "merge", "--ar", w / "q",
        "--ar_aligned", dpo_full, "--dlm", aligned, "--pairs", pairs / "train.jsonl", "--heldout",
        pairs / "heldout.jsonl", "--n_select", "4", "--out_dir", w / "merged", "--gammas", "0,1", "--n_masks", "1",
        "--samples", "0", "--device", "cpu")
    res = json.loads((w / "merged/merge.json").read_text())
    assert res["gammas"] == [0.0, 1.0] and res["best_gamma"] in (0.0, 1.0) and stored(w / "merged") == {"F32"}
    assert carried(w / "merged", w / "q")
    out = w / "gen.json"
    run("eval.py generate on the merged DLM, ref Q, 1 prompt x 8 tokens", "eval.py", "generate", "--ckpt",
        w / "merged", "--ref", w / "q", "--data", data, "--num_prompts", "1", "--prompt_len", "8",
        "--max_new_tokens", "8", "--batch_size", "1", "--threshold", "0.9", "--out", out, "--device", "cpu")
    gen = json.loads(out.read_text())["results"]
    assert gen["sampler"] == "bidirectional" and gen["completion_tokens"] >= 1
