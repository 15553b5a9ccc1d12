"""dpo.py (AR-MAP, step 1): response log-probs and the DPO loss against slow references, LoRA (and its reference
with the adapters off), the bf16 reference, --sft_weight, and --resume after a kill (LoRA's train_state.pt without
the merged weights) equal to an uninterrupted run."""
import json
import math

import pytest
import torch

import diffusion
import dpo
from conftest import killed_after_checkpoint, world_copy
from model import Qwen3
from lib import data
from test_merge import dpo_args, micro, quote_world, run_dpo
from lib.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def world(base_world, tmp_path_factory):
    return quote_world(world_copy(base_world, tmp_path_factory))


# ---- DPO pieces ------------------------------------------------------------------------------------

def test_response_logps_matches_a_slow_per_token_loop():
    model = micro()
    items = [([1, 2, 3], [4, 5], [6]), ([7], [8, 9, 10, 11], [12, 13, 14])]
    ids, plen, resp, real = data.pair_batch(items, "cpu")
    assert ids.shape == (4, 5) and plen.tolist() == [3, 1, 3, 1] and resp.sum(1).tolist() == [2, 4, 1, 3]
    with torch.no_grad():
        got = diffusion.response_logps(model, ids, resp)
        seqs = [x + y for x, y, _ in items] + [x + y for x, _, y in items]
        for b, seq in enumerate(seqs):
            want = 0.0
            for i in range(int(plen[b]), len(seq)):  # response tokens only; padding never reached
                want += model(torch.tensor([seq[:i]]), attn="causal")[0, -1].log_softmax(-1)[seq[i]].item()
            assert abs(got[b].item() - want) < 1e-4


def test_dpo_loss_and_rewards_match_scalar_arithmetic():
    g = torch.Generator().manual_seed(0)
    pw, pl, rw, rl = (torch.randn(5, generator=g) * 3 for _ in range(4))
    loss, r_w, r_l = dpo.dpo_loss(pw, pl, rw, rl, beta=0.1)
    want = []
    for k in range(5):
        a, b = 0.1 * (pw[k].item() - rw[k].item()), 0.1 * (pl[k].item() - rl[k].item())
        assert abs(r_w[k].item() - a) < 1e-6 and abs(r_l[k].item() - b) < 1e-6
        want.append(-math.log(1 / (1 + math.exp(-(a - b)))))
    assert abs(loss.item() - sum(want) / 5) < 1e-6


def test_lora_starts_at_zero_and_merges_to_w_plus_scaled_ba():
    model, x = micro(), torch.randint(0, 259, (2, 9))
    base = {k: v.clone() for k, v in model.state_dict().items()}
    want = model(x, attn="causal")
    dpo.add_lora(model, rank=2, alpha=16)
    assert {n.rsplit(".", 1)[-1] for n, q in model.named_parameters() if q.requires_grad} == {"lora_A", "lora_B"}
    assert torch.equal(model(x, attn="causal"), want)
    merged = dpo.merged_state(model)  # at init the task vector is zero
    assert all(torch.equal(v, base[k]) for k, v in merged.items())
    lin = model.model.layers[1].mlp.down_proj
    lora = lin.parametrizations.weight[0]
    with torch.no_grad():
        lora.lora_B.normal_()
    after = model(x, attn="causal")
    merged = dpo.merged_state(model)
    assert set(merged) == set(base)  # an ordinary Qwen3 state dict
    W = base["model.layers.1.mlp.down_proj.weight"]
    assert torch.allclose(merged["model.layers.1.mlp.down_proj.weight"], W + 8.0 * lora.lora_B @ lora.lora_A, atol=1e-6)
    assert torch.equal(model(x, attn="causal"), after) and torch.equal(lin.parametrizations.weight.original, W)


