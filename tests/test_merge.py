"""merge.py (AR-MAP): response log-probs and the DPO loss against slow references, LoRA (and its reference with the
adapters off), in-place apply/revert, TIES and DARE on hand-made tensors, spectral norms against the SVD, the ELBO
estimate (deterministic, common masks, a slow position-by-position reference, padding), the rewards and margins of
the γ grid against a slow loop, shared vs independent masks, pick_gamma, the synthetic pairs (stdlib.make_pairs), DPO
resume (LoRA's train_state.pt without the merged weights), and the CLI end to end (γ
chosen on training pairs without reading the held-out ones)."""
import json
import math

import pytest
import torch

import convert
import diffusion
import dpo
import merge
from conftest import run_script, world_copy
from model import Qwen3, preset
from lib import corpus
from lib.tokenizer import Tokenizer
from worlds import stdlib

MASK = 259


def run(*args):
    return run_script("merge.py", *args)


def run_pairs(*args):
    return run_script("worlds/stdlib.py", *args)


def run_dpo(*args):
    return run_script("dpo.py", *args)


@pytest.fixture(scope="module")
def world(base_world, tmp_path_factory):
    return quote_world(world_copy(base_world, tmp_path_factory))


def quote_world(root):
    """The base world (conftest) plus a corpus with quotes and its pairs, and a differently shaped DLM."""
    src = root / "qsrc"
    src.mkdir()
    for i in range(10):
        (src / f"q{i}.py").write_text("".join(f"x{j} = 'a{j}' + \"b\"\nprint(\"c{i}\", y)\n" for j in range(30)))
    corpus.prepare(str(root / "qdata"), source=str(src), val_fraction=0.2)
    Qwen3(preset("micro", intermediate_size=96)).init_weights(1).save_pretrained(root / "ar_other")
    Tokenizer.byte_level().save_pretrained(root / "ar_other")
    convert.convert(root / "ar_other", root / "dlm_other", "bidirectional")
    r = run_pairs("--data", root / "qdata", "--out_dir", root / "pairs", "--n_train", 24, "--n_heldout", 8,
            "--prompt_chars", 24, "--response_chars", 12)
    assert r.returncode == 0, r.stderr[-2000:]
    return root


def micro(seed=0, **kw):
    return Qwen3(preset("micro", **kw)).init_weights(seed)


