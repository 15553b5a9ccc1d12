"""
REPR-ALIGN: train a masked-diffusion LM converted from an AR model while aligning its hidden states with
the frozen AR model's (methods.md §2).

    python align.py --init out/dlm-tiny --data data/stdlib --out_dir out/align            # λ = 10
    python align.py --init out/dlm-tiny --data data/stdlib --out_dir out/ar-ft --lambda_align 0

Per step, for a batch x0 of clean sequences:
    xt, M, t  = corrupt(x0)                       t ~ U(eps, 1-eps), each maskable token masked w.p. t
    L_diff    = CE of x0 at the masked positions M, read from the student (bidirectional) on xt
    h_s       = the student's hidden states on xt;  h_t = the teacher's (causal, no grad) on CLEAN x0
    L_align   = 1 - mean over (layers ℓ, positions i ∈ S) of cos(h_s[ℓ, i], h_t[ℓ, i])
    L         = L_diff + λ · L_align
S: the positions that carry the denoising loss (shift: i-1 for masked i; no shift: i) or all (ablation).

What is notable here:
- λ = 0 is the "AR fine-tuning" baseline: the teacher is then never loaded nor run.
- Frozen tensors (--freeze) are shared: the teacher's frozen parameters are the student's own tensor
  objects, checked equal once at start, so the teacher costs only its unfrozen part.
- Evaluation scores every checkpoint (and every run: the seed is fixed, not --seed) on the same batches
  with the same masks: masked-token accuracy and CE at mask ratios 0.15/0.5/0.9, and the negative ELBO.
"""
import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import data
import diffusion
import training
from model import Qwen3

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--init", default="out/dlm-tiny", help="the student: a bidirectional DLM checkpoint (convert.py)")
p.add_argument("--teacher", default=None, help="the AR checkpoint (default: the student's config.converted_from)")
p.add_argument("--data", default="data/stdlib", help="a directory prepared by data.py")
p.add_argument("--out_dir", default="out/align")
p.add_argument("--scratch", action="store_true", help="baseline: random weights of the --init shape (init_weights)")
p.add_argument("--lambda_align", type=float, default=10.0, help="λ; 0 = the AR fine-tuning baseline (no teacher)")
p.add_argument("--loss_norm", default="mean", choices=diffusion.NORMS, help="mean CE over masked tokens, or the ELBO")
p.add_argument("--eps", type=float, default=1 / 500, help="t ~ U(eps, 1-eps)")
p.add_argument("--align_layers", default="all", help="all | mid (middle third) | top (last third) | indices, e.g. 0,3,-1")
p.add_argument("--align_positions", default="masked", choices=["masked", "all"])
p.add_argument("--align_metric", default="cos", choices=["cos", "l2"], help="l2: mean over (ℓ, i) of |h_s - h_t|^2 / C")
p.add_argument("--extra_ce", action="store_true", help="add the public code's exp(-CE)·CE per masked token (detached weight)")
p.add_argument("--freeze", default="", help="comma list of embed,mlp,attn,lm_head")
training.add_loop_args(p, max_iters=200, batch_size=8, seq_len=256, lr=1e-3, min_lr=1e-4, warmup=10,
                       eval_interval=50, eval_batches=8)
p.add_argument("--samples", type=int, default=3, help="diffusion samples printed at the end")
p.add_argument("--sample_len", type=int, default=64)

EVAL_RATIOS, EVAL_SEED, ELBO_EPS = (0.15, 0.5, 0.9), 1234, 1e-3


def check_student(config, where):
    if config.attn != "bidirectional" or config.mask_token_id is None or config.shift is None:
        raise SystemExit(f"align: {where} is not a bidirectional DLM (attn={config.attn!r}, mask_token_id="
                         f"{config.mask_token_id}, shift={config.shift}); make one with: "
                         f"python convert.py --ar AR_DIR --out_dir DLM_DIR --attn bidirectional")