def test_lora_reference_with_adapters_off_is_the_frozen_base():
    base, model = micro(), micro()  # the same seed: model is a separate copy of base
    dpo.add_lora(model, rank=2, alpha=16)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, dpo.LoRA):
                m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g))  # a trained-looking, non-zero B·A
    ids, _, resp, _ = data.pair_batch([([1, 2, 3], [4, 5, 6], [7]), ([8], [9, 10], [11, 12, 13])], "cpu")
    with torch.no_grad():
        want, adapted = diffusion.response_logps(base, ids, resp), diffusion.response_logps(model, ids, resp)
        with dpo.adapters_off(model):
            ref = diffusion.response_logps(model, ids, resp)
        assert torch.allclose(ref, want, atol=1e-6) and not torch.allclose(adapted, want, atol=1e-3)
        assert torch.equal(diffusion.response_logps(model, ids, resp), adapted)  # the adapters are back on
        with dpo.adapters_off(base):  # no LoRA: nothing to switch off
            assert torch.equal(diffusion.response_logps(base, ids, resp), want)


# ---- task vectors ----------------------------------------------------------------------------------

def test_dpo_bf16_reference(world, tmp_path, monkeypatch):
    """--frozen_dtype bfloat16 (the default on CUDA) on a CPU: a full fine-tune's reference is loaded in bf16 (the
    policy stays fp32), and DPO's losses are those of an fp32 reference up to bf16 rounding. With LoRA the reference
    is the policy's own base: one fp32 model, whatever --frozen_dtype says."""
    loads, load = [], dpo.training.load_model
    monkeypatch.setattr(dpo.training, "load_model", lambda *a, **kw: loads.append(load(*a, **kw)) or loads[-1])
    logs = {}
    for dtype in ("bfloat16", "float32"):
        r = run_dpo(*dpo_args(world, tmp_path / dtype, "--max_iters", 3, "--eval_interval", 2, "--frozen_dtype", dtype))
        assert r.returncode == 0, r.stderr[-2000:]
        assert f"reference {dtype}" in r.stdout
        logs[dtype] = [json.loads(l) for l in (tmp_path / dtype / "log.jsonl").read_text().splitlines()]
    (policy, ref), (policy32, ref32) = loads[:2], loads[2:]
    assert {q.dtype for q in ref.parameters()} == {torch.bfloat16}
    assert {q.dtype for m in (policy, policy32, ref32) for q in m.parameters()} == {torch.float32}
    a, b = logs["bfloat16"], logs["float32"]
    assert b[0]["loss"] == pytest.approx(math.log(2)) and b[0]["margin"] == 0  # the policy is the reference
    assert a[0]["margin"] != 0  # ... up to bf16 rounding
    for x, y in zip(a, b):  # measured: up to 5e-5 apart
        assert x["loss"] == pytest.approx(y["loss"], abs=1e-3)
    assert a[-1]["heldout_loss"] == pytest.approx(b[-1]["heldout_loss"], abs=1e-3)
    loads.clear()
    r = run_dpo(*dpo_args(world, tmp_path / "lora", "--max_iters", 1, "--lora_rank", 2, "--frozen_dtype", "bfloat16"))
    assert r.returncode == 0 and "reference float32" in r.stdout and len(loads) == 1, r.stderr[-2000:]


