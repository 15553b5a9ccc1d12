"""
REPR-ALIGN: train a masked-diffusion LM converted from an AR model while aligning its hidden states with
the frozen AR model's (docs/methods.md §2).

    python align.py --init out/dlm-tiny --data data/stdlib --out_dir out/align            # λ = 10
    python align.py --init out/dlm-tiny --data data/stdlib --out_dir out/ar-ft --lambda_align 0

Per step, for a batch x0 of clean sequences:
    xt, M, t  = corrupt(x0)                       t ~ U(eps, 1-eps), each maskable token masked w.p. t
    L_diff    = CE of x0 at the masked positions M, read from the student (bidirectional) on xt
    h_s       = the student's hidden states on xt;  h_t = the teacher's (causal, no grad) on CLEAN x0
    L_align   = 1 - mean over (layers ℓ, positions i ∈ S) of cos(h_s[ℓ, i], h_t[ℓ, i])
    L         = L_diff + λ · L_align
S: the positions that carry the denoising loss (shift: i-1 for masked i; no shift: i) or all (ablation).

The loss is callable from other code with named parameters (no argparse namespace):
    xt, masked, t = diffusion.corrupt(x0, mask_token_id, shift, generator)
    loss, stats = align.loss_step(student, teacher, x0, xt, masked, t, layers=range(n), lambda_align=10.0)
    l_align, per_layer = align.repr_align_loss(h_s, h_t, positions, layers=layers, metric="cos")

What is notable here:
- λ = 0 is the "AR fine-tuning" baseline: the teacher never runs in training, so a step costs what a plain
  masked-diffusion step costs. It is loaded once at start, only to record its hidden states on the
  evaluation batches (for the cosines below), and freed before the first step.
- Frozen tensors (--freeze) are shared: the teacher's frozen parameters are the student's own tensor
  objects, checked equal once at start, so the teacher costs only its unfrozen part. The published recipe
  freezes embed,lm_head; with tied embeddings (Qwen3 up to 4B, the tiny teacher) these are ONE matrix, so
  freezing either freezes both, and the mask token's embedding row stays as convert.py left it. Under --fsdp
  the student is sharded and the teacher whole: it keeps its own copy of the frozen tensors.
- Evaluation (every --eval_interval steps; checkpoints every --ckpt_interval, separately) scores every run on
  the same batches with the same masks (the seed is fixed, not --seed): masked-token accuracy and CE at mask
  ratios 0.15/0.5/0.9, the negative ELBO, and per hidden state the cosine between student and teacher at the
  aligned positions S of a fixed 0.5-ratio corruption (val_cos; for λ = 0 runs too), whatever --align_layers is.
"""
import contextlib
from pathlib import Path

import torch
import torch.nn.functional as F

import cli
import data
import diffusion
import tasks
import training

p = cli.parser(__doc__)
p.add_argument("--init", default="out/dlm-tiny", help="the student: a bidirectional DLM checkpoint (convert.py)")
p.add_argument("--teacher", default=None, help="the AR checkpoint (default: the student's config.converted_from)")
p.add_argument("--data", default="data/stdlib", help="a directory prepared by data.py")
p.add_argument("--out_dir", default="out/align", help="checkpoints, log.jsonl and results.json go here")
p.add_argument("--scratch", action="store_true", help="baseline: random weights of the --init shape (init_weights)")
p.add_argument("--lambda_align", type=float, default=10.0, help="λ; 0 = the AR fine-tuning baseline (no teacher)")
p.add_argument("--loss_norm", default="mean", choices=diffusion.NORMS, help="mean CE over masked tokens, or the ELBO")
p.add_argument("--eps", type=float, default=1 / 500, help="t ~ U(eps, 1-eps)")
p.add_argument("--align_layers", default="all",
               help="all | mid (middle third) | top (last third) | indices, e.g. 0,3,-1")
p.add_argument("--align_positions", default="masked", choices=["masked", "all"],
               help="masked: the rows that carry the denoising loss; all: every position")
p.add_argument("--align_metric", default="cos", choices=["cos", "l2"], help="l2: mean over (ℓ, i) of |h_s - h_t|^2 / C")
p.add_argument("--extra_ce", action="store_true",
               help="add the public code's exp(-CE)·CE per masked token (detached weight)")
p.add_argument("--freeze", default="", help="comma list of embed,mlp,attn,lm_head (published: embed,lm_head)")
p.add_argument("--loss_after", default=None, metavar="TEXT",
               help="mask only the tokens after TEXT in their own document (one token; the task world's ' ='): an "
               "answer-only loss, on windows that begin at a document's start")