def test_apply_at_gamma_zero_is_the_dlm_and_revert_is_bit_exact():
    model = micro(attn="bidirectional", mask_token_id=MASK, shift=True).requires_grad_(False)
    W0 = {n: q.detach().clone() for n, q in model.named_parameters()}
    g = torch.Generator().manual_seed(0)
    delta = {n: torch.randn(q.shape, generator=g) * 0.01 for n, q in model.named_parameters()}
    merge.apply(model, W0, delta, 0.0)
    assert all(torch.equal(q, W0[n]) for n, q in model.named_parameters())
    for gamma in (0.5, 3.0, -2.0, 8.0):
        merge.apply(model, W0, delta, gamma)
        n = "model.norm.weight"
        assert torch.allclose(model.get_parameter(n), W0[n] + gamma * delta[n])
        merge.revert(model, W0)
    assert all(torch.equal(q, W0[n]) for n, q in model.named_parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied


def test_ties_by_hand():
    d1, d2, d3 = torch.tensor([3.0, -1, 0.5, -4]), torch.tensor([-2.5, 2, 1, -3]), torch.tensor([1.0, -3, 0.2, 2])
    # top half by magnitude: d1 -> [3, 0, 0, -4], d2 -> [-2.5, 0, 0, -3], d3 -> [0, -3, 0, 2]
    # elected signs: sum [0.5, -3, 0, -5] -> [+, -, 0, -]; disjoint means: [3], [-3], none, [-4, -3]
    assert torch.equal(merge.ties([d1, d2, d3], 0.5), torch.tensor([3.0, -3, 0, -3.5]))
    assert torch.equal(merge.ties([d1, d2], 0.5), torch.tensor([3.0, 0, 0, -3.5]))  # sum [0.5, 0, 0, -7]
    assert torch.equal(merge.ties([d1.view(2, 2)], 0.5), torch.tensor([[3.0, 0], [0, -4]]))  # one delta: trimming
    assert torch.equal(merge.ties([d1], 1.0), d1)


def test_dare_keeps_the_expectation_and_rescales_survivors():
    delta = torch.randn(200_000, generator=torch.Generator().manual_seed(1))
    out = merge.dare(delta, 0.9, torch.Generator().manual_seed(0))
    assert torch.equal(out, merge.dare(delta, 0.9, torch.Generator().manual_seed(0)))  # seeded: deterministic
    kept = out != 0
    assert abs(kept.float().mean().item() - 0.1) < 0.005
    assert torch.allclose(out[kept], delta[kept] / (1 - 0.9))
    ones = merge.dare(torch.full((200_000,), 2.0), 0.9, torch.Generator().manual_seed(2))
    assert set(ones.unique().tolist()) <= {0.0, 20.0} and abs(ones.mean().item() - 2.0) < 0.06  # E[out] = delta


def test_spectral_norm_is_the_top_singular_value_of_the_full_svd():
    g = torch.Generator().manual_seed(0)
    for shape in ((7, 5), (5, 7), (64, 64), (300, 40), (40, 300), (1, 9)):
        for scale in (1e-3, 1.0, 50.0):
            x = torch.randn(shape, generator=g) * scale
            want = torch.linalg.svdvals(x.double())[0].item()
            assert abs(merge.spectral_norm(x) - want) <= 1e-5 * want, (shape, scale)
    low = torch.randn(200, 1, generator=g) @ torch.randn(1, 30, generator=g)  # rank one: σ₁ = ‖a‖ ‖b‖
    assert abs(merge.spectral_norm(low) - torch.linalg.svdvals(low.double())[0].item()) < 1e-4
    assert merge.spectral_norm(torch.zeros(4, 3)) == 0.0
    assert abs(merge.spectral_norm(torch.tensor([3.0, 4.0])) - 5.0) < 1e-6
    assert [merge.layer_type(n) for n in ("model.layers.3.self_attn.q_proj.weight", "model.norm.weight",
                                          "model.layers.0.self_attn.k_norm.weight", "model.embed_tokens.weight")] == \
        ["q_proj", "norms", "norms", "embed_tokens"]


# ---- the ELBO and the γ search ---------------------------------------------------------------------

@pytest.mark.parametrize("shift", [True, False])
def test_sequence_elbo_matches_a_slow_position_by_position_reference(shift):
    model = micro(attn="bidirectional", mask_token_id=MASK, shift=shift)
    g = torch.Generator().manual_seed(0)
    x0 = torch.randint(0, 256, (2, 8), generator=g)
    masked = (torch.rand(2, 8, generator=g) < 0.5) & diffusion.maskable(2, 8, shift, torch.tensor([3, 2]))
    t = torch.tensor([0.3, 0.7])
    with torch.no_grad():
        got = diffusion.sequence_elbo(model, x0, masked, t)
        assert torch.equal(got, diffusion.sequence_elbo(model, x0, masked, t))  # fixed (t, masks): deterministic
        logits = model(torch.where(masked, MASK, x0))
        for b in range(2):
            want = 0.0
            for i in range(8):
                if masked[b, i]:
                    want -= -logits[b, i - shift].log_softmax(-1)[x0[b, i]].item() / t[b].item()
            assert abs(got[b].item() - want) < 1e-4


@pytest.mark.parametrize("shift", [True, False])
def test_pair_elbos_share_masks_and_ignore_padding(shift):
    model = micro(attn="bidirectional", mask_token_id=MASK, shift=shift).eval()
    same = ([5, 6, 7], [8, 9, 10, 11], [8, 9, 10, 11])  # chosen == rejected: equal only if the masks are shared
    short = ([1, 2], [3, 4], [3, 39])
    items = [same, short]
    t, u = diffusion.draw_masks(len(items), 3, 7, seed=0)
    e = diffusion.all_logps(model, items, (t, u))
    assert torch.equal(e, diffusion.all_logps(model, items, (t, u))) and e[0, 0] == e[0, 1] and (e < 0).all()
    alone = diffusion.all_logps(model, [short], (t[:, 1:], u[:, 1:]))  # the padded row equals the pair by itself
    assert torch.allclose(e[1], alone[0], atol=1e-5)


@pytest.mark.parametrize("attn", ["causal", "block", "bidirectional"])
def test_answer_logps_are_the_pairs_without_the_second_answer(attn):
    """realworld.py's −ELBO scores (x, y) once: equal to all_logps of (x, y, y), which computes y twice."""
    model = micro(attn=attn, mask_token_id=MASK, shift=True, block_size=2).eval()
    items = [([5, 6, 7], [8, 9, 10, 11]), ([1, 2], [3, 4]), ([9], [30, 31, 32])]
    draws = None if attn == "causal" else diffusion.draw_masks(len(items), 3, 7, seed=1)
    pairs = diffusion.all_logps(model, [(x, y, y) for x, y in items], draws, batch_size=2)
    got = diffusion.answer_logps(model, items, draws, batch_size=2)
    assert got.shape == (3,) and torch.allclose(got, pairs[:, 0], atol=1e-5) and (got < 0).all()


def merged_world(shift=True, seed=0):
    """A micro DLM, its W0, a random Δ, and pairs of different lengths (padding inside every batch)."""
    model = micro(seed, attn="bidirectional", mask_token_id=MASK, shift=shift).requires_grad_(False).eval()
    W0 = {n: q.detach().clone() for n, q in model.named_parameters()}
    g = torch.Generator().manual_seed(seed + 1)
    delta = {n: torch.randn(q.shape, generator=g) * 0.02 for n, q in model.named_parameters()}
    items = [([5, 6, 7], [8, 9, 10, 11], [8, 9, 12, 11]), ([1, 2], [3, 4], [3, 39]), ([40], [41, 42, 43], [44, 45])]
    return model, W0, delta, items


def slow_elbo(model, x, y, t, u):
    """ELBO estimate of log p(y|x) by hand: per draw k, the sequence x + y alone (no padding, no batch), the response
    positions i with u[k, i] < t[k] masked (never position 0 under shift), −Σ CE_i / t[k] from the full logits."""
    seq, shift, total = torch.tensor([x + y]), int(model.config.shift), 0.0
    for k in range(len(t)):
        masked = [i for i in range(len(x), len(seq[0])) if i >= shift and u[k, i] < t[k]]
        xt = seq.clone()
        xt[0, masked] = MASK
        logp = model(xt)[0].log_softmax(-1)
        total -= sum(-logp[i - shift, seq[0, i]].item() / t[k].item() for i in masked)
    return total / len(t)


@pytest.mark.parametrize("masks", ["shared", "independent"])
def test_rewards_and_margins_match_a_slow_loop(masks):
    model, W0, delta, items = merged_world()
    gammas, beta = [0.0, 0.5, 3.0], 0.1
    r = merge.rewards(model, W0, delta, items, gammas, beta=beta, n_masks=2, seed=7, masks=masks)
    assert all(torch.equal(q, W0[n]) for n, q in model.named_parameters())  # left at W0
    stats = merge.reward_stats(r, gammas)
    T = max(len(x) + max(len(a), len(b)) for x, a, b in items)
    t0, u0 = diffusion.draw_masks(len(items), 2, T, 7)  # the reference's draws
    t1, u1 = (t0, u0) if masks == "shared" else diffusion.draw_masks(len(items), 2, T, 8)  # the merged models'
    with torch.no_grad():
        for k, gamma in enumerate(gammas):
            slow = micro(0, attn="bidirectional", mask_token_id=MASK, shift=True)  # a separate model at W0 + γΔ
            slow.load_state_dict({n: W0[n] + gamma * delta[n] for n in W0}, strict=False)
            margins = []
            for j, (x, yw, yl) in enumerate(items):
                want = [beta * (slow_elbo(slow, x, y, t1[:, j], u1[:, j]) - slow_elbo(model, x, y, t0[:, j], u0[:, j]))
                        for y in (yw, yl)]  # r_γ(x, y) = β (ELBO_γ(y|x) − ELBO_DLM(y|x))
                assert r[k, j].tolist() == pytest.approx(want, abs=1e-4)
                margins.append(want[0] - want[1])
            assert stats["margin"][k] == pytest.approx(sum(margins) / len(margins), abs=1e-4)
            ties = sum(abs(m) <= 1e-9 for m in margins)  # count half
            assert stats["reward_accuracy"][k] == pytest.approx((sum(m > 1e-9 for m in margins) + ties / 2)
                                                                / len(margins))
            if gamma:
                assert stats["margin_per_gamma"][k] == pytest.approx(sum(margins) / len(margins) / gamma, abs=1e-3)
            assert stats["reward_chosen"][k] == pytest.approx(r[k, :, 0].mean().item())
            dpo_loss = sum(math.log(1 + math.exp(-m)) for m in margins) / len(margins)  # −log σ(m) = log(1 + e^−m)
            assert stats["dpo_loss"][k] == pytest.approx(dpo_loss, abs=1e-4)
    assert stats["margin_per_gamma"][0] is None
    if masks == "shared":  # common random numbers: at γ = 0 the merged model is the reference, every reward 0
        assert torch.equal(r[0], torch.zeros_like(r[0])) and stats["reward_accuracy"][0] == 0.5  # all ties
    else:  # independent draws: r_0 is the Monte Carlo noise of the reward, not 0
        assert (r[0] != 0).all()


@pytest.mark.parametrize("masks", ["shared", "independent"])
def test_shared_masks_are_shared_and_independent_ones_are_not(monkeypatch, masks):
    model, W0, delta, items = merged_world()
    items = [(x, yw, yw[:-1] + [60]) for x, yw, _ in items]  # chosen and rejected of equal length per pair
    calls, orig = [], diffusion.sequence_elbo

    def record(model, x0, masked, t, attn=None):
        calls.append((masked.clone(), t.clone()))
        return orig(model, x0, masked, t, attn)

    monkeypatch.setattr(diffusion, "sequence_elbo", record)
    merge.rewards(model, W0, delta, items, [0.0, 1.0, 2.0], beta=0.1, n_masks=3, seed=0, masks=masks)
    per_model = len(calls) // (3 + (masks == "independent"))  # 3 draws; shared: γ = 0 reuses the reference's ELBOs
    ref, merged = calls[:per_model], calls[per_model:]
    assert len(ref) == 3 and len(merged) == 3 * (2 + (masks == "independent"))
    for masked, t in calls:  # chosen (rows :B/2) and rejected (rows B/2:) share every draw, in both modes
        B = masked.shape[0]
        assert torch.equal(masked[:B // 2], masked[B // 2:]) and torch.equal(t[:B // 2], t[B // 2:])
    for k, (masked, t) in enumerate(merged):  # the merged models: the same draws at every γ
        assert torch.equal(masked, merged[k % 3][0]) and torch.equal(t, merged[k % 3][1])
    same = [torch.equal(m, rm) and torch.equal(t, rt) for (m, t), (rm, rt) in zip(merged[:3], ref)]
    assert all(same) if masks == "shared" else not any(same)
    assert any(m.any() for m, _ in ref)  # something was masked at all


def test_reward_stats_by_hand():
    r = torch.tensor([[[0.0, 0.0], [0.0, 0.0]],  # γ = 0: margins 0, 0
                      [[0.3, 0.1], [0.0, 0.2]],  # γ = 1: margins 0.2, −0.2
                      [[0.5, 0.1], [0.1, 0.0]]])  # γ = 2: margins 0.4, 0.1
    st = merge.reward_stats(r, [0, 1, 2])
    assert st["reward_accuracy"] == [0.5, 0.5, 1.0] and st["margin"] == pytest.approx([0.0, 0.0, 0.25], abs=1e-6)
    assert st["margin_per_gamma"][0] is None and st["margin_per_gamma"][1:] == pytest.approx([0.0, 0.125], abs=1e-6)
    assert st["reward_chosen"] == pytest.approx([0.0, 0.15, 0.3]) and st["same_sign"] == [0.0, 1.0, 0.5]
    def sp(m):
        return math.log(1 + math.exp(-m))  # −log σ(m)
    assert st["dpo_loss"] == pytest.approx([math.log(2), (sp(0.2) + sp(-0.2)) / 2, (sp(0.4) + sp(0.1)) / 2])


def test_pick_gamma():
    def acc(*a):
        return dict(reward_accuracy=list(a), dpo_loss=[0.5] * len(a))
    assert merge.pick_gamma([0, 1, 2, 3], acc(0.0, 0.5, 0.9, 0.7)) == 2
    assert merge.pick_gamma([0, 0.5, 1, 2], acc(0.0, 0.8, 0.8, 0.8)) == 0.5  # ties: the smallest γ
    assert merge.pick_gamma([4, 2, 3], acc(0.6, 0.6, 0.5)) == 2
    st = dict(reward_accuracy=[0.0, 0.95, 0.9, 0.8], dpo_loss=[0.69, 0.5, 0.3, 0.4])
    assert merge.pick_gamma([0, 1, 2, 3], st) == 1 and merge.pick_gamma([0, 1, 2, 3], st, select="dpo") == 2
    assert merge.pick_gamma([0, 3, 1], dict(reward_accuracy=[0, 1, 1], dpo_loss=[0.7, 0.2, 0.2]), select="dpo") == 1


# ---- pairs -----------------------------------------------------------------------------------------

def test_pairs_follow_the_rule_and_are_deterministic(world):
    texts = ["a = 'x' + \"y\"\n" * 20, 'print("hi", \'there\')\n' * 20]
    recs = stdlib.make_pairs(texts, 6, 16, 12, seed=3)
    assert recs == stdlib.make_pairs(texts, 6, 16, 12, seed=3) and len(recs) == 6
    for r in recs:
        assert '"' not in r["chosen"] and "'" not in r["rejected"] and len(r["prompt"]) == 16
        assert r["chosen"].replace("'", '"') == r["rejected"]
    assert stdlib.rule_score("'a' \"b\" 'c'") == pytest.approx(1 / 3)  # (4 - 2) / 6
    assert (stdlib.rule_score("no quotes"), stdlib.rule_score("'x'"), stdlib.rule_score('"x"')) == (0.0, 1.0, -1.0)
    lines = (world / "pairs" / "train.jsonl").read_text().splitlines()
    assert len(lines) == 24 and all(stdlib.rule_score(json.loads(l)["chosen"]) == 1.0 for l in lines)
    r = run_pairs("--data", world / "qdata", "--out_dir", world / "pairs2", "--n_train", 24, "--n_heldout", 8,
            "--prompt_chars", 24, "--response_chars", 12)
    assert (world / "pairs2" / "train.jsonl").read_text() == "\n".join(lines) + "\n"


# ---- the CLI ---------------------------------------------------------------------------------------

def dpo_args(world, out, *extra):
    return ["--ar", world / "ar", "--pairs", world / "pairs/train.jsonl", "--heldout",
            world / "pairs/heldout.jsonl", "--out_dir", out, "--batch_size", 4, "--eval_batches", 2, "--warmup", 1,
            "--lr", 1e-3, *extra]


def merge_args(world, dpo, out, *extra, heldout=None):
    return ["merge", "--ar", world / "ar", "--ar_aligned", dpo, "--dlm", world / "dlm", "--pairs",
            world / "pairs/train.jsonl", "--heldout", heldout or world / "pairs/heldout.jsonl", "--out_dir", out,
            "--n_select", 8, *extra]


def test_cli_end_to_end(world, tmp_path, monkeypatch):
    n_heldout = len((world / "pairs/heldout.jsonl").read_text().splitlines())
    r = run_dpo(*dpo_args(world, tmp_path / "dpo", "--max_iters", 6, "--eval_interval", 3, "--eval_batches", 1))
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "dpo/results.json").read_text())
    assert res["heldout_reward_acc"] > 0.5 and res["heldout_loss"] < math.log(2)
    assert res["heldout_pairs"] == n_heldout == 8  # all of them, not --eval_batches × --batch_size = 4
    log = [json.loads(l) for l in (tmp_path / "dpo/log.jsonl").read_text().splitlines()]
    assert len(log) == 6 and {"loss", "reward_acc", "margin", "reward_chosen", "tokens_per_s", "mfu"} <= set(log[0])
    loads, load = [], dpo.training.load_model
    monkeypatch.setattr(dpo.training, "load_model", lambda *a, **kw: loads.append(a) or load(*a, **kw))
    r = run_dpo(*dpo_args(world, tmp_path / "lora", "--max_iters", 3, "--eval_interval", 2, "--lora_rank", 2))
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(loads) == 1  # LoRA: the reference is the policy with its adapters off, not a second copy
    monkeypatch.undo()
    lora, ar = Qwen3.from_pretrained(tmp_path / "lora"), Qwen3.from_pretrained(world / "ar")
    # merged: an ordinary checkpoint that differs from the AR where LoRA sits, and only there
    assert not torch.equal(lora.model.layers[0].self_attn.q_proj.weight, ar.model.layers[0].self_attn.q_proj.weight)
    assert torch.equal(lora.model.embed_tokens.weight, ar.model.embed_tokens.weight)

    r = run("spectrum", "--ar", world / "ar", "--ar_aligned", tmp_path / "dpo", "--dlm", world / "dlm")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "| q_proj | 2 |" in r.stdout and "| norms |" in r.stdout
    spec = json.loads((tmp_path / "dpo/spectrum.json").read_text())  # --out defaults into the --ar_aligned directory
    assert spec["summary"]["q_proj"]["diff"] == 0 and spec["summary"]["q_proj"]["pref"] > 0  # conversion: τ_diff = 0

    for method, extra in (("linear", ["--win_rate_at", "all"]), ("ties", ["--select", "dpo"]), ("dare", [])):
        out = tmp_path / f"m-{method}"
        r = run(*merge_args(world, tmp_path / "dpo", out, "--method", method, "--gammas", "0,1,4", "--n_masks", 2,
                            "--samples", 2, "--density", 0.5, "--drop", 0.5, *extra))
        assert r.returncode == 0, r.stderr[-2000:]
        res = json.loads((out / "merge.json").read_text())
        tr, held = res["train"], res["heldout"]
        assert res["gammas"] == [0, 1, 4] and tr["n_pairs"] == 8 and held["n_pairs"] == n_heldout
        assert tr["reward_accuracy"][0] == held["reward_accuracy"][0] == 0.5 and len(held["margin"]) == 3
        assert res["chosen_by"] == {k: merge.pick_gamma(res["gammas"], tr, select=k) for k in ("accuracy", "dpo")}
        assert res["best_gamma"] == res["chosen_by"][res["select"]]
        assert 0 <= res["win_rate"] <= 1 and "win rate" in r.stdout and "| γ |" in r.stdout
        k = res["gammas"].index(res["best_gamma"])
        assert res["win_rate"] == res["win_rates"][k]
        assert sum(w is not None for w in res["win_rates"]) == (3 if method == "linear" else 1)
        if method == "linear":  # γ = 0 is the DLM itself: the same samples, every comparison a tie
            assert res["win_rates"][0] == 0.5 and res["rule_scores"][0] == res["rule_score_dlm"]
        m = Qwen3.from_pretrained(out)
        assert (m.config.attn, m.config.shift, m.config.mask_token_id) == ("bidirectional", True, MASK)
        assert Tokenizer.from_pretrained(out).vocab_size == 259
    # one γ: no search; γ = 0, the saved DLM is the DLM itself
    r = run(*merge_args(world, tmp_path / "dpo", tmp_path / "g0", "--gammas", 0, "--n_masks", 1, "--samples", 0))
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = Qwen3.from_pretrained(tmp_path / "g0").state_dict(), Qwen3.from_pretrained(world / "dlm").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "g0/merge.json").read_text())["train"] == dict(
        pairs=str(world / "pairs/train.jsonl"), n_pairs=8)


