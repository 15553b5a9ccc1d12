"""
REPR-ALIGN: train a masked-diffusion LM converted from an AR model while aligning its hidden states with the frozen
AR model's (docs/methods.md §2).

    python align.py --init out/dlm-tiny --data data/stdlib --out_dir out/align            # λ = 10
    python align.py --init out/dlm-tiny --data data/stdlib --out_dir out/ar-ft --lambda_align 0

Notes on the design: docs/methods.md, "align.py" under §8.
"""
import contextlib
from pathlib import Path

import torch
import torch.nn.functional as F

import diffusion
from model import packed_mask
from lib import cli
from lib import data
from lib import runner
from lib import training

p = cli.parser(__doc__)
p.add_argument("--init", default="out/dlm-tiny", help="the student: a bidirectional DLM checkpoint (convert.py)")
p.add_argument("--teacher", default=None, help="the AR checkpoint (default: the student's config.converted_from)")
p.add_argument("--data", default="data/stdlib", help="a directory prepared by lib/corpus.py")
p.add_argument("--out_dir", default="out/align", help="checkpoints, log.jsonl and results.json go here")
p.add_argument("--scratch", action="store_true", help="baseline: random weights of the --init shape (init_weights)")
p.add_argument("--lambda_align", type=float, default=10.0, help="λ; 0 = the AR fine-tuning baseline (no teacher)")
p.add_argument("--loss_norm", default="mean", choices=diffusion.NORMS, help="mean CE over masked tokens, or the ELBO")
p.add_argument("--eps", type=float, default=1 / 500, help="t ~ U(eps, 1-eps)")
p.add_argument("--align_layers", default="all", help="all | mid (middle third) | top (last third) | e.g. 0,3,-1")
p.add_argument("--align_positions", default="masked", choices=["masked", "all"], help="S: the denoising rows, or all")
p.add_argument("--align_metric", default="cos", choices=["cos", "l2"], help="l2: mean over (ℓ, i) of |h_s - h_t|^2 / C")
p.add_argument("--extra_ce", action="store_true", help="add the public code's sg(exp(-CE))·CE per masked token")
p.add_argument("--freeze", default="", type=cli.comma_list(choices=("embed", "mlp", "attn", "lm_head"), what="groups"),
               help="comma list of groups (published: embed,lm_head)")
cli.add_loop_args(p, frozen="the AR teacher", tasks="threshold 0.9", answers="chat", max_iters=200, batch_size=8,
                  seq_len=256, lr=1e-3, min_lr=1e-4, warmup=10, eval_interval=50, eval_batches=8)
p.add_argument("--ckpt_interval", type=int, default=50, help="checkpoint every N steps (and at the last step)")
p.add_argument("--samples", type=int, default=3, help="validation prompts continued at the end (by sample.py)")
p.add_argument("--sample_len", type=int, default=64, help="tokens per sample")
p.add_argument("--end_pad", type=int, default=0, metavar="N", help="with --assistant_only: follow each answer shorter "
               "than N tokens with end tokens up to N, trained (LLaDA's SFT: a masked student learns to fill an "
               "answer canvas of N past the answer's end); 0: none")

COS_RATIO = 0.5  # the mask ratio of the val_cos corruption
NO_ROWS = (torch.tensor([], dtype=torch.long),) * 2  # rows=NO_ROWS: a forward for its hidden states, lm_head on none