tasks.add_eval_args(p, "threshold 0.9")
training.add_loop_args(p, frozen="the AR teacher", max_iters=200, batch_size=8, seq_len=256, lr=1e-3, min_lr=1e-4,
                       warmup=10, eval_interval=50, eval_batches=8)
p.add_argument("--ckpt_interval", type=int, default=50, help="checkpoint every N steps (and at the last step); "
               "independent of --eval_interval")
p.add_argument("--samples", type=int, default=3, help="diffusion samples printed at the end")
p.add_argument("--sample_len", type=int, default=64, help="tokens per printed sample")

COS_RATIO = 0.5  # the mask ratio of the val_cos corruption
NO_ROWS = (torch.tensor([], dtype=torch.long),) * 2  # rows=NO_ROWS: a forward for its hidden states, lm_head on none


def share_frozen(student, teacher):
    """Make every frozen student tensor the teacher's too (checked equal first): no second copy in memory. A teacher
    held in another dtype than the student (--frozen_dtype bfloat16) keeps its own copy: one module cannot mix them."""
    if teacher.lm_head.weight.dtype != student.lm_head.weight.dtype:
        return teacher
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


def repr_align_loss(student_hidden, teacher_hidden, positions, *, layers, metric="cos"):
    """-> (L_align, per-layer values (len(layers),)). student_hidden, teacher_hidden: lists of (B, T, C) hidden
    states (Hugging Face's output_hidden_states); positions: (B, T) bool, the aligned positions S.
    cos: per layer the mean over i ∈ S of cos(h_s, h_t); L_align = 1 - their mean (every layer has |S| terms).
    l2:  per layer the mean over i ∈ S of |h_s - h_t|^2 / C; L_align = their mean."""
    if metric not in ("cos", "l2"):
        raise ValueError(f"metric must be 'cos' or 'l2', got {metric!r}")
    n = positions.sum().clamp(min=1)
    per_layer = []
    for l in layers:
        a, b = student_hidden[l][positions].float(), teacher_hidden[l][positions].float()  # (|S|, C)
        if metric == "cos":
            per_layer.append(F.cosine_similarity(a, b, dim=-1).sum() / n)  # cos = a·b / (|a| |b|)
        else:
            per_layer.append((a - b).pow(2).mean(-1).sum() / n)  # |a - b|^2 / C
    per_layer = torch.stack(per_layer)
    return (1 - per_layer.mean() if metric == "cos" else per_layer.mean()), per_layer


def loss_step(student, teacher, x0, xt, masked, t, *, layers, lambda_align=10.0, metric="cos", norm="mean",
              positions="masked", extra_ce=False):
    """One micro-batch of clean sequences x0 (B, T) and its corruption (diffusion.corrupt: xt, masked, t) -> (L,
    stats): L = L_diff + lambda_align · L_align (repr_align_loss over `layers`, at the `positions` "masked" or "all").
    teacher=None: the λ = 0 baseline, the diffusion loss alone (no hidden states kept, nothing run twice)."""
    if teacher is None and lambda_align > 0:
        raise ValueError("loss_step: lambda_align > 0 needs a teacher")
    c = student.config
    if teacher is None:
        l_diff = diffusion.diffusion_loss(student, x0, xt, masked, t, norm, extra_ce=extra_ce)
        return l_diff, dict(diff_loss=l_diff)
    l_diff, hs = diffusion.diffusion_loss(student, x0, xt, masked, t, norm, extra_ce=extra_ce,
                                          output_hidden_states=True)
    with torch.no_grad():
        # the clean x0, same positions; no rows for lm_head: the hidden states alone
        _, ht = teacher(x0, "causal", rows=NO_ROWS, output_hidden_states=True)
    l_align, per_layer = repr_align_loss(hs, ht, align_rows(masked, c.shift, positions), layers=layers, metric=metric)
    return l_diff + lambda_align * l_align, dict(diff_loss=l_diff, align_loss=l_align, align_per_layer=per_layer)


