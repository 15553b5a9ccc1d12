"""align.py: the alignment loss against a slow re-implementation (loops over layers and positions), the
keyword loss_step against the former argparse-namespace formula, the evaluation cosines against loops, the
positions S under both shift conventions, λ = 0 never running the teacher in training, frozen tensors shared
and unchanged (tied and untied heads), the teacher never changing, evaluation and checkpoint intervals apart,
resume == no interruption, learning, NaN and refusals."""
from types import SimpleNamespace

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import align
import convert
import diffusion
from conftest import run_script, world_copy, killed_after_checkpoint
from model import Qwen3, Qwen3Model, preset
from lib import checkpoint
from lib import data
from lib import training
from lib.tokenizer import Tokenizer


def teacher_of(path, student, share=False):
    """align.py's teacher: the AR checkpoint, frozen, with the student's shapes (share: λ > 0's, holding the
    student's frozen tensors)."""
    return training.load_teacher(path, student, "cpu", "align", same_shapes=True, share=share)


SMALL = ["--batch_size", "4", "--seq_len", "32", "--eval_batches", "2", "--warmup", "2", "--samples", "0"]


def run(*args):
    return run_script("align.py", *args)


@pytest.fixture(scope="module")
def world(base_world, tmp_path_factory):
    """A tiny corpus, a micro AR 'teacher' (random weights) and its conversions (shift true and false)."""
    root = world_copy(base_world, tmp_path_factory)
    Qwen3(preset("micro", tie_word_embeddings=False)).init_weights(0).save_pretrained(root / "ar_untied")
    Tokenizer.byte_level().save_pretrained(root / "ar_untied")
    convert.convert(root / "ar_untied", root / "dlm_untied", "bidirectional")
    return root


def common(world, out, *extra):
    return ["--init", world / "dlm", "--data", world / "data", "--out_dir", out, *SMALL, *extra]