def test_gamma_is_chosen_on_training_pairs_without_reading_the_heldout_ones(world, tmp_path):
    r = run_dpo(*dpo_args(world, tmp_path / "dpo", "--max_iters", 4, "--eval_interval", 3))
    assert r.returncode == 0, r.stderr[-2000:]
    swapped = tmp_path / "swapped.jsonl"  # the held-out pairs with chosen and rejected exchanged
    recs = [json.loads(l) for l in (world / "pairs/heldout.jsonl").read_text().splitlines()]
    swapped.write_text("".join(json.dumps(dict(prompt=x["prompt"], chosen=x["rejected"], rejected=x["chosen"])) + "\n"
                               for x in recs))
    res = []
    for name, held in (("a", None), ("b", swapped)):
        r = run(*merge_args(world, tmp_path / "dpo", tmp_path / name, "--gammas", "0,0.5,2,8", "--n_masks", 2,
                            "--samples", 0, heldout=held))
        assert r.returncode == 0, r.stderr[-2000:]
        res.append(json.loads((tmp_path / name / "merge.json").read_text()))
    a, b = res
    assert a["train"] == b["train"] and a["best_gamma"] == b["best_gamma"]
    assert b["heldout"]["margin"] == pytest.approx([-m for m in a["heldout"]["margin"]], abs=1e-5)  # it did change
    assert any(m != 0 for m in a["heldout"]["margin"])
    r = run(*merge_args(world, tmp_path / "dpo", tmp_path / "c", "--gammas", "0,2", "--n_masks", 1, "--samples", 0,
                        "--masks", "independent"))
    assert r.returncode == 0, r.stderr[-2000:]
    c = json.loads((tmp_path / "c/merge.json").read_text())
    assert c["masks"] == "independent" and c["heldout"]["margin"][0] != 0  # γ = 0: the reward's Monte Carlo noise