class CosineEval:
    """Per hidden state ℓ, the mean over the evaluation rows of cos(h_s[ℓ, i], h_t[ℓ, i]): the student on a
    fixed corruption of each evaluation batch at mask ratio COS_RATIO (seed diffusion.EVAL_SEED + 1), the teacher on the
    clean batch, at the positions S that carry the denoising loss. The teacher is run once, here: its states
    at S are kept (|S| ≈ COS_RATIO·B·T rows × (n_layers + 1) × C floats per batch), so λ = 0 runs can free it."""

    @torch.no_grad()
    def __init__(self, teacher, student_config, batches, ctx=None):
        c, g = student_config, torch.Generator().manual_seed(diffusion.EVAL_SEED + 1)
        self.ctx, self.items = ctx or contextlib.nullcontext(), []
        for x0 in batches:
            xt, masked, _ = diffusion.corrupt(x0, c.mask_token_id, c.shift, g, t=COS_RATIO)
            rows = align_rows(masked, c.shift, "masked")
            with self.ctx:
                _, ht = teacher(x0, "causal", rows=NO_ROWS, output_hidden_states=True)
            self.items.append((xt, rows, [h[rows].float() for h in ht]))  # per layer (|S|, C)

    @torch.no_grad()
    def __call__(self, student):
        """-> (n_layers + 1,) the mean cosine per hidden state, over all rows of all evaluation batches."""
        student.eval()
        total, n = 0, 0
        for xt, rows, ht in self.items:
            with self.ctx:
                _, hs = student(xt, rows=NO_ROWS, output_hidden_states=True)
            total = total + torch.stack([F.cosine_similarity(h[rows].float(), t, dim=-1).sum() for h, t in zip(hs, ht)])
            n += rows.sum().item()
        student.train()
        return total / max(n, 1)


def evaluate(model, batches, ctx, cosines=None):
    """On fixed batches with fixed masks (diffusion.fixed_mask_eval, diffusion.EVAL_SEED): masked-token accuracy and
    mean CE at the mask ratios diffusion.EVAL_RATIOS, and a one-draw negative ELBO (nats/token; t ~ U(ε, 1-ε));
    with a CosineEval, also val_cos: the per-hidden-state cosines to the teacher."""
    model.eval()
    out = diffusion.fixed_mask_eval(model, batches, ctx)
    model.train()
    return out if cosines is None else dict(out, val_cos=cosines(model).tolist())


def print_samples(model, tok, val_data, args, device):
    try:
        import sample
    except ImportError as e:
        print(f"(no samples: sample.py could not be imported: {e})")
        return
    model.eval()
    prompts = data.code_prompts(val_data, tok, args.samples, 32)
    n, bl = args.sample_len, 32 if args.sample_len % 32 == 0 else args.sample_len
    g = torch.Generator(device).manual_seed(args.seed)
    gen = sample.diffusion_generate(model, prompts, n, bl, n, eos_id=tok.end_ids(model.config),  # any end id
                                    vocab_limit=tok.vocab_size, generator=g)
    for b, ids in enumerate(prompts):
        seq = gen.sequence(b)[:len(ids) + int(gen.row_tokens[b])].tolist()  # up to and with its first end token
        print(f"--- prompt: {tok.decode(ids)!r}\n{tok.decode(seq)}")
    print(f"(masked diffusion, {n} tokens, block {bl}, {n} steps: {gen.nfe} forwards)")