def load_teacher(path, student, device="cpu"):
    """The frozen AR teacher (eval mode, no gradients). Each frozen student tensor is checked equal to the
    teacher's and then shared: the teacher holds the student's own Parameter object, not a copy."""
    if path is None:
        raise SystemExit("align: no --teacher given and the student's config has no converted_from")
    teacher = training.load_model(path, device, "align: teacher").requires_grad_(False).eval()
    shapes = lambda m: {k: v.shape for k, v in m.state_dict().items()}
    if shapes(teacher) != shapes(student) or teacher.config.tie_word_embeddings != student.config.tie_word_embeddings:
        raise SystemExit(f"align: the teacher {path} and the student have different shapes")
    return share_frozen(student, teacher)


def share_frozen(student, teacher):
    """Make every frozen student tensor the teacher's too (checked equal first): no second copy in memory."""
    for name, param in student.named_parameters():
        if not param.requires_grad:
            if not torch.equal(param, teacher.get_parameter(name)):
                raise SystemExit(f"align: frozen tensor {name} differs between student and teacher, so it cannot be "
                                 f"shared (a --scratch student?): freeze nothing, or start from the converted weights")
            module, _, leaf = name.rpartition(".")
            setattr(teacher.get_submodule(module), leaf, param)
    if teacher.config.tie_word_embeddings:
        teacher.lm_head.weight = teacher.model.embed_tokens.weight
    return teacher