def log(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def slow_align(hs, ht, masked, layers, shift, mode):
    """1 - the mean over (ℓ, i ∈ S) of a·b / (|a| |b|), by explicit loops."""
    B, T = masked.shape
    total, count = 0.0, 0
    for l in layers:
        for b in range(B):
            for i in range(T):
                if mode == "all" or (masked[b, i + 1] if shift and i + 1 < T else (not shift and masked[b, i])):
                    a, c = hs[l][b, i].double(), ht[l][b, i].double()
                    total, count = total + (a @ c) / (a.norm() * c.norm()), count + 1
    return 1 - total / count


@pytest.mark.parametrize("shift", [True, False])
@pytest.mark.parametrize("mode", ["masked", "all"])
def test_align_loss_matches_slow_loops(shift, mode):
    g = torch.Generator().manual_seed(0)
    hs = [torch.randn(2, 7, 5, generator=g) for _ in range(4)]
    ht = [torch.randn(2, 7, 5, generator=g) for _ in range(4)]
    masked = torch.rand(2, 7, generator=g) < 0.5
    masked[:, 0] = False if shift else masked[:, 0]
    for layers in ([0, 1, 2, 3], [1, 3]):
        got, per_layer = align.repr_align_loss(hs, ht, align.align_rows(masked, shift, mode), layers=layers)
        assert torch.allclose(got.double(), slow_align(hs, ht, masked, layers, shift, mode), atol=1e-6)
        assert per_layer.shape == (len(layers),)
    rows = align.align_rows(masked, shift, mode)
    l2, _ = align.repr_align_loss(hs, ht, rows, layers=[0, 2], metric="l2")
    want = sum(((hs[l][rows] - ht[l][rows]) ** 2).sum(-1).mean() / 5 for l in (0, 2)) / 2  # mean of |a-b|^2 / C
    assert torch.allclose(l2, want)


def test_align_positions_and_layers():
    masked = torch.tensor([[False, True, False, True, True]])
    assert align.align_rows(masked, True, "masked").tolist() == [[True, False, True, True, False]]  # i-1 for masked i
    assert align.align_rows(masked, False, "masked").tolist() == masked.tolist()
    assert align.align_rows(masked, True, "all").all()
    assert align.parse_layers("all", 7) == list(range(7))
    assert align.parse_layers("mid", 7) == [2, 3] and align.parse_layers("top", 7) == [4, 5, 6]
    assert align.parse_layers("0,-1,3", 7) == [0, 3, 6]
    with pytest.raises(SystemExit):
        align.parse_layers("9", 7)


@pytest.mark.parametrize("ckpt", ["dlm", "dlm_noshift"])
def test_loss_step_end_to_end_against_slow(world, ckpt):
    """loss_step's alignment term equals loops over full forwards: student on xt (bidirectional), teacher on
    clean x0 (causal), at the rows i-1 (shift) or i (no shift) of the masked positions i."""
    student = Qwen3.from_pretrained(world / ckpt)
    with torch.no_grad():  # make the student differ from the teacher
        for q in student.parameters():
            q.add_(0.01 * torch.randn(q.shape, generator=torch.Generator().manual_seed(1)))
    teacher = teacher_of(world / "ar", student)
    x0 = torch.randint(0, 256, (3, 16), generator=torch.Generator().manual_seed(2))
    xt, masked, t = diffusion.corrupt(x0, 259, student.config.shift, torch.Generator().manual_seed(3), 1 / 500)
    loss, stats = align.loss_step(student, teacher, x0, xt, masked, t, layers=[0, 1, 2])
    _, hs = student(xt, attn="bidirectional", output_hidden_states=True)
    _, ht = teacher(x0, attn="causal", output_hidden_states=True)
    want = slow_align(hs, ht, masked, [0, 1, 2], student.config.shift, "masked")
    assert torch.allclose(stats["align_loss"].double(), want, atol=1e-5)
    assert torch.allclose(loss, stats["diff_loss"] + 10 * stats["align_loss"])


def old_loss_step(student, teacher, x0, gen, args, layers):
    """loss_step as it was when it read the script's argparse namespace (with its align_loss inlined)."""
    c = student.config
    xt, masked, t = diffusion.corrupt(x0, c.mask_token_id, c.shift, gen, args.eps)
    if teacher is None:
        l_diff = diffusion.diffusion_loss(student, x0, xt, masked, t, args.loss_norm, extra_ce=args.extra_ce)
        return l_diff, dict(diff_loss=l_diff)
    l_diff, hs = diffusion.diffusion_loss(student, x0, xt, masked, t, args.loss_norm, extra_ce=args.extra_ce,
                                          output_hidden_states=True)
    with torch.no_grad():
        _, ht = teacher.model(x0, "causal", output_hidden_states=True)
    rows = diffusion.denoiser_rows(masked, c.shift) if args.align_positions == "masked" else torch.ones_like(masked)
    n, per_layer = rows.sum().clamp(min=1), []
    for l in layers:
        a, b = hs[l][rows].float(), ht[l][rows].float()
        if args.align_metric == "cos":
            per_layer.append(F.cosine_similarity(a, b, dim=-1).sum() / n)
        else:
            per_layer.append((a - b).pow(2).mean(-1).sum() / n)
    per_layer = torch.stack(per_layer)
    l_align = 1 - per_layer.mean() if args.align_metric == "cos" else per_layer.mean()
    return l_diff + args.lambda_align * l_align, dict(diff_loss=l_diff, align_loss=l_align, align_per_layer=per_layer)


@pytest.mark.parametrize("flags", [dict(), dict(lambda_align=0.0), dict(align_metric="l2", align_positions="all"),
                                   dict(loss_norm="elbo", extra_ce=True, lambda_align=3.0, eps=0.1)])
@pytest.mark.parametrize("ckpt", ["dlm", "dlm_noshift"])
def test_keyword_loss_step_is_bit_identical_to_the_former_formula(world, ckpt, flags):
    """The copyable loss_step (named parameters) gives exactly the former namespace-based step: loss, stats and
    gradients, on a seeded batch, for the default recipe, λ = 0, L2 at all positions, ELBO + extra CE."""
    hp = {**dict(lambda_align=10.0, eps=1 / 500, align_metric="cos", loss_norm="mean", align_positions="masked",
                 extra_ce=False), **flags}
    got = {}
    for name in ("old", "new"):
        student = Qwen3.from_pretrained(world / ckpt)
        with torch.no_grad():
            for q in student.parameters():
                q.add_(0.01 * torch.randn(q.shape, generator=torch.Generator().manual_seed(1)))
        teacher = teacher_of(world / "ar", student) if hp["lambda_align"] > 0 else None
        x0 = torch.randint(0, 256, (3, 16), generator=torch.Generator().manual_seed(2))
        gen = torch.Generator().manual_seed(3)
        if name == "old":
            loss, stats = old_loss_step(student, teacher, x0, gen, SimpleNamespace(**hp), [0, 2])
        else:
            noise = diffusion.corrupt(x0, student.config.mask_token_id, student.config.shift, gen, hp["eps"])
            loss, stats = align.loss_step(student, teacher, x0, *noise, layers=[0, 2], lambda_align=hp["lambda_align"],
                                          metric=hp["align_metric"], norm=hp["loss_norm"],
                                          positions=hp["align_positions"], extra_ce=hp["extra_ce"])
        loss.backward()
        got[name] = loss, stats, [q.grad for q in student.parameters()]
    (lo, so, go), (ln, sn, gn) = got["old"], got["new"]
    assert torch.equal(lo, ln) and so.keys() == sn.keys() and all(torch.equal(so[k], sn[k]) for k in so)
    assert all(torch.equal(a, b) for a, b in zip(go, gn))
    assert ("align_loss" in sn) == (hp["lambda_align"] > 0)
    with pytest.raises(ValueError, match="needs a teacher"):
        align.loss_step(student, None, x0, *noise, layers=[0], lambda_align=1.0)


def slow_cosines(student, teacher, batches):
    """Per hidden state, the mean over (batch, row i-1 of masked i) of cos(student on xt, teacher on x0), by
    loops over full forwards; the masks redrawn at ratio 0.5 with the evaluation's own seed."""
    g, total, count = torch.Generator().manual_seed(diffusion.EVAL_SEED + 1), None, 0
    for x0 in batches:
        xt, masked, _ = diffusion.corrupt(x0, student.config.mask_token_id, True, g, t=0.5)
        _, hs = student(xt, attn="bidirectional", output_hidden_states=True)
        _, ht = teacher(x0, attn="causal", output_hidden_states=True)
        sums = [0.0] * len(hs)
        for b in range(x0.shape[0]):
            for i in range(x0.shape[1] - 1):
                if masked[b, i + 1]:
                    count += 1
                    for l in range(len(hs)):
                        a, c = hs[l][b, i].double(), ht[l][b, i].double()
                        sums[l] += (a @ c / (a.norm() * c.norm())).item()
        total = sums if total is None else [x + y for x, y in zip(total, sums)]
    return [x / count for x in total]


def test_cosine_eval_matches_slow_loops_and_teacher_runs_once(world):
    student = Qwen3.from_pretrained(world / "dlm")
    with torch.no_grad():
        for q in student.parameters():
            q.add_(0.05 * torch.randn(q.shape, generator=torch.Generator().manual_seed(1)))
    teacher = teacher_of(world / "ar", student)
    batches = [torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(k)) for k in range(3)]
    calls = []
    orig = teacher.model.forward
    teacher.model.forward = lambda *a, **kw: calls.append(1) or orig(*a, **kw)
    cos = align.CosineEval(teacher, student.config, batches)
    got = cos(student)
    assert torch.equal(cos(student), got)  # fixed masks
    assert len(calls) == len(batches)  # once per batch, at construction; not rerun per evaluation
    want = slow_cosines(student, teacher, batches)
    assert got.shape == (student.config.num_hidden_layers + 1,)
    assert torch.allclose(got.double(), torch.tensor(want, dtype=torch.float64), atol=1e-5)