if __name__ == "__main__":
    args = training.parse_loop_args(p)
    if not 0 <= args.eps < 0.5 or args.lambda_align < 0 or args.ckpt_interval <= 0:
        p.error("need 0 <= --eps < 0.5, --lambda_align >= 0 and --ckpt_interval > 0")
    task_items = tasks.eval_items(p, args)
    freeze = [g for g in args.freeze.split(",") if g]
    if bad := set(freeze) - {"embed", "mlp", "attn", "lm_head"}:
        p.error(f"--freeze: unknown groups {sorted(bad)}; choose from embed, mlp, attn, lm_head")
    run = training.Run(args, "align")  # its generator draws the batches, the t's and the masks
    device, ctx = run.device, run.ctx
    train_data, val_data = run.load_splits(args.data)

    # ---- the student, its frozen groups, and the teacher -----------------------------------------
    def fresh():
        student = training.load_model(args.init, device, "align: --init")
        return student.init_weights(args.seed) if args.scratch else student

    student = run.start(fresh)
    training.require_dlm(student.config, run.out_dir if args.resume else args.init, "align", "bidirectional")
    tok = training.load_tokenizer(args.data, student.config)
    student.freeze(freeze)
    if student.config.tie_word_embeddings and ({"embed", "lm_head"} & set(freeze)):
        print("tied embeddings: freezing embed or lm_head freezes both (the output head IS the embedding matrix)")
    n_frozen = sum(q.numel() for q in student.parameters() if not q.requires_grad)
    sep_id, starts = training.answers_only(args.loss_after, tok, train_data, val_data, args.seq_len, "align")
    val_batches = data.eval_batches(val_data, args.batch_size, args.seq_len, args.eval_batches, device,
                                    starts=starts["val"])
    teacher_path, teacher, cosines = args.teacher or student.config.converted_from, None, None
    load_teacher = lambda: training.load_teacher(teacher_path, student, device, "align", same_shapes=True,
                                                 dtype=run.frozen_dtype)
    if args.lambda_align > 0:
        teacher = load_teacher()
        if not args.fsdp:  # a sharded student's tensors are not whole: the teacher keeps its own copy
            teacher = share_frozen(student, teacher)
        cosines = CosineEval(teacher, student.config, val_batches, ctx)
        shared = n_frozen if teacher.lm_head.weight.dtype == student.lm_head.weight.dtype and not args.fsdp else 0
        print(f"teacher: {teacher_path} (causal, frozen, {str(teacher.lm_head.weight.dtype).removeprefix('torch.')}); "
              f"it shares the student's {shared / 1e6:.2f}M frozen parameters and holds "
              f"{(teacher.num_params() - shared) / 1e6:.2f}M of its own")
    elif args.teacher or (teacher_path and Path(teacher_path).is_dir()):
        cosines = CosineEval(load_teacher(), student.config, val_batches, ctx)
        print(f"λ = 0: AR fine-tuning baseline; the teacher {teacher_path} was run once on the evaluation batches "
              f"(for val_cos) and freed: no teacher in training")
    else:
        print(f"λ = 0: AR fine-tuning baseline, no teacher (none found at {teacher_path}: no val_cos)")
    layers = parse_layers(args.align_layers, student.config.num_hidden_layers + 1)
    student = run.train(student, compile_too=[teacher] if teacher is not None else [])
    print(f"student: {student.num_params() / 1e6:.2f}M parameters ({n_frozen / 1e6:.2f}M frozen: {freeze or 'none'}), "
          f"shift={student.config.shift}, mask token {student.config.mask_token_id}{', from scratch' * args.scratch}; "
          f"aligning hidden states {layers if args.lambda_align > 0 else '-'}; device {device}")

    # ---- training --------------------------------------------------------------------------------
    c, fpt = student.config, training.flops_per_token(student, args.seq_len, forward_only=teacher)

    def draw():  # a batch of clean windows and its corruption (answer-only: only the answers may be masked)
        x0 = data.get_batch(train_data, args.batch_size, args.seq_len, device, run.gen, starts=starts["train"])
        answers = None if sep_id is None else data.after_separator(x0, sep_id, tok.eos_id)
        return x0, *diffusion.corrupt(x0, c.mask_token_id, c.shift, run.gen, args.eps, where=answers)

    last_eval = {}
    for step in run.steps():
        for x0, xt, masked, t in run.micro_batches(draw):
            with ctx:
                loss, stats = loss_step(student, teacher, x0, xt, masked, t, layers=layers,
                                        lambda_align=args.lambda_align, metric=args.align_metric,
                                        norm=args.loss_norm, positions=args.align_positions, extra_ce=args.extra_ce)
            run.backward(loss, stats, tokens=x0.numel(), flops=fpt * x0.numel())
        rec = run.update()
        if run.eval_due():
            last_eval = dict(step=step, **evaluate(student, val_batches, ctx, cosines))
            if task_items:
                with ctx:
                    last_eval.update(tasks.log_record(student, tok, task_items))
            rec.update({k: v for k, v in last_eval.items() if k != "step"})
        if run.save_due(args.ckpt_interval):
            run.save(student, tok)
        run.log(rec, diff=f"{rec['diff_loss']:.3f}", align=f"{rec.get('align_loss', 0):.3f}",
                val_acc=f"{last_eval.get('val_acc@0.5', float('nan')):.3f}", tok_s=f"{rec['tokens_per_s']:.0f}")

    # ---- results and samples ---------------------------------------------------------------------
    final = last_eval if last_eval.get("step") == args.max_iters - 1 else evaluate(student, val_batches, ctx, cosines)
    final = {k: v for k, v in final.items() if k != "step"}
    print("\nfinal eval: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items() if k != "val_cos"))
    if "val_cos" in final:
        print("cosine to the teacher per hidden state: " + " ".join(f"{v:.3f}" for v in final["val_cos"]))
    run.results(dict(**final, steps=args.max_iters, lambda_align=args.lambda_align, freeze=freeze,
                     scratch=args.scratch, **run.timing(), params=student.num_params(),
                     trainable_params=student.num_params() - n_frozen,
                     tokens_seen=args.max_iters * args.batch_size * args.seq_len * args.grad_accum))
    if args.samples > 0:
        print_samples(student, tok, val_data, args, device)