def test_bad_inputs_give_one_line_errors(world, tmp_path):
    r = run_dpo(*dpo_args(world, tmp_path / "x", "--pairs", tmp_path / "missing.jsonl"))
    assert r.returncode == 1 and "missing.jsonl" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a"\n')
    r = run_dpo(*dpo_args(world, tmp_path / "y", "--pairs", bad))
    assert r.returncode == 1 and "bad.jsonl:2" in r.stderr
    for cmd in (["spectrum", "--out", tmp_path / "s.json"], ["merge", "--pairs", world / "pairs/heldout.jsonl",
                                                              "--out_dir", tmp_path / "m", "--samples", 0]):
        r = run(cmd[0], "--ar", world / "ar", "--ar_aligned", world / "ar", "--dlm", world / "dlm_other", *cmd[1:])
        assert r.returncode == 1 and "different tensors" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run("merge", "--ar", world / "ar", "--ar_aligned", world / "ar", "--dlm", world / "ar", "--pairs",
            world / "pairs/heldout.jsonl", "--out_dir", tmp_path / "m2")
    assert r.returncode == 1 and "not a DLM" in r.stderr
    r = run("merge", "--method", "ties", "--density", 0)
    assert r.returncode == 2 and "--density" in r.stderr
    for gammas in ("1,x", "", "nan", "1,1", "inf"):
        r = run("merge", "--gammas", gammas)
        assert r.returncode == 2 and "argument --gammas" in r.stderr and "Traceback" not in r.stderr, gammas
    held = world / "pairs/heldout.jsonl"
    r = run("merge", "--ar", world / "ar", "--ar_aligned", world / "ar", "--dlm", world / "dlm", "--pairs", held,
            "--heldout", held, "--out_dir", tmp_path / "m3")
    assert r.returncode == 1 and "same file" in r.stderr and not (tmp_path / "m3").exists()
    r = run_pairs("--data", tmp_path / "no_data", "--out_dir", tmp_path / "p")
    assert r.returncode == 1 and "worlds.stdlib:" in r.stderr and not (tmp_path / "p").exists()  # no empty directory
    r = run_pairs("--data", world / "data", "--out_dir", tmp_path / "p2")  # a corpus without quotes
    assert r.returncode == 1 and "quotes" in r.stderr and not (tmp_path / "p2").exists()