def test_lambda_zero_never_runs_the_teacher_in_training(world, tmp_path, monkeypatch):
    """λ = 0: the teacher is loaded once and run once per evaluation batch before the first training batch is
    drawn (for val_cos), never after; λ = 10 runs it in training (the trap springs)."""
    load, forward, answer_batch = Qwen3.from_pretrained.__func__, Qwen3Model.forward, data.answer_batch
    loads, training_started = [], []

    def count_teacher(cls, path, *a, **kw):
        loads.append(Path(path).resolve() == (world / "ar").resolve())
        return load(cls, path, *a, **kw)

    def no_causal_in_training(self, idx, attn, *a, **kw):
        assert not (attn == "causal" and training_started), "a causal (teacher) forward ran in training"
        return forward(self, idx, attn, *a, **kw)

    monkeypatch.setattr(Qwen3, "from_pretrained", classmethod(count_teacher))
    monkeypatch.setattr(Qwen3Model, "forward", no_causal_in_training)
    monkeypatch.setattr(data, "answer_batch", lambda *a, **kw: training_started.append(1) or answer_batch(*a, **kw))
    r = run(*common(world, tmp_path / "l0"), "--teacher", world / "ar", "--lambda_align", "0", "--max_iters", "3",
            "--eval_interval", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    assert sum(loads) == 1 and "no teacher in training" in r.stdout
    recs = log(tmp_path / "l0")
    assert all("align_loss" not in rec for rec in recs)
    assert [len(rec["val_cos"]) for rec in recs if "val_cos" in rec] == [3, 3]  # steps 0 and 2; micro: 3 states
    with pytest.raises(AssertionError, match="ran in training"):  # the trap works: λ > 0 springs it
        run(*common(world, tmp_path / "l10"), "--teacher", world / "ar", "--max_iters", "1")
    monkeypatch.undo()
    moved = tmp_path / "moved"  # a DLM whose AR checkpoint is gone: λ = 0 still trains, without val_cos
    shutil.copytree(world / "dlm", moved)
    config = json.loads((moved / "config.json").read_text())
    (moved / "config.json").write_text(json.dumps(dict(config, converted_from=str(tmp_path / "gone"))))
    r = run(*common(world, tmp_path / "l0b"), "--init", moved, "--lambda_align", "0", "--max_iters", "1")
    assert r.returncode == 0 and "no val_cos" in r.stdout and "val_cos" not in log(tmp_path / "l0b")[-1]
    r = run(*common(world, tmp_path / "l10b"), "--init", moved, "--max_iters", "1")
    assert r.returncode == 1 and "align: teacher" in r.stderr


def test_frozen_tensors_shared_unchanged_and_teacher_constant(world):
    student = Qwen3.from_pretrained(world / "dlm")
    training.freeze(student, ["embed", "mlp"])
    teacher = teacher_of(world / "ar", student, share=True)
    frozen = {n: q for n, q in student.named_parameters() if not q.requires_grad}
    assert "model.embed_tokens.weight" in frozen and any(".mlp." in n for n in frozen)
    for n, q in frozen.items():
        assert teacher.get_parameter(n) is q and teacher.get_parameter(n).data_ptr() == q.data_ptr()
    assert teacher.lm_head.weight is student.model.embed_tokens.weight  # tied: the head too
    def q_proj(m):
        return m.model.layers[0].self_attn.q_proj.weight
    assert q_proj(student).data_ptr() != q_proj(teacher).data_ptr()
    before_t = {k: v.clone() for k, v in teacher.state_dict().items()}
    before_s = {k: v.clone() for k, v in student.state_dict().items()}
    seen = []
    orig_fwd = teacher.model.forward
    teacher.model.forward = lambda idx, attn, **kw: seen.append((idx.clone(), attn)) or orig_fwd(idx, attn, **kw)
    gen = torch.Generator().manual_seed(0)
    opt = training.configure_optimizer(student, 1e-2, 0.1)
    for _ in range(3):
        x0 = torch.randint(0, 256, (2, 16), generator=gen)
        noise = diffusion.corrupt(x0, student.config.mask_token_id, student.config.shift, gen)
        loss, _ = align.loss_step(student, teacher, x0, *noise, layers=list(range(3)))
        loss.backward()
        assert all(q.grad is None for q in frozen.values())
        assert all(q.grad is None for q in teacher.parameters())
        opt.step()
        opt.zero_grad(set_to_none=True)
        assert torch.equal(seen[-1][0], x0) and seen[-1][1] == "causal"  # the teacher sees the clean x0, causally
    after_s = student.state_dict()
    for k, v in teacher.state_dict().items():
        assert torch.equal(v, before_t[k]), f"teacher tensor {k} changed"
    for k, v in after_s.items():
        frozen_k = k in frozen or k == "lm_head.weight"
        assert torch.equal(v, before_s[k]) == frozen_k, k


@pytest.mark.parametrize("ckpt,groups", [("dlm", "embed,lm_head"), ("dlm_untied", "embed,lm_head"),
                                         ("dlm_untied", "embed"), ("dlm_untied", "lm_head")])
def test_published_freeze_embed_and_head_tied_and_untied(world, tmp_path, ckpt, groups):
    """--freeze embed,lm_head (the published recipe) keeps exactly the embedding matrix and the output head; tied,
    that is one matrix (and either name freezes it); untied, each name freezes its own. The teacher shares them."""
    out = tmp_path / "frz"
    r = run(*common(world, out), "--init", world / ckpt, "--freeze", groups, "--max_iters", "3", "--samples", "0")
    assert r.returncode == 0, r.stderr[-2000:]
    tied = ckpt == "dlm"
    assert ("tied embeddings" in r.stdout) == tied
    init, got = Qwen3.from_pretrained(world / ckpt).state_dict(), Qwen3.from_pretrained(out).state_dict()
    frozen = {"embed": "model.embed_tokens.weight", "lm_head": "lm_head.weight"}
    want = {frozen[g] for g in groups.split(",")} | (set(frozen.values()) if tied else set())
    assert set(init) == set(got) and "lm_head.weight" in init
    for k in init:
        assert torch.equal(init[k], got[k]) == (k in want), k
    student = Qwen3.from_pretrained(world / ckpt)
    training.freeze(student, groups.split(","))
    teacher = teacher_of(world / f"ar{'' if tied else '_untied'}", student, share=True)
    assert (teacher.lm_head.weight is student.lm_head.weight) == ("lm_head.weight" in want)
    assert (teacher.model.embed_tokens.weight is student.model.embed_tokens.weight) == (frozen["embed"] in want)
    assert teacher.lm_head.weight is not teacher.model.embed_tokens.weight or tied


def test_evaluation_and_checkpoint_intervals_apart(world, tmp_path, monkeypatch):
    saved, save = [], checkpoint.save_checkpoint
    monkeypatch.setattr(checkpoint, "save_checkpoint", lambda *a, **kw: saved.append(a[4]) or save(*a, **kw))
    out = tmp_path / "iv"
    r = run(*common(world, out), "--max_iters", "7", "--eval_interval", "2", "--ckpt_interval", "4", "--samples", "0")
    assert r.returncode == 0, r.stderr[-2000:]
    assert saved == [4, 6]  # every --ckpt_interval (step 0: the weights it started from, not written), the last
    recs = log(out)
    assert [x["step"] for x in recs if "val_acc@0.5" in x] == [0, 2, 4, 6]
    assert all(len(x["val_cos"]) == 3 for x in recs if "val_acc@0.5" in x)
    res = json.loads((out / "results.json").read_text())
    assert res["val_cos"] == recs[-1]["val_cos"] and res["val_nelbo"] == recs[-1]["val_nelbo"]


def test_script_freeze_keeps_frozen_weights_and_refuses_scratch_with_freeze(world, tmp_path):
    out = tmp_path / "frz"
    r = run(*common(world, out), "--freeze", "lm_head,mlp", "--max_iters", "3", "--samples", "0")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "tied embeddings" in r.stdout and "shares the student's" in r.stdout
    init, got = Qwen3.from_pretrained(world / "dlm").state_dict(), Qwen3.from_pretrained(out).state_dict()
    for k in init:
        assert torch.equal(init[k], got[k]) == (".mlp." in k or "embed" in k or k == "lm_head.weight"), k
    r = run(*common(world, tmp_path / "scr"), "--scratch", "--freeze", "embed", "--max_iters", "2")
    assert r.returncode == 1 and "differs between student and teacher" in r.stderr


def test_learns_writes_results_and_samples(world, tmp_path):
    out = tmp_path / "learn"
    r = run(*common(world, out), "--max_iters", "30", "--eval_interval", "29", "--lr", "3e-3", "--samples", "1",
            "--sample_len", "16")
    assert r.returncode == 0, r.stderr[-2000:]
    recs = log(out)
    keys = {"diff_loss", "align_loss", "align_per_layer", "tokens_per_s"}
    assert len(recs) == 30 and all(keys <= set(x) for x in recs)
    assert len(recs[0]["align_per_layer"]) == 3  # micro: embedding output, 1 block, final norm
    first, last = recs[0], recs[-1]
    assert last["val_loss@0.5"] < first["val_loss@0.5"] - 0.5 and last["val_nelbo"] < first["val_nelbo"] - 0.5
    res = json.loads((out / "results.json").read_text())
    assert res["steps"] == 30 and res["val_acc@0.15"] > first["val_acc@0.15"] and res["step_seconds"] > 0
    assert "--- prompt:" in r.stdout and "forwards" in r.stdout  # samples from sample.py
    assert Qwen3.from_pretrained(out).config.attn == "bidirectional"


def test_resume_after_kill(world, tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    args = ["--max_iters", "8", "--eval_interval", "2", "--ckpt_interval", "4", "--samples", "0", "--freeze", "embed"]
    assert run(*common(world, full), *args).returncode == 0
    with killed_after_checkpoint(4):
        assert run(*common(world, cut), *args).returncode == 3
    r = run(*common(world, cut), *args, "--resume")
    assert r.returncode == 0, r.stderr[-2000:]
    got, want = log(cut), log(full)
    def key(recs):
        return [(x["step"], x["loss"], x["diff_loss"], x["align_loss"]) for x in recs]
    assert key(got) == key(want[:4]) + key(want[5:])  # step 4's own record was lost with the kill
    assert got[-1]["val_nelbo"] == want[-1]["val_nelbo"]


def test_bf16_teacher(world, tmp_path):
    """--frozen_dtype bfloat16 (the default on CUDA) on a CPU: the teacher is held in bf16, so it cannot share the
    student's fp32 frozen tensors and keeps its own copy; training runs and the cosines to it are those of an fp32
    teacher up to bf16 rounding."""
    args = ["--max_iters", "2", "--samples", "0", "--freeze", "embed"]
    r = run(*common(world, tmp_path / "bf16"), *args, "--frozen_dtype", "bfloat16")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "(causal, frozen, bfloat16); it shares the student's 0.00M frozen parameters" in r.stdout
    assert run(*common(world, tmp_path / "f32"), *args).returncode == 0
    a, b = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("bf16", "f32"))
    assert a["val_cos"] != b["val_cos"]
    torch.testing.assert_close(torch.tensor(a["val_cos"]), torch.tensor(b["val_cos"]), atol=2e-2, rtol=0)


def test_nan_stops_cleanly_and_refusals(world, tmp_path):
    out = tmp_path / "nan"
    r = run(*common(world, out), "--max_iters", "30", "--eval_interval", "1", "--ckpt_interval", "1", "--lr", "1e12",
            "--grad_clip", "1e30")
    assert r.returncode == 1 and "at step" in r.stderr and "last good checkpoint" in r.stderr
    assert Qwen3.from_pretrained(out)
    for ckpt in ("ar", "block"):  # a causal or block checkpoint is not a REPR-ALIGN student
        r = run(*common(world, tmp_path / ckpt), "--init", world / ckpt)
        assert r.returncode == 1 and "not a bidirectional DLM" in r.stderr and "convert.py" in r.stderr
    r = run(*common(world, tmp_path / "ar0"), "--init", world / "ar", "--lambda_align", "0")  # run.sh real's SFT
    assert r.returncode == 1 and "is not a DLM" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "ar0" / "config.json").exists()  # nothing written as a student
    r = run(*common(world, tmp_path / "f"), "--freeze", "head")
    assert r.returncode == 2 and "unknown groups" in r.stderr


