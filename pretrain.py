"""
Train the tiny AR teacher of the embedded default: a Qwen3-shaped model on the prepared corpus
(the Python standard library, in a BPE vocabulary lib/corpus.py learnt on it), with the plain next-token loss.
nanoGPT's train.py in miniature, on the shared machinery of lib/training.py.

    python -m lib.corpus --out_dir data/stdlib
    python pretrain.py --data data/stdlib --out_dir out/ar-tiny

Notes on the design: docs/methods.md, "pretrain.py" under §8.
"""
import math

import numpy as np
import torch
import torch.nn.functional as F

import sample
from model import PRESETS, Qwen3, preset
from lib import cli
from lib import data
from lib import training
from lib.tokenizer import EOS, Tokenizer

p = cli.parser(__doc__)
p.add_argument("--data", default="data/stdlib", help="a directory prepared by lib/corpus.py")
p.add_argument("--out_dir", default="out/ar-tiny", help="checkpoints, log.jsonl and results.json go here")
p.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="model shape when starting from scratch")
p.add_argument("--init", default=None, help="start from this Qwen3 checkpoint instead of random weights")
cli.add_loop_args(p, answers=True, max_iters=600, batch_size=16, seq_len=256, lr=6e-3, min_lr=6e-4, warmup=20,
                  eval_interval=100, eval_batches=16)
p.add_argument("--samples", type=int, default=3, help="prompts continued at the end (greedy and sampled)")


def ar_loss(model, x, *, sep_id=None, eos_id=None):
    """Next-token cross-entropy: the logits at position i predict token i+1. With sep_id, the mean over the targets
    after a sep_id token of their own document only (data.after_separator): an answer-only loss (0 if none)."""
    logits = model(x[:, :-1], attn="causal")
    y = x[:, 1:]  # (B, T) targets
    if sep_id is not None:
        y = y.masked_fill(~data.after_separator(x, sep_id, eos_id)[:, 1:], -100)  # -100: cross_entropy ignores it
    ce = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum")
    return ce / (y != -100).sum().clamp(min=1)


@torch.no_grad()
def evaluate(model, batches, ctx, **loss_kw):
    model.eval()
    losses = []
    for x in batches:
        with ctx:
            losses.append(ar_loss(model, x, **loss_kw).item())
    model.train()
    return float(np.mean(losses))


def vocab_of(tok):
    """A new model's vocabulary for the data's tokenizer: its ids plus one free row for a DLM's mask token, rounded
    up to a multiple of 64 -> Qwen3Config fields."""
    return dict(vocab_size=-(-(tok.mask_id + 1) // 64) * 64, bos_token_id=tok.eos_id, eos_token_id=tok.eos_id)


if __name__ == "__main__":
    args = cli.parse_loop_args(p)
    run = training.Run(args, "pretrain")  # its generator draws the training batches
    device, ctx = run.device, run.ctx
    train_data, val_data = data.load_splits(args.data, "pretrain", seq_len=args.seq_len)

    tok = Tokenizer.from_pretrained(args.data)
    vocab = vocab_of(tok)  # from scratch the preset gives the shape, the data's tokenizer the vocabulary
    model = run.start(lambda: training.load_model(args.init, device, "pretrain: --init", attn="causal") if args.init
                      else Qwen3(preset(args.preset, **vocab)).init_weights(args.seed).to(device))
    tok = training.load_tokenizer(args.data, model.config)
    if model.config.attn != "causal":
        raise SystemExit(f"pretrain.py trains AR models; this checkpoint has attn={model.config.attn!r}")
    # --loss_after: the answers of windows that begin at a document's start; else every token of random windows
    sep_id, starts = data.answers_only(args.loss_after, tok, train_data, val_data, args.seq_len + 1, "pretrain")
    loss_kw = {} if sep_id is None else dict(sep_id=sep_id, eos_id=tok.eos_id)
    model = run.prepare(model)
    val_batches = data.eval_batches(val_data, args.batch_size, args.seq_len + 1, args.eval_batches, device,
                                    starts=starts["val"])
    print(f"model: {model.num_params() / 1e6:.2f}M parameters, {model.config.num_hidden_layers} layers; "
          f"tokens: {len(train_data):,} train / {len(val_data):,} val; device {device}")

    fpt, last_val = training.flops_per_token(model, args.seq_len), float("nan")
    def draw():
        return data.get_batch(train_data, args.batch_size, args.seq_len + 1, device, run.gen,
                              starts=starts["train"])
    for step in run.steps():
        for x in run.micro_batches(draw):
            with ctx:
                loss = ar_loss(model, x, **loss_kw)
            run.backward(loss, tokens=x[:, 1:].numel(), flops=fpt * x[:, 1:].numel())
        rec = run.update()
        if run.eval_due():
            rec["val_loss"] = last_val = evaluate(model, val_batches, ctx, **loss_kw)
        if run.save_due():
            run.save(model, tok)
        run.snapshot(model, tok)
        run.log(rec, loss=f"{rec['loss']:.3f}", val=f"{last_val:.3f}", tok_s=f"{rec['tokens_per_s']:.0f}")

    val = evaluate(model, val_batches, ctx, **loss_kw)
    h = data.unigram_entropy(val_data) * math.log(2)  # nats, like the loss
    against = f"vs unigram entropy {h:.3f} nats ({h / math.log(2):.3f} bits) of the validation tokens"
    if loss_kw:  # the answer-only loss has no frequency baseline: a model that knows the task reaches 0
        against = f"on the tokens after {args.loss_after!r}"
    print(f"\nvalidation loss {val:.3f} nats/token ({val / math.log(2):.3f} bits) {against}")
    run.results(dict(val_loss=val, unigram_entropy=h, steps=args.max_iters, params=model.num_params(),
                     tokens_seen=args.max_iters * args.batch_size * args.seq_len * args.grad_accum))
    if loss_kw:  # validation documents up to their separator: the model answers them
        docs = [d.tolist() for d in data.documents(val_data, tok.eos_id)]
        prompts = [d[:d.index(loss_kw["sep_id"]) + 1] for d in docs if loss_kw["sep_id"] in d][:args.samples]
    else:
        prompts = data.code_prompts(val_data, tok, args.samples, 48)
    for temperature in (0.0, 0.8) if prompts else ():  # greedy, then sampled, with sample.py's cached AR sampler
        gen = sample.ar_generate(model.eval(), prompts, 96, temperature, vocab_limit=tok.vocab_size,
                                 generator=torch.Generator(device).manual_seed(args.seed))
        for b, ids in enumerate(prompts):
            text = tok.decode(gen.sequence(b).tolist())
            if loss_kw:  # the answer and its eos: only they were trained
                text = text.split(EOS)[0] + EOS
            print(f"--- temperature {temperature}, prompt {tok.decode(ids)!r}\n{text}")
