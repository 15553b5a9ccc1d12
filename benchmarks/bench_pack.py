"""
--what pack: the real model's training steps, before and after the changes that make them fast, in useful tokens
per second: the tokens of whole conversations a step trains on (a window's cut-off conversation and a packed row's
pads are not useful). SmolLM2-135M-Instruct (--ckpt: its imported directory, default out/real/ar) on its own chat
replies (--data: run.sh real's chat dataset, default data/real/chat), one process, each variant's steps interleaved
with the others' (median of --iters after one warmup, which also compiles):

- λ = 0 (masked-diffusion SFT) and REPR-ALIGN (λ = 10, the causal teacher's forward too), cumulatively:
  before: windows of 8 x 96 tokens that begin at a conversation (the old --assistant_only), fp32, AdamW's per-tensor
  loop; packed: 3 x 256, or one row of 768, whole conversations each attending within itself (data.packed_batch);
  then on 3 x 256: fused AdamW; torch.compile of the decoder (--compile) in fp32; fused AdamW with bf16 autocast
  (--autocast bf16), then compiled too (bf16 pays only on a CPU with bf16 instructions: --autocast fast);
- OPDLM (block 4, on-policy): 8 prompts of the chat data, a 16-token rollout at threshold 0.9 and the update; before
  (fp32, per-tensor AdamW), fused AdamW, and fused AdamW with bf16 autocast. Useful: the prompts' real tokens and the
  rollout.

Example: python -m benchmarks.bench --what pack --iters 3
"""
import contextlib
import tempfile
from pathlib import Path

import torch

from benchmarks.common import machine, race

BEFORE, PACKED = (8, 96), {"packed": (3, 256), "packed, one row": (1, 768)}  # (rows, tokens): 768 slots a step


def window_useful(spans, starts, T):
    """Tokens of the conversations that lie whole inside each window of T tokens starting at `starts`."""
    first, end = spans[:, 0], spans[:, 0] + spans[:, 1]
    return sum(int(spans[(first >= s) & (end <= s + T), 1].sum()) for s in starts)


def sft_step(student, teacher, train, roles, spans, starts, *, shape, fused, bf16, lam, gen, eos_id):
    """-> step() running one align.py step on the variant's batch; it returns the useful tokens it trained on."""
    import align
    from lib import data
    import diffusion
    from lib.training import configure_optimizer
    c = student.config
    opt = configure_optimizer(student, 1e-5, 0.1, fused=fused)
    layers = list(range(c.num_hidden_layers + 1))
    ctx = torch.autocast("cpu", torch.bfloat16) if bf16 else contextlib.nullcontext()

    def step():
        if shape != BEFORE:
            x0, where, doc, pos = data.packed_batch(train, roles, spans, *shape, generator=gen, pad_id=eos_id)
            useful = int((doc >= 0).sum())
        else:
            ix = data.offsets(len(train), BEFORE[0], BEFORE[1], gen, starts)
            x0, where = data._stack(train, ix, BEFORE[1], "cpu"), data._stack(roles, ix, BEFORE[1], "cpu").bool()
            doc = pos = None
            useful = window_useful(spans, ix, BEFORE[1])
        xt, masked, t = diffusion.corrupt(x0, c.mask_token_id, c.shift, gen, 1 / 500, where=where, doc=doc, pos=pos)
        with ctx:
            loss, _ = align.loss_step(student, teacher if lam else None, x0, xt, masked, t, layers=layers,
                                      lambda_align=lam, doc=doc, pos=pos)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return useful
    return step


def distill_step(student, teacher, pool, *, fused, bf16, gen, ends, vocab):
    """-> step() running one distill.py step (on-policy) on 8 prompts of the pool; it returns the useful tokens."""
    import distill
    from lib.training import configure_optimizer
    opt = configure_optimizer(student, 1e-5, 0.1, fused=fused)
    ctx = torch.autocast("cpu", torch.bfloat16) if bf16 else contextlib.nullcontext()

    def step():
        pick = torch.randint(len(pool), (8,), generator=gen).tolist()
        with ctx:
            x, lens, P, masked, _ = distill.make_batch(student, [pool[j] for j in pick], 16, "on", gen, eos_id=ends,
                                                       vocab_limit=vocab, pad_id=ends[0])
            loss, _ = distill.distill_loss(student, teacher, x, lens, P, masked, eos_id=ends, vocab_size=vocab)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return int(lens.sum()) + masked.numel()
    return step