def test_ablation_flags_run(world, tmp_path):
    out = tmp_path / "abl"
    r = run(*common(world, out), "--init", world / "dlm_noshift", "--align_metric", "l2", "--extra_ce", "--loss_norm",
            "elbo", "--align_positions", "all", "--align_layers", "top", "--grad_checkpoint", "--grad_accum", "2",
            "--max_iters", "2", "--samples", "0")
    assert r.returncode == 0, r.stderr[-2000:]
    recs = log(out)
    assert len(recs) == 2 and len(recs[0]["align_per_layer"]) == 1 and recs[0]["align_loss"] > 0
    assert "shift=False" in r.stdout


def test_each_ablation_flag_does_what_it_says(world, tmp_path):
    """Step 0 of one-step runs from the same init, batch and masks (same --seed): the flags that change only the
    alignment term leave diff_loss as it is; --align_metric l2 makes L_align the mean of its per-layer squared
    distances (cos: 1 − the mean of its per-layer cosines); --align_layers keeps those hidden states only, with the
    same per-layer values; --align_positions all averages over every row; --extra_ce and --loss_norm elbo change
    the denoising loss itself."""
    def step0(*flags):
        out = tmp_path / "-".join(str(f).strip("-") for f in flags or ["base"])
        r = run(*common(world, out), "--max_iters", "1", "--samples", "0", *flags)
        assert r.returncode == 0, r.stderr[-2000:]
        return log(out)[0]
    base, l2, top = step0(), step0("--align_metric", "l2"), step0("--align_layers", "top")
    every, extra, elbo = step0("--align_positions", "all"), step0("--extra_ce"), step0("--loss_norm", "elbo")
    n = len(base["align_per_layer"])
    assert n == 3 and base["align_loss"] == pytest.approx(1 - sum(base["align_per_layer"]) / n, abs=1e-6)
    assert l2["align_loss"] == pytest.approx(sum(l2["align_per_layer"]) / n, abs=1e-6)
    assert l2["align_per_layer"] != base["align_per_layer"] and all(v > 0 for v in l2["align_per_layer"])
    assert top["align_per_layer"] == pytest.approx(base["align_per_layer"][2 * n // 3:], abs=1e-6)  # the last third
    assert every["align_per_layer"] != pytest.approx(base["align_per_layer"], abs=1e-4)
    for rec in (l2, top, every):
        assert rec["diff_loss"] == base["diff_loss"]  # the same masks and the same denoising loss
    assert extra["diff_loss"] > base["diff_loss"] and elbo["diff_loss"] != pytest.approx(base["diff_loss"], abs=1e-3)
    assert extra["align_per_layer"] == base["align_per_layer"]  # the alignment term is untouched


def test_snapshots_and_a_block_student(world, tmp_path):
    """--snapshots 1,3: the weights after 1 and 3 steps in step-1, step-3 (step-3 equal to the run's last weights),
    each with the seconds trained so far; λ = 0 trains a block DLM too (BD3-LM's loss), under bf16 autocast."""
    out = tmp_path / "run"
    r = run(*common(world, out, "--max_iters", "3", "--lambda_align", "0", "--snapshots", "1,3",
                    "--eval_interval", "5"))
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = (json.loads((out / f"step-{n}" / "snapshot.json").read_text()) for n in (1, 3))
    assert a["step"] == 1 and b["step"] == 3 and 0 < a["train_seconds"] < b["train_seconds"]
    last, snap = (Qwen3.from_pretrained(d) for d in (out, out / "step-3"))
    assert all(torch.equal(x, y) for x, y in zip(last.state_dict().values(), snap.state_dict().values()))
    assert not torch.equal(Qwen3.from_pretrained(out / "step-1").lm_head.weight, last.lm_head.weight)
    convert.convert(world / "ar", tmp_path / "block", "block", 4, shift=True)
    r = run("--init", tmp_path / "block", "--data", world / "data", "--out_dir", tmp_path / "b", *SMALL,
            "--max_iters", "2", "--lambda_align", "0", "--autocast", "bf16")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "b" / "results.json").read_text())["steps"] == 2
    r = run("--init", tmp_path / "block", "--data", world / "data", "--out_dir", tmp_path / "c", *SMALL,
            "--max_iters", "1")
    assert r.returncode == 1 and "is not a bidirectional DLM" in r.stderr  # λ > 0 needs the bidirectional student
