"""rl.py (diffu-GRPO): the group advantages by hand, the clipped objective against a per-token loop, the gradient at
μ = 1, β = 0 against REINFORCE with group baselines, the log-probability estimator (the completion fully masked, the
prompt masked where told, a fresh prompt mask each inner step, the block rule against one forward per block), and the
script: a short run on task-world prompts, resume == no interruption, and the refusals."""
import json
import random

import pytest
import torch

import rl
from conftest import killed_after_checkpoint, run_script, world_copy
from model import Qwen3, attend, left_padded
from worlds import tasks


@pytest.fixture(scope="module")
def world(base_world, tmp_path_factory):
    w = world_copy(base_world, tmp_path_factory)
    rng = random.Random(0)
    recs = [dict(prompt=tasks.make_prompt(f, rng), family=f) for f in tasks.FAMILIES for _ in range(4)]
    (w / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return w


SMALL = ["--batch_size", "2", "--group", "3", "--max_new_tokens", "4", "--warmup", "0"]


def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])  # two groups of 3
    m, sd = 1 / 3, (((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2) ** 0.5  # the unbiased std of (1, 0, 0)
    want = [(1 - m) / (sd + 1e-4), -m / (sd + 1e-4), (0 - m) / (sd + 1e-4), 0.0, 0.0, 0.0]  # a uniform group: 0
    assert rl.group_advantages(r, 3).tolist() == pytest.approx(want, abs=1e-6)


def test_clipped_objective_against_a_per_token_loop():
    g = torch.Generator().manual_seed(0)
    B, N, clip, beta = 4, 5, 0.2, 0.05
    logps, old, ref = (-torch.rand(B, N, generator=g) * 3 for _ in range(3))
    adv, keep = torch.randn(B, generator=g), torch.rand(B, N, generator=g) > 0.3
    loss, stats = rl.grpo_loss(logps, old, ref, adv, keep, clip=clip, beta=beta)
    total, n = 0.0, 0
    for b in range(B):
        for j in range(N):
            if not keep[b, j]:
                continue
            ratio = float(torch.exp(logps[b, j] - old[b, j]))
            a = float(adv[b])
            clipped = min(max(ratio, 1 - clip), 1 + clip)
            kl = float(torch.exp(ref[b, j] - logps[b, j]) - (ref[b, j] - logps[b, j]) - 1)
            total += -min(ratio * a, clipped * a) + beta * kl
            n += 1
    assert loss.item() == pytest.approx(total / n, rel=1e-5)
    assert 0 <= stats["clipped"].item() <= 1 and stats["kl"].item() >= 0


def test_mu_1_beta_0_gradient_is_reinforce_with_group_baselines():
    g = torch.Generator().manual_seed(1)
    theta = torch.randn(6, 4, generator=g, requires_grad=True)  # stands for the policy: log π of each token
    keep = torch.rand(6, 4, generator=g) > 0.2
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    adv = rl.group_advantages(rewards, 3)
    logps = torch.nn.functional.logsigmoid(theta)
    loss, _ = rl.grpo_loss(logps, logps.detach(), logps.detach(), adv, keep, clip=0.2, beta=0.0)
    (grad,) = torch.autograd.grad(loss, theta, retain_graph=True)
    reinforce = -(adv[:, None] * logps * keep).sum() / keep.sum()  # −(1/n) Σ_i A_i Σ_j log π(y_ij)
    (want,) = torch.autograd.grad(reinforce, theta)
    assert torch.allclose(grad, want, atol=1e-7)


def batch(P=6, N=4, seed=0, vocab=250):
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor([6, 3])
    x = torch.randint(0, vocab, (2, P + N), generator=g)
    x[:, :P] = torch.where(torch.arange(P) < P - lens[:, None], 256, x[:, :P])
    real = left_padded(lens, P, P + N)[0][:, :P]
    drop = (torch.rand(2, P, generator=g) < 0.5) & real
    return x, lens, P, drop


@pytest.mark.parametrize("name", ["dlm", "dlm_noshift"])
def test_masked_estimator_reads_the_completion_fully_masked(world, name):
    """The one forward sees the prompt masked exactly where told and every completion slot masked; each token's
    log-probability is the denoiser's at that slot (shift: the slot before), against a direct forward."""
    model = Qwen3.from_pretrained(world / name).eval()
    c = model.config
    x, lens, P, drop = batch()
    seen = []
    orig = Qwen3.forward
    def spy(self, idx, *a, **kw):
        seen.append(idx.clone())
        return orig(self, idx, *a, **kw)
    Qwen3.forward = spy
    try:
        with torch.no_grad():
            lp = rl.completion_logps(model, x, lens, P, drop)
    finally:
        Qwen3.forward = orig
    (idx,) = seen
    assert (idx[:, P:] == c.mask_token_id).all()
    assert torch.equal(idx[:, :P] == c.mask_token_id, drop)
    real, pos = left_padded(lens, P, x.shape[1])
    with torch.no_grad():
        logits = model(idx, attend("bidirectional", torch.arange(x.shape[1]), real), pos=pos).log_softmax(-1)
    for b in range(2):
        for j in range(x.shape[1] - P):
            row = P + j - 1 if c.shift else P + j
            assert lp[b, j].item() == pytest.approx(logits[b, row, x[b, P + j]].item(), abs=1e-5)


@pytest.mark.parametrize("name", ["block", "block_shift"])
def test_block_estimator_is_each_block_given_the_clean_ones_before(world, name):
    """A block DLM: block b's tokens fully masked, given the (masked) prompt and the clean blocks before it, against
    one forward per block over [prompt, y_<b, mask block] (diffusion.per_block_logits)."""
    import diffusion
    model = Qwen3.from_pretrained(world / name).eval()
    x, lens, P, drop = batch(P=8, N=8)
    x[:, :8] = torch.where(torch.arange(8) < 8 - lens[:, None], 256, x[:, :8])
    drop = drop.new_zeros(2, 8)
    drop[0, 3] = drop[1, 6] = True
    with torch.no_grad():
        lp = rl.completion_logps(model, x, lens, 8, drop)
        x_in = x.clone()
        x_in[:, :8] = x[:, :8].masked_fill(drop, model.config.mask_token_id)
        real, pos = left_padded(lens, 8, 16)
        ref = diffusion.per_block_logits(model, x_in, torch.full_like(x[:, 8:], model.config.mask_token_id),
                                         torch.ones(2, 8, dtype=torch.bool), P=8, real=real, pos=pos)
    want = ref.log_softmax(-1).gather(-1, x[:, 8:].reshape(-1, 1)).view(2, 8)
    assert torch.allclose(lp, want, atol=1e-4)


def test_a_fresh_prompt_mask_each_inner_step(world, tmp_path):
    """The training forwards (with gradients) of two inner steps on one batch of rollouts mask the prompt
    differently, each completion fully masked; π_old's forwards use the same masks, step by step."""
    seen = {True: [], False: []}
    orig = Qwen3.forward
    mask_id = Qwen3.from_pretrained(world / "dlm").config.mask_token_id
    def spy(self, idx, *a, **kw):
        if idx.shape[1] > 4 and (idx[:, -4:] == mask_id).all() and (idx[:, :-4] == mask_id).any():
            seen[torch.is_grad_enabled()].append((idx[:, :-4] == mask_id).clone())
        return orig(self, idx, *a, **kw)
    Qwen3.forward = spy
    try:
        r = run_script("rl.py", "--init", world / "dlm", "--prompts", world / "prompts.jsonl", "--out_dir",
                       tmp_path / "o", *SMALL, "--max_iters", 2, "--mu", 2, "--eval_interval", 2, "--beta", 0,
                       "--prompt_mask", 0.5)
    finally:
        Qwen3.forward = orig
    assert r.returncode == 0, r.stderr
    train, old = seen[True], seen[False][-2:]  # the last two no-grad ones: π_old under the two steps' masks
    assert len(train) == 2 and not torch.equal(train[0], train[1])
    assert torch.equal(old[0], train[0]) and torch.equal(old[1], train[1])


@pytest.mark.parametrize("name", ["dlm", "block"])
def test_two_steps_on_the_task_world(world, tmp_path, name):
    r = run_script("rl.py", "--init", world / name, "--prompts", world / "prompts.jsonl", "--out_dir", tmp_path / "o",
                   *SMALL, "--max_iters", 2, "--mu", 1, "--eval_interval", 1)
    assert r.returncode == 0, r.stderr
    log = [json.loads(line) for line in (tmp_path / "o" / "log.jsonl").read_text().splitlines()]
    assert [rec["step"] for rec in log] == [0, 1]
    assert all(torch.isfinite(torch.tensor(rec["loss"])) and 0 <= rec["reward"] <= 1 for rec in log)
    assert (tmp_path / "o" / "model.safetensors").exists() and (tmp_path / "o" / "results.json").exists()


def test_a_run_that_ends_inside_a_batch_of_rollouts(world, tmp_path):
    """--max_iters 3 with --mu 2: two batches of rollouts, the second cut after its first inner step; the last step
    is saved."""
    r = run_script("rl.py", "--init", world / "dlm", "--prompts", world / "prompts.jsonl", "--out_dir", tmp_path / "o",
                   *SMALL, "--max_iters", 3, "--mu", 2, "--eval_interval", 2)
    assert r.returncode == 0, r.stderr
    log = [json.loads(line) for line in (tmp_path / "o" / "log.jsonl").read_text().splitlines()]
    assert [rec["step"] for rec in log] == [0, 1, 2]
    assert ["reward" in rec for rec in log] == [True, False, True]  # the rollouts' figures at the steps making them
    assert (tmp_path / "o" / "results.json").exists()


def test_resume_equals_uninterrupted(world, tmp_path):
    args = ["--init", world / "dlm", "--prompts", world / "prompts.jsonl", *SMALL, "--max_iters", 4, "--mu", 2,
            "--eval_interval", 2]
    assert run_script("rl.py", *args, "--out_dir", tmp_path / "a").returncode == 0
    with killed_after_checkpoint(1):
        assert run_script("rl.py", *args, "--out_dir", tmp_path / "b").returncode == 3
    r = run_script("rl.py", *args, "--out_dir", tmp_path / "b", "--resume")
    assert r.returncode == 0, r.stderr
    a, b = (Qwen3.from_pretrained(tmp_path / d).state_dict() for d in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_refusals(world, tmp_path):
    base = ["--prompts", world / "prompts.jsonl", "--out_dir", tmp_path / "o", *SMALL, "--max_iters", 1, "--mu", 1]
    r = run_script("rl.py", "--init", world / "dlm", *base, "--group", 1)
    assert r.returncode == 2 and "--group 1" in r.stderr
    r = run_script("rl.py", "--init", world / "dlm", *base[:-2], "--mu", 3, "--eval_interval", 4)
    assert r.returncode == 2 and "--eval_interval 4 must be a multiple of --mu 3" in r.stderr
    r = run_script("rl.py", "--init", world / "ar", *base)
    assert r.returncode == 1 and "is not a DLM" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    (tmp_path / "bad.py").write_text("def reward(rec, reply):\n    return 'yes'\n")
    r = run_script("rl.py", "--init", world / "dlm", *base, "--reward", f"{tmp_path / 'bad.py'}:reward")
    assert r.returncode == 1 and "returned 'yes' (str)" in r.stderr
    (tmp_path / "p.jsonl").write_text(json.dumps(dict(prompt="hello there")) + "\n")
    r = run_script("rl.py", "--init", world / "dlm", *base[2:], "--prompts", tmp_path / "p.jsonl")
    assert r.returncode == 1 and "line 1: the reward has no checker" in r.stderr


def test_judged_pairs_put_a_right_sample_over_a_wrong_one(world, tmp_path):
    """scripts/judged_pairs.py: a pair per prompt whose samples hold a right and a wrong one, by the checker; a stub
    sampler answers right in odd rows, so every prompt gives a pair, its chosen right and its rejected wrong."""
    import sample
    from scripts import judged_pairs as J
    from lib.tokenizer import Tokenizer
    recs = [json.loads(line) for line in (world / "prompts.jsonl").read_text().splitlines()][:4]
    tok = Tokenizer.from_pretrained(world / "dlm")
    model = Qwen3.from_pretrained(world / "dlm").eval()
    orig = sample.generate

    def stub(model, rows, n, **kw):  # row k: the right answer when k is odd, else " 9 9 9"
        g = orig(model, rows, n, **kw)
        for k in range(len(rows)):
            r = recs[k // 3] if k // 3 < len(recs) else None
            text = tasks.solve(r["family"], r["prompt"]) if k % 2 else " 9 9 9"
            ids = tok.encode(text)[:n] + [tok.eos_id] * n
            g.tokens[k, g.start:] = torch.tensor(ids[:n])
        return g
    sample.generate = stub
    try:
        reward, _ = rl.load_reward("tasks")
        pairs, stats = J.judged_pairs(model, tok, recs, reward, group=3, threshold=0.9, batch_size=4, seed=0,
                                      max_new_tokens=8)
    finally:
        sample.generate = orig
    assert stats["pairs"] == len(pairs) == 4
    for r, pair in zip(recs, pairs):
        assert tasks.check(r["family"], r["prompt"], pair["chosen"]) and not tasks.check(r["family"], r["prompt"],
                                                                                          pair["rejected"])