def parse_layers(spec, n):
    """Indices among the n = num_hidden_layers + 1 hidden states (0: the embedding output, n-1: the final norm)."""
    named = {"all": range(n), "mid": range(n // 3, 2 * n // 3), "top": range(2 * n // 3, n)}
    if spec in named:
        return list(named[spec])
    try:
        idx = [int(s) for s in spec.split(",")]
    except ValueError:
        raise SystemExit(f"align: --align_layers {spec!r}: expected all, mid, top or comma-separated integers")
    if any(not -n <= i < n for i in idx):
        raise SystemExit(f"align: --align_layers {spec!r}: the model has hidden states 0..{n - 1}")
    return sorted({i % n for i in idx})


def align_rows(masked, shift, mode):
    """(B, T) bool, the positions S: the rows whose output denoises a masked token, or all rows."""
    return diffusion.denoiser_rows(masked, shift) if mode == "masked" else torch.ones_like(masked)


def align_loss(hs, ht, rows, layers, metric="cos"):
    """-> (L_align, per-layer values (len(layers),)). hs, ht: lists of (B, T, C) hidden states; rows: S.
    cos: per layer the mean over i ∈ S of cos(h_s, h_t); L_align = 1 - their mean (every layer has |S| terms).
    l2:  per layer the mean over i ∈ S of |h_s - h_t|^2 / C; L_align = their mean."""
    n = rows.sum().clamp(min=1)
    per_layer = []
    for l in layers:
        a, b = hs[l][rows].float(), ht[l][rows].float()  # (|S|, C)
        if metric == "cos":
            per_layer.append(F.cosine_similarity(a, b, dim=-1).sum() / n)  # cos = a·b / (|a| |b|)
        else:
            per_layer.append((a - b).pow(2).mean(-1).sum() / n)  # |a - b|^2 / C
    per_layer = torch.stack(per_layer)
    return (1 - per_layer.mean() if metric == "cos" else per_layer.mean()), per_layer


def loss_step(student, teacher, x0, gen, args, layers):
    """One micro-batch -> (L, stats). teacher=None (λ = 0): the diffusion loss alone, no hidden states kept."""
    c = student.config
    xt, masked, t = diffusion.corrupt(x0, c.mask_token_id, c.shift, gen, args.eps)
    if teacher is None:
        l_diff = diffusion.diffusion_loss(student, x0, xt, masked, t, args.loss_norm, extra_ce=args.extra_ce)
        return l_diff, dict(diff_loss=l_diff)
    l_diff, hs = diffusion.diffusion_loss(student, x0, xt, masked, t, args.loss_norm, extra_ce=args.extra_ce,
                                          output_hidden_states=True)
    with torch.no_grad():
        _, ht = teacher.model(x0, "causal", None, True)  # the clean x0, same positions; no lm_head needed
    l_align, per_layer = align_loss(hs, ht, align_rows(masked, c.shift, args.align_positions), layers,
                                    args.align_metric)
    return l_diff + args.lambda_align * l_align, dict(diff_loss=l_diff, align_loss=l_align, align_per_layer=per_layer)


def evaluate(model, batches, ctx):
    """On fixed batches with fixed masks (diffusion.fixed_mask_eval, seed EVAL_SEED): masked-token accuracy and
    mean CE at the mask ratios EVAL_RATIOS, and a one-draw negative ELBO (nats/token; t ~ U(ε, 1-ε))."""
    model.eval()
    out = diffusion.fixed_mask_eval(model, batches, ctx, EVAL_RATIOS, EVAL_SEED, ELBO_EPS)
    model.train()
    return out


def flops_per_token(student, teacher, seq_len):
    """Training FLOPs per token: the student's (6 per weight + attention), less 2 per frozen matrix weight
    (no weight gradient), plus the teacher's forward (a third of its training count)."""
    tied = student.config.tie_word_embeddings
    frozen = sum(q.numel() for k, q in student.named_parameters() if not q.requires_grad and (tied or "embed" not in k))
    return student.flops_per_token(seq_len) - 2 * frozen + (teacher.flops_per_token(seq_len) / 3 if teacher else 0)


def print_samples(model, tok, val_data, args, device):
    try:
        import sample
    except ImportError as e:
        print(f"(no samples: sample.py could not be imported: {e})")
        return
    model.eval()
    prompts = data.code_prompts(val_data, tok, args.samples, 32)
    n, bl = args.sample_len, 32 if args.sample_len % 32 == 0 else args.sample_len
    gen = sample.diffusion_generate(model, prompts, n, bl, n, eos_id=tok.eos_id, vocab_limit=tok.vocab_size,
                                    generator=torch.Generator(device).manual_seed(args.seed))
    for b, ids in enumerate(prompts):
        seq = gen.sequence(b).tolist()
        if tok.eos_id in seq[len(ids):]:
            seq = seq[:seq.index(tok.eos_id, len(ids)) + 1]
        print(f"--- prompt: {tok.decode(ids)!r}\n{tok.decode(seq)}")
    print(f"(masked diffusion, {n} tokens, block {bl}, {n} steps: {gen.nfe} forwards)")


if __name__ == "__main__":
    args = training.parse_loop_args(p)
    if not 0 <= args.eps < 0.5 or args.lambda_align < 0:
        p.error("need 0 <= --eps < 0.5 and --lambda_align >= 0")
    freeze = [g for g in args.freeze.split(",") if g]
    if bad := set(freeze) - {"embed", "mlp", "attn", "lm_head"}:
        p.error(f"--freeze: unknown groups {sorted(bad)}; choose from embed, mlp, attn, lm_head")
    device, ctx = training.setup(args.device, args.seed)
    out_dir = Path(args.out_dir)
    train_data, val_data = training.load_splits(args.data, "align")
    gen = torch.Generator().manual_seed(args.seed)  # draws the batches, the t's and the masks

    # ---- the student, its frozen groups, and the teacher -----------------------------------------
    def fresh():
        try:
            student = Qwen3.from_pretrained(args.init, device=device, dtype=torch.float32)
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(f"align: {e}")
        return student.init_weights(args.seed) if args.scratch else student

    student, state, start = training.resume_or_start(out_dir, args.resume, device, gen, fresh)
    check_student(student.config, out_dir if args.resume else args.init)
    tok = training.load_tokenizer(args.data, student.config)
    student.freeze(freeze)
    if student.config.tie_word_embeddings and ({"embed", "lm_head"} & set(freeze)):
        print("tied embeddings: freezing embed or lm_head freezes both (the output head IS the embedding matrix)")
    n_frozen = sum(q.numel() for q in student.parameters() if not q.requires_grad)
    teacher = None
    if args.lambda_align > 0:
        teacher = load_teacher(args.teacher or student.config.converted_from, student, device)
        print(f"teacher: {args.teacher or student.config.converted_from} (causal, frozen); it shares the student's "
              f"{n_frozen / 1e6:.2f}M frozen parameters and holds {(teacher.num_params() - n_frozen) / 1e6:.2f}M of its own")
    else:
        print("λ = 0: AR fine-tuning baseline, no teacher")
    layers = parse_layers(args.align_layers, student.config.num_hidden_layers + 1)
    student.model.gradient_checkpointing = args.grad_checkpoint
    opt = training.optimizer(student, args, device, state)
    if args.compile:  # in place: parameter names, and so checkpoints, are unchanged
        student.model.compile()
        if teacher is not None:
            teacher.model.compile()
    val_batches = data.eval_batches(val_data, args.batch_size, args.seq_len, args.eval_batches, device)
    log = training.Log(out_dir, args.resume)
    print(f"student: {student.num_params() / 1e6:.2f}M parameters ({n_frozen / 1e6:.2f}M frozen: {freeze or 'none'}), "
          f"shift={student.config.shift}, mask token {student.config.mask_token_id}{', from scratch' * args.scratch}; "
          f"aligning hidden states {layers if args.lambda_align > 0 else '-'}; device {device}")

    # ---- training --------------------------------------------------------------------------------
    tokens_per_step = args.batch_size * args.seq_len * args.grad_accum
    fpt, peak = flops_per_token(student, teacher, args.seq_len), training.peak_flops(device)
    bar = tqdm(range(start, args.max_iters), initial=start, total=args.max_iters, desc="align")
    t, step_times, last_eval, t_start = time.time(), [], {}, time.time()
    for step in bar:
        lr = training.set_lr(opt, step, args)
        stats = {}
        for _ in range(args.grad_accum):
            x0 = data.get_batch(train_data, args.batch_size, args.seq_len, device, gen)
            with ctx:
                loss, s = loss_step(student, teacher, x0, gen, args, layers)
            (loss / args.grad_accum).backward()
            for k, v in s.items():
                stats[k] = stats.get(k, 0) + v.detach() / args.grad_accum
        training.check_finite(loss, step, out_dir)
        norm = torch.nn.utils.clip_grad_norm_(student.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

        dt, t = time.time() - t, time.time()
        step_times.append(dt)
        rec = dict(step=step, loss=loss.item(), **{k: v.tolist() for k, v in stats.items()}, lr=lr,
                   grad_norm=norm.item(), tokens_per_s=tokens_per_step / dt)
        if peak:
            rec["mfu"] = fpt * rec["tokens_per_s"] / peak
        if step % args.eval_interval == 0 or step == args.max_iters - 1:
            last_eval = dict(step=step, **evaluate(student, val_batches, ctx))
            rec.update({k: v for k, v in last_eval.items() if k != "step"})
            training.save_checkpoint(out_dir, student, tok, opt, step, gen, extra=vars(args))
            t = time.time()  # evaluation and saving are not training time
        log(**rec)
        bar.set_postfix(diff=f"{rec['diff_loss']:.3f}", align=f"{rec.get('align_loss', 0):.3f}",
                        val_acc=f"{last_eval.get('val_acc@0.5', float('nan')):.3f}", tok_s=f"{rec['tokens_per_s']:.0f}")

    # ---- results and samples ---------------------------------------------------------------------
    final = last_eval if last_eval.get("step") == args.max_iters - 1 else evaluate(student, val_batches, ctx)
    final = {k: v for k, v in final.items() if k != "step"}
    print("\nfinal eval: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
    results = dict(**final, steps=args.max_iters, lambda_align=args.lambda_align, freeze=freeze, scratch=args.scratch,
                   step_seconds=float(np.mean(step_times)) if step_times else None,
                   step_seconds_median=float(np.median(step_times)) if step_times else None,
                   train_seconds_this_run=time.time() - t_start, params=student.num_params(),
                   trainable_params=student.num_params() - n_frozen, tokens_seen=args.max_iters * tokens_per_step)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")  # also: "this run finished"
    if args.samples > 0:
        print_samples(student, tok, val_data, args, device)