def test_a_dlm_with_appended_mask_rows_merges_on_the_ar_rows(tmp_path):
    """A vocabulary that uses every embedding row (SmolLM2's) gets mask rows appended by convert.py: open_weights
    takes the AR pair and that DLM as one model, task_deltas gives τ_pref on the AR's rows and 0 on the appended
    ones, and any other difference in shape is still refused."""
    from lib.hf import open_weights
    from model import Qwen3Config
    ar = Qwen3(preset("micro", vocab_size=259)).init_weights(0)  # the byte tokenizer's 259 ids: every row used
    tok = Tokenizer.byte_level()
    for name, m in (("ar", ar), ("aligned", Qwen3(preset("micro", vocab_size=259)).init_weights(1))):
        m.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    convert.convert(tmp_path / "ar", tmp_path / "dlm", "bidirectional")
    dlm = Qwen3.from_pretrained(tmp_path / "dlm")
    assert dlm.config.vocab_size == 320 and dlm.config.mask_token_id == 259
    handles = open_weights([tmp_path / "ar", tmp_path / "aligned", tmp_path / "dlm"], Qwen3Config)
    shapes = {n: q.shape for n, q in dlm.named_parameters()}
    delta = merge.task_deltas(handles[:2], shapes, method="linear", density=1, drop=0, seed=0, device="cpu")
    al = Qwen3.from_pretrained(tmp_path / "aligned")
    for n, q in al.named_parameters():
        want = q.detach() - ar.get_parameter(n).detach()
        assert delta[n].shape == shapes[n] and torch.allclose(delta[n][:len(want)], want, atol=1e-6), n
    assert (delta["model.embed_tokens.weight"][259:] == 0).all()
    Qwen3(preset("micro", vocab_size=384)).init_weights(0).save_pretrained(tmp_path / "other")
    with pytest.raises(SystemExit, match="different tensors"):
        open_weights([tmp_path / "ar", tmp_path / "other"], Qwen3Config)