def parse_layers(spec, n):
    """Indices among the n = num_hidden_layers + 1 hidden states (0: the embedding output, n-1: the final norm)."""
    named = {"all": range(n), "mid": range(n // 3, 2 * n // 3), "top": range(2 * n // 3, n)}
    try:
        idx = named[spec] if spec in named else [int(s) for s in spec.split(",")]
    except ValueError:
        raise SystemExit(f"align: --align_layers {spec!r}: expected all, mid, top or comma-separated integers")
    if any(not -n <= i < n for i in idx):
        raise SystemExit(f"align: --align_layers {spec!r}: the model has hidden states 0..{n - 1}")
    return sorted({i % n for i in idx})


def align_rows(masked, shift, mode):
    """(B, T) bool, the positions S: the rows whose output denoises a masked token, or all rows."""
    return diffusion.denoiser_rows(masked, shift) if mode == "masked" else torch.ones_like(masked)


def repr_align_loss(student_hidden, teacher_hidden, positions, *, layers, metric="cos"):
    """-> (L_align, per-layer values (len(layers),)); hidden states: lists of (B, T, C), positions: (B, T) bool, S.
    cos: L_align = 1 - mean over layers of mean_{i ∈ S} cos(h_s, h_t); l2: mean of mean_{i ∈ S} |h_s - h_t|^2 / C."""
    if metric not in ("cos", "l2"):
        raise ValueError(f"metric must be 'cos' or 'l2', got {metric!r}")
    n = positions.sum().clamp(min=1)
    per_layer = []
    for l in layers:
        a, b = student_hidden[l][positions].float(), teacher_hidden[l][positions].float()  # (|S|, C)
        d = F.cosine_similarity(a, b, dim=-1) if metric == "cos" else (a - b).pow(2).mean(-1)  # a·b/(|a||b|), |a-b|²/C
        per_layer.append(d.sum() / n)
    per_layer = torch.stack(per_layer)
    return (1 - per_layer.mean() if metric == "cos" else per_layer.mean()), per_layer


def loss_step(student, teacher, x0, xt, masked, t, *, layers, lambda_align=10.0, metric="cos", norm="mean",
              positions="masked", extra_ce=False, doc=None, pos=None):
    """x0 (B, T) and its corruption (diffusion.corrupt) -> (L, stats), L = L_diff + lambda_align · L_align (over
    `layers`, at `positions` "masked" or "all"). teacher None: the λ = 0 baseline, the diffusion loss alone.
    doc, pos (B, T): packed rows (data.packed_batch), each conversation read alone by both models."""
    if teacher is None and lambda_align > 0:
        raise ValueError("loss_step: lambda_align > 0 needs a teacher")
    out = diffusion.diffusion_loss(student, x0, xt, masked, t, norm, extra_ce=extra_ce,
                                   output_hidden_states=teacher is not None, doc=doc, pos=pos)
    if teacher is None:
        return out, dict(diff_loss=out)
    l_diff, hs = out
    with torch.no_grad():  # the clean x0, same positions; no rows for lm_head: the hidden states alone
        causal = "causal" if doc is None else packed_mask("causal", doc, pos)
        _, ht = teacher(x0, causal, rows=NO_ROWS, output_hidden_states=True, pos=pos)
    S = align_rows(masked, student.config.shift, positions) & (True if doc is None else doc >= 0)
    l_align, per_layer = repr_align_loss(hs, ht, S, layers=layers, metric=metric)
    return l_diff + lambda_align * l_align, dict(diff_loss=l_diff, align_loss=l_align, align_per_layer=per_layer)


class CosineEval:
    """val_cos: per hidden state ℓ, the mean over the evaluation batches' rows S of cos(h_s[ℓ, i], h_t[ℓ, i]), the
    student on a fixed COS_RATIO corruption, the teacher on the clean batch, run once here (so λ = 0 frees it)."""

    @torch.no_grad()
    def __init__(self, teacher, c, batches, ctx=contextlib.nullcontext()):
        g, self.ctx, self.items = torch.Generator().manual_seed(diffusion.EVAL_SEED + 1), ctx, []
        for x0 in batches:
            xt, masked, _ = diffusion.corrupt(x0, c.mask_token_id, c.shift, g, t=COS_RATIO)
            rows = align_rows(masked, c.shift, "masked")
            with ctx:
                _, ht = teacher(x0, "causal", rows=NO_ROWS, output_hidden_states=True)
            self.items.append((xt, rows, [h[rows].float() for h in ht]))  # per layer (|S|, C)

    @torch.no_grad()
    def __call__(self, student):  # -> (n_layers + 1,)
        total, n = 0, 0
        for xt, rows, ht in self.items:
            with self.ctx:
                _, hs = student(xt, rows=NO_ROWS, output_hidden_states=True)
            total = total + torch.stack([F.cosine_similarity(h[rows].float(), t, dim=-1).sum() for h, t in zip(hs, ht)])
            n += rows.sum().item()
        return total / max(n, 1)


if __name__ == "__main__":
    args = cli.parse_loop_args(p)
    if not 0 <= args.eps < 0.5 or args.lambda_align < 0 or args.ckpt_interval <= 0 or args.end_pad < 0:
        p.error("need 0 <= --eps < 0.5, --lambda_align >= 0, --ckpt_interval > 0 and --end_pad >= 0")
    if args.end_pad and not args.assistant_only:
        p.error("--end_pad pads the answers of packed conversations: pass --assistant_only with it")
    run = training.Run(args, "align")  # its generator draws the batches, the t's and the masks
    device, ctx = run.device, run.ctx
    train_data, val_data = data.load_splits(args.data, "align", seq_len=args.seq_len)

    # ---- the student, its frozen groups, and the teacher -----------------------------------------
    def fresh():
        student = training.load_model(args.init, device, "align: --init")
        return student.init_weights(args.seed) if args.scratch else student

    student = run.start(fresh)
    c = student.config
    training.require_dlm(c, run.out_dir if args.resume else args.init, "align",
                         "bidirectional" if args.lambda_align > 0 else None)  # λ = 0 trains a block DLM too
    tok = training.load_tokenizer(args.data, c)
    training.freeze(student, args.freeze)
    if c.tie_word_embeddings and ({"embed", "lm_head"} & set(args.freeze)):
        print("tied embeddings: freezing embed or lm_head freezes both (the output head IS the embedding matrix)")
    n_frozen = sum(q.numel() for q in student.parameters() if not q.requires_grad)
    answers, starts = data.loss_targets(args, tok, train_data, val_data, args.seq_len, "align")
    val_batches = data.eval_batches(val_data, args.batch_size, args.seq_len, args.eval_batches, device,
                                    starts=starts["val"])
    teacher_path, teacher, cosines = args.teacher or c.converted_from, None, None
    if args.lambda_align > 0 or args.teacher or (teacher_path and Path(teacher_path).is_dir()):
        teacher = training.load_teacher(teacher_path, student, device, "align", same_shapes=True,
                                        dtype=run.frozen_dtype, share=args.lambda_align > 0 and not args.fsdp)
        cosines = CosineEval(teacher, c, val_batches, ctx)
    if args.lambda_align > 0:
        shared = sum(q.numel() for q in teacher.parameters() if any(q is s for s in student.parameters()))
        print(f"teacher: {teacher_path} (causal, frozen, {str(teacher.lm_head.weight.dtype).removeprefix('torch.')}); "
              f"it shares the student's {shared / 1e6:.2f}M frozen parameters and holds "
              f"{(teacher.num_params() - shared) / 1e6:.2f}M of its own")
    else:
        teacher = None  # λ = 0: the teacher was run once, for val_cos, and is freed
        print(f"λ = 0: AR fine-tuning baseline, no teacher in training "
              f"({'val_cos from ' + teacher_path if cosines else f'none found at {teacher_path}: no val_cos'})")
    layers = parse_layers(args.align_layers, c.num_hidden_layers + 1)
    student = run.prepare(student, compile_too=[teacher] if teacher is not None else [])
    print(f"student: {student.num_params() / 1e6:.2f}M parameters ({n_frozen / 1e6:.2f}M frozen: {args.freeze}), shift="
          f"{c.shift}{', from scratch' * args.scratch}; aligning {layers if args.lambda_align else '-'}; {device}")

    def evaluate():  # fixed masks (diffusion.EVAL_SEED): accuracy and CE per mask ratio, -ELBO; val_cos
        student.eval()
        out = diffusion.fixed_mask_eval(student, val_batches, ctx)
        out = out if cosines is None else dict(out, val_cos=cosines(student).tolist())
        student.train()
        return dict(out, **training.task_eval(run, student, tok))  # --tasks: exact match, by eval.py

    # ---- training --------------------------------------------------------------------------------
    fpt = training.flops_per_token(student, args.seq_len, forward_only=teacher)

    spans = data.conversation_spans(train_data, tok.eos_id, args.seq_len, "align") if args.assistant_only else None
    block = c.block_size if c.attn == "block" else None

    def draw():  # a batch of clean windows, or of packed conversations (--assistant_only), and its corruption
        if spans is None:  # (answer-only: only the answers may be masked)
            x0, where = data.answer_batch(train_data, answers, args.batch_size, args.seq_len, device, run.gen,
                                          starts=starts["train"])
            return x0, *diffusion.corrupt(x0, c.mask_token_id, c.shift, run.gen, args.eps, where=where,
                                          block_size=block), None, None
        x0, where, doc, pos = data.packed_batch(train_data, answers, spans, args.batch_size, args.seq_len, device,
                                                run.gen, pad_id=tok.eos_id, end_pad=args.end_pad,
                                                end_id=tok.eos_id)
        return x0, *diffusion.corrupt(x0, c.mask_token_id, c.shift, run.gen, args.eps, where=where, doc=doc, pos=pos,
                                      block_size=block), doc, pos

    for step in run.steps():
        for x0, xt, masked, t, doc, pos in run.micro_batches(draw):
            with ctx:
                loss, stats = loss_step(student, teacher, x0, xt, masked, t, layers=layers,
                                        lambda_align=args.lambda_align, metric=args.align_metric,
                                        norm=args.loss_norm, positions=args.align_positions, extra_ce=args.extra_ce,
                                        doc=doc, pos=pos)
            useful = x0.numel() if doc is None else int((doc >= 0).sum())  # a packed row's pads are not counted
            run.backward(loss, stats, tokens=useful, flops=fpt * x0.numel())
        rec = run.update()
        if run.eval_due():
            rec.update(run.evaluate(evaluate))
        if run.save_due(args.ckpt_interval):
            run.save(student, tok)
        run.snapshot(student, tok)
        run.log(rec, diff=f"{rec['diff_loss']:.3f}", align=f"{rec.get('align_loss', 0):.3f}",
                val_acc=f"{run.last_eval.get('val_acc@0.5', float('nan')):.3f}", tok_s=f"{rec['tokens_per_s']:.0f}")

    # ---- results and samples ---------------------------------------------------------------------
    final = run.final(evaluate)
    print("\nfinal eval: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items() if k != "val_cos"))
    if "val_cos" in final:
        print("cosine to the teacher per hidden state: " + " ".join(f"{v:.3f}" for v in final["val_cos"]))
    run.results(dict(**final, steps=args.max_iters, lambda_align=args.lambda_align, freeze=args.freeze,
                     scratch=args.scratch, params=student.num_params(),
                     trainable_params=student.num_params() - n_frozen,
                     tokens_seen=args.max_iters * args.batch_size * args.seq_len * args.grad_accum))
    if args.samples > 0 and run.is_main:  # masked diffusion, one token a step, blocks of 32 (or one block)
        runner.run_script("sample.py", "--ckpt", run.out_dir, "--data", args.data, "--num_samples", args.samples,
                            "--max_new_tokens", args.sample_len, "--block_length",
                            32 if args.sample_len % 32 == 0 else args.sample_len, "--seed", args.seed,
                            "--device", device)