def bench_pack(args, device, dtype):
    import convert
    from lib import data
    from lib import training
    from lib.tokenizer import Tokenizer
    if device.type != "cpu":
        raise SystemExit("bench --what pack measures the CPU's training step (--device cpu)")
    ckpt, data_dir = Path(args.ckpt or "out/real/ar"), Path(args.data or "data/real/chat")
    if not (ckpt / "config.json").exists() or not (data_dir / "meta.json").exists():
        raise SystemExit(f"bench --what pack: needs SmolLM2 in {ckpt} and its chat data in {data_dir}: run "
                         "`bash run.sh real` (its import, prompts and corpus stages) first, or pass --ckpt and --data")
    tok = Tokenizer.from_pretrained(ckpt)
    train, roles = data.load_split(data_dir, "train"), data.load_roles(data_dir, "train")
    spans = data.conversation_spans(train, tok.eos_id, BEFORE[1], "bench")
    starts = spans[:, 0][spans[:, 0] <= len(train) - BEFORE[1]]
    iters = args.iters or 3
    tmp = Path(tempfile.mkdtemp(prefix="bench-pack-"))
    convert.convert(str(ckpt), tmp / "dlm", "bidirectional")
    convert.convert(str(ckpt), tmp / "block", "block", 4)
    print(f"{machine(device)}; SmolLM2-135M-Instruct ({ckpt}) on {data_dir}; median of {iters} after 1 warmup, "
          f"interleaved; useful: tokens of whole conversations\n")
    print("| arm | variant | batch | s / step | useful tokens / step | useful tokens / s | vs before |")
    print("|---|---|---|---|---|---|---|", flush=True)

    def rows(arm, runs, batch):
        r = race(runs, iters)
        base = r["before"][1] / r["before"][0]
        for k, (sec, useful) in r.items():
            print(f"| {arm} | {k} | {batch[k]} | {sec:.2f} | {useful} | {useful / sec:,.0f} | "
                  f"{useful / sec / base:.2f}x |", flush=True)

    rows3 = PACKED["packed"]  # the shape run.sh real trains at (one row of 768 attends over 3x as many keys)
    variants = {"before": dict(shape=BEFORE, fused=False, bf16=False),
                **{k: dict(shape=shape, fused=False, bf16=False) for k, shape in PACKED.items()},
                "packed + fused AdamW": dict(shape=rows3, fused=True, bf16=False),
                "+ compile, fp32": dict(shape=rows3, fused=True, bf16=False, compile=True),
                "+ bf16 autocast": dict(shape=rows3, fused=True, bf16=True),
                "+ compile": dict(shape=rows3, fused=True, bf16=True, compile=True)}
    batch = {k: "x".join(map(str, v["shape"])) for k, v in variants.items()}
    for arm, lam in (("λ = 0", 0.0), ("REPR-ALIGN", 10.0)):
        runs = {}
        for k, v in variants.items():
            gen = torch.Generator().manual_seed(0)
            student = training.load_model(tmp / "dlm", device, "bench").train()
            teacher = training.load_teacher(str(ckpt), student, device, "bench", same_shapes=True) if lam else None
            if v.get("compile"):
                student.model.compile()
                if teacher is not None:
                    teacher.model.compile()
            runs[k] = sft_step(student, teacher, train, roles, spans, starts, shape=v["shape"], fused=v["fused"],
                               bf16=v["bf16"], lam=lam, gen=gen, eos_id=tok.eos_id)
        rows(arm, runs, batch)
        del runs
    pool = data.prompt_pool(tok, 16, data_dir=str(data_dir), seq_len=96, n=64)
    runs = {}
    for k, v in (("before", dict(fused=False, bf16=False)), ("+ fused AdamW", dict(fused=True, bf16=False)),
                 ("+ fused AdamW, bf16 autocast", dict(fused=True, bf16=True))):
        student = training.load_model(tmp / "block", device, "bench").train()
        teacher = training.load_teacher(str(ckpt), student, device, "bench")
        runs[k] = distill_step(student, teacher, pool, gen=torch.Generator().manual_seed(0), ends=tok.end_ids(
            student.config), vocab=tok.vocab_size, **v)
    rows("OPDLM", runs, {k: "8 prompts, rollout 16" for k in runs})