@pytest.mark.parametrize("lora", [0, 2])
@pytest.mark.parametrize("save_dtype", ["float32", "bfloat16"])
def test_dpo_resume_after_kill_matches_an_uninterrupted_run(world, tmp_path, lora, save_dtype):
    """Resume is bit-exact. With bf16 weights, a full fine-tune's train_state.pt keeps the fp32 values they round;
    LoRA's keeps none (it resumes from the --ar base and its adapters A, B, which it stores in fp32)."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    args = ["--max_iters", 4, "--eval_interval", 2, "--lora_rank", lora, "--save_dtype", save_dtype]
    assert run_dpo(*dpo_args(world, full, *args)).returncode == 0
    with killed_after_checkpoint(2):
        assert run_dpo(*dpo_args(world, cut, *args)).returncode == 3
    state = torch.load(cut / "train_state.pt", weights_only=False)
    assert (state["weights"] is None) == (lora > 0 or save_dtype == "float32")
    r = run_dpo(*dpo_args(world, cut, *args, "--resume"))
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = Qwen3.from_pretrained(full).state_dict(), Qwen3.from_pretrained(cut).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    a, b = (torch.load(d / "train_state.pt", weights_only=False)["extra"].get("lora", {}) for d in (full, cut))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a) and bool(a) == (lora > 0)


def test_dpo_sft_weight_adds_the_chosen_nll_per_token(world, tmp_path):
    """--sft_weight α: at step 0 the policy is the reference, so DPO's term is log 2 and the logged loss is
    log 2 + α · (−log π(y_w|x)) / |y_w|, checked against a slow per-token loop on the one pair of the file (every
    draw picks it). The chosen response ends in the eos text, read as the eos id."""
    pair = dict(prompt="x = ", chosen="'a'<|endoftext|>", rejected="\"a\"<|endoftext|>")
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(pair) + "\n")
    r = run_dpo("--ar", world / "ar", "--pairs", path, "--heldout", path, "--out_dir", tmp_path / "out",
            "--batch_size", 2, "--max_iters", 1, "--sft_weight", 0.5)
    assert r.returncode == 0, r.stderr[-2000:]
    loss = json.loads((tmp_path / "out/log.jsonl").read_text().splitlines()[0])["loss"]
    tok, model = Tokenizer.byte_level(), Qwen3.from_pretrained(world / "ar")
    x, y = tok.encode(pair["prompt"]), tok.encode(pair["chosen"], allowed_special={"<|endoftext|>"})
    assert y[-1] == tok.eos_id and len(y) == 4
    ids = torch.tensor([x + y])
    with torch.no_grad():
        logp = model(ids, attn="causal")[0].log_softmax(-1)
    nll = -sum(logp[len(x) + i - 1, y[i]].item() for i in range(len(y)))  # row j-1 predicts token j
    assert loss == pytest.approx(math.log(2) + 0.5 * nll / len(y), rel=1e-4)


def test_dpo_dlm_is_dpo_on_the_elbo_of_one_draw_shared_by_policy_and_reference(world, tmp_path, monkeypatch):
    """--dlm (the DLM-only baseline): the policy's and the reference's ELBOs of a step use one draw (t, M), shared by
    y_w and y_l of a pair, so at step 0 (policy = reference) every reward is exactly 0 and the DPO term log 2; with
    --sft_weight α the logged loss is log 2 + α · mean_j(−ELBO(y_w | x) of draw j) / |y_w|, the ELBO by the slow
    position-by-position reference of test_merge. An AR checkpoint is refused in one line."""
    from test_merge import slow_elbo
    pair = dict(prompt="x = ", chosen="'a'<|endoftext|>", rejected="\"a\"<|endoftext|>")
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(pair) + "\n")
    calls, pair_elbo = [], diffusion.pair_elbo
    monkeypatch.setattr(diffusion, "pair_elbo", lambda m, *a: calls.append(
        (torch.is_grad_enabled(), a[-2].clone(), a[-1].clone())) or pair_elbo(m, *a))
    args = ["--pairs", path, "--heldout", path, "--batch_size", 2, "--max_iters", 1, "--sft_weight", 0.5]
    r = run_dpo("--dlm", "--ar", world / "dlm", "--out_dir", tmp_path / "out", *args)
    assert r.returncode == 0, r.stderr[-2000:]
    rec = json.loads((tmp_path / "out/log.jsonl").read_text().splitlines()[0])
    assert rec["margin"] == 0 and rec["reward_chosen"] == 0 and rec["reward_rejected"] == 0
    (ref_grad, t_ref, u_ref), (pol_grad, t, u) = [c for c in calls if c[1].shape == (2,)][:2]  # the step's two
    assert not ref_grad and pol_grad and torch.equal(t, t_ref) and torch.equal(u, u_ref)
    tok, model = Tokenizer.byte_level(), Qwen3.from_pretrained(world / "dlm").eval()
    x, y = tok.encode(pair["prompt"]), tok.encode(pair["chosen"], allowed_special={"<|endoftext|>"})
    with torch.no_grad():
        elbo_w = [slow_elbo(model, x, y, t[j:j + 1], u[j:j + 1]) for j in range(2)]
    assert rec["loss"] == pytest.approx(math.log(2) + 0.5 * sum(-e / len(y) for e in elbo_w) / 2, rel=1e-4)
    r = run_dpo("--dlm", "--ar", world / "ar", "--out_dir", tmp_path / "ar", *args)
    assert r.returncode != 0 and "not a DLM" in r.stderr.strip().splitlines()[-1], r.stderr[-2000:]
