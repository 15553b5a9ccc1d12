"""The command-line conventions every script shares: `--help` shows a short description (the docstring's first
paragraph and its usage lines; the rest of the docstring is for readers of the code) and every flag with its
default; what --device and --seed do and a script's place in a torchrun job (`setup`); Ctrl-C as one line
(`interrupted`); the samplers' flags, shared by sample.py and eval.py (`sampler_args`, `sampler_kwargs`). torch
is imported only inside `setup`."""
import argparse
import atexit
import contextlib
import itertools
import math
import os
import random
import signal
import sys
from pathlib import Path

SAVE_DTYPES = ("auto", "float32", "bfloat16", "float16")
FROZEN_DTYPES = ("auto", "float32", "bfloat16")
EOS_RULES = ("free", "last", "penalty")  # the DLM samplers' rules for end tokens (sample.diffusion_generate)
CACHES = ("none", "prefix", "dual")  # the masked-diffusion sampler's KV caches (sample.diffusion_generate)


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written (usage lines keep their layout), and each flag's default after its help text."""


AUTOCASTS = ("auto", "fast", "bf16", "none")  # --autocast: bf16 on CUDA only (auto), where the hardware computes
# in bf16 (fast: CUDA, a CPU with AVX-512 BF16 or AMX), everywhere, nowhere

def short(doc):
    """A module docstring's first paragraph and the indented (usage) paragraphs right after it."""
    paras = doc.strip("\n").split("\n\n")
    return "\n\n".join([paras[0], *itertools.takewhile(lambda p: p.startswith("    "), paras[1:])])


def parser(doc, **kwargs):
    """The ArgumentParser of a script whose module docstring is `doc`; a module of a package run with -m is named
    as it is run (usage: python -m lib.corpus ...)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and "." in (spec.name or "") and "prog" not in kwargs:
        kwargs["prog"] = f"python -m {spec.name}"
    return argparse.ArgumentParser(description=short(doc), formatter_class=HelpFormatter, **kwargs)


def comma_list(kind=str, *, choices=None, what="values", distinct=False):
    """An argparse type: "a,b" -> [kind(a), kind(b)] (empty items dropped), each one of `choices` when given;
    distinct: at least one item, no two equal (and finite, for floats)."""
    def parse(text):
        try:
            items = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {what}") from None
        if choices and (bad := sorted(set(items) - set(choices))):
            raise argparse.ArgumentTypeError(f"unknown {what} {bad}; choose from {', '.join(choices)}")
        finite = all(math.isfinite(x) for x in items if isinstance(x, float))
        if distinct and (not items or len(set(items)) < len(items) or not finite):
            raise argparse.ArgumentTypeError(f"{text!r}: need one or more distinct finite {what}")
        return items
    return parse


def thresholds(text):
    """An argparse type for confidence thresholds: "0.5,0.9" -> [0.5, 0.9], each in (0, 1]."""
    try:
        ts = [float(t) for t in text.split(",")]
    except ValueError:
        ts = []
    if not ts or not all(0 < t <= 1 for t in ts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers in (0, 1]")
    return ts


def table(header, rows):
    """A markdown table: the header's cells, then each row's (str of each cell)."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(map(str, cells)) + " |" for cells in lines)


def check_eos_rule(eos_rule, eos_penalty):
    """ValueError unless eos_rule is one of EOS_RULES and eos_penalty a number >= 0 (the samplers' check)."""
    if eos_rule not in EOS_RULES or not eos_penalty >= 0:
        raise ValueError(f"eos_rule must be one of {', '.join(EOS_RULES)} and eos_penalty >= 0, got {eos_rule!r} "
                         f"and {eos_penalty}")


def check_sampling(temperature=0.0, top_k=None, top_p=None, min_p=None, repetition_penalty=1.0):
    """ValueError naming each sampling setting out of range (the samplers' check; the chat's /set)."""
    bad = [f"{k} {v}" for k, v, ok in (
        ("temperature", temperature, temperature >= 0), ("top_k", top_k, top_k is None or top_k >= 1),
        ("top_p", top_p, top_p is None or 0 < top_p <= 1), ("min_p", min_p, min_p is None or 0 <= min_p <= 1),
        ("repetition_penalty", repetition_penalty, repetition_penalty > 0)) if not ok]
    if bad:
        raise ValueError(f"{', '.join(bad)}: need temperature >= 0, top_k >= 1, top_p in (0, 1], min_p in [0, 1] "
                         f"and repetition_penalty > 0")


def eos_args(p):
    """--eos_rule and --eos_penalty: how a DLM sampler treats end tokens (sample.py, eval.py)."""
    def non_negative(text):
        try:
            x = float(text)
        except ValueError:
            x = -1.0
        if not x >= 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number >= 0")
        return x
    p.add_argument("--eos_rule", default="free", choices=EOS_RULES, help="DLMs: end tokens compete freely, are "
                   "committed only where no slot before them is masked (last: LLaDA), or lose --eos_penalty from "
                   "their logits (penalty: Dream)")
    p.add_argument("--eos_penalty", type=non_negative, default=3.0, help="--eos_rule penalty: its strength")


def cache_args(p):
    """--cache, --compile, --finish_block and the end-token flags (eos_args): the sampler flags eval.py tasks takes."""
    p.add_argument("--cache", default="none", choices=CACHES, help="masked diffusion: Fast-dLLM's approximate KV "
                   "cache, refreshed once per block: prefix (the slots before the block), dual (and after it); none: "
                   "exact")
    p.add_argument("--compile", action="store_true", help="the sampler's steps through torch.compile (CUDA: with "
                   "CUDA graphs); the first steps of each shape include compiling")
    p.add_argument("--finish_block", action="store_true", help="DLMs: a row is done once the block holding its end "
                   "token is, not at that token (its forwards counted until then)")
    eos_args(p)


def sampler_args(p, max_new_tokens):
    """The flags of sample.generate's arguments (sample.py, eval.py), --max_new_tokens defaulting to max_new_tokens;
    sampler_kwargs turns them into its keyword arguments."""
    p.add_argument("--max_new_tokens", type=int, default=max_new_tokens, help="AR: at most; DLMs: the generation "
                   "length")
    p.add_argument("--temperature", type=float, default=None, help="0: greedy (default: the checkpoint's "
                   "generation_config.json where the script reads it (sample.py), else 0)")
    p.add_argument("--top_k", type=int, default=None, help="sample among the k most likely tokens only (0: off)")
    p.add_argument("--top_p", type=float, default=None, help="sample within the smallest set of mass >= p only")
    p.add_argument("--min_p", type=float, default=None, help="sample among the tokens at least min_p times as "
                   "likely as the most likely one only")
    p.add_argument("--repetition_penalty", type=float, default=None, help="transformers' penalty (1: off): a "
                   "logit of an id already in the prompt or the text so far (DLMs: the tokens committed so far) is "
                   "divided by it if positive, multiplied if negative")
    p.add_argument("--block_length", type=int, default=None, help="diffusion: semi-AR block (default min(32, N))")
    p.add_argument("--steps", type=int, default=None, help="diffusion: steps in all (default N, one token a step)")
    p.add_argument("--remasking", default="low_confidence", choices=["low_confidence", "random"],
                   help="diffusion without threshold: commit the most confident predictions, or random ones")
    p.add_argument("--threshold", type=float, default=None, help="in (0, 1]: commit every token whose raw "
                   "probability reaches it; diffusion: Fast-dLLM parallel decoding (default off); block: default 0.9")
    p.add_argument("--block_size", type=int, default=None, help="block: default the checkpoint's")
    p.add_argument("--no_cache", action="store_true", help="AR, block: recompute everything each step (reference)")
    cache_args(p)
    p.add_argument("--shift", choices=["true", "false"], default=None, help="DLMs: override config.shift")
    p.add_argument("--ignore_eos", action="store_true", help="do not stop a row at the checkpoint's end ids (eval.py "
                   "still scores its completion up to the first)")


SAMPLING = dict(temperature=0.0, top_k=None, top_p=None, min_p=None, repetition_penalty=1.0)  # greedy, as is


def sampling(args, defaults=None):
    """The sampling settings (SAMPLING's keys): each flag that is given, else defaults' (the checkpoint's
    generation_config.json: sample.model_defaults), else SAMPLING's; top_k 0 is off."""
    out = SAMPLING | (defaults or {}) | {k: getattr(args, k) for k in SAMPLING if getattr(args, k) is not None}
    return out | dict(top_k=out["top_k"] or None)


def sampler_kwargs(args, defaults=None):
    """sampler_args' flags -> the sample.generate keyword arguments they set (eos_id, generator, vocab_limit and
    record are the caller's); the sampling settings as `sampling` resolves them."""
    return sampling(args, defaults) | dict(
        shift=None if args.shift is None else args.shift == "true", block_length=args.block_length, steps=args.steps,
        remasking=args.remasking, threshold=args.threshold, block_size=args.block_size, use_cache=not args.no_cache,
        cache=args.cache, finish_block=args.finish_block, eos_rule=args.eos_rule, eos_penalty=args.eos_penalty,
        compile=args.compile)


# ---- a training script's loop flags -------------------------------------------------------------------------

def comma_ints(text):
    """"50,100,200" -> [50, 100, 200]: positive integers, comma-separated (argparse's error otherwise)."""
    try:
        out = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers, comma-separated") from None
    if any(n <= 0 for n in out):
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers, comma-separated")
    return out


def add_loop_args(p, *, frozen=None, tasks=None, answers=False, **defaults):
    """The training-loop flags every training script shares, with that script's defaults (max_iters, batch_size,
    seq_len, lr, min_lr, warmup, eval_interval, eval_batches). frozen: what the script's frozen model is (e.g. "the
    teacher"), for its --frozen_dtype flag (frozen_dtype); None: the script has none. tasks: the threshold the
    --tasks evaluation decodes at, in words (task_eval); None: no --tasks. answers: --loss_after (answers_only);
    "chat": --assistant_only too (loss_targets)."""
    d = dict(grad_accum=1, weight_decay=0.1, grad_clip=1.0, **defaults)
    helps = dict(max_iters="optimizer steps in all", batch_size="sequences per micro-batch",
                 seq_len="tokens per training sequence",
                 grad_accum="micro-batches per optimizer step, over all processes (a multiple of their number)",
                 warmup="steps of linear learning-rate warmup", eval_interval="steps between evaluations",
                 eval_batches="batches per evaluation", lr="peak learning rate (AdamW)",
                 min_lr="the cosine schedule's floor", weight_decay="AdamW weight decay (matrices only)",
                 grad_clip="clip the gradient's global norm to this")
    for name in ("max_iters", "batch_size", "seq_len", "grad_accum", "warmup", "eval_interval", "eval_batches"):
        p.add_argument(f"--{name}", type=int, default=d[name], help=helps[name])
    for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
        p.add_argument(f"--{name}", type=float, default=d[name], help=helps[name])
    p.add_argument("--time_budget", type=float, default=None, metavar="MINUTES", help="train for this many minutes "
                   "of wall time (the first step's compile and the evaluations count): the cosine runs over them, and "
                   "the run ends at the last step that fits (--max_iters still caps it; the final evaluation and save "
                   "come after). Default: --max_iters alone")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--autocast", default="auto", choices=AUTOCASTS, help="bf16 autocast of the forward and backward "
                   "(fp32 weights and optimizer); auto: on CUDA, not on a CPU (reproducible there); fast: on CUDA "
                   "and on a CPU with bf16 instructions (AVX-512 BF16, AMX), where it pays; on a CPU without them bf16 "
                   "is several times slower (benchmarks/bench.py --what pack measures it)")
    p.add_argument("--grad_checkpoint", action="store_true", help="activation checkpointing (memory for compute)")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu; under torchrun "
                   "cuda means cuda:LOCAL_RANK")
    p.add_argument("--seed", type=int, default=1337, help="seeds the data order, masks and rollouts (CPU runs repeat)")
    p.add_argument("--fsdp", action="store_true",
                   help="under torchrun, shard the trained model over the processes (FSDP2: one unit per decoder "
                        "layer, then the root) instead of replicating it; checkpoints are --weights_only")
    p.add_argument("--snapshots", type=comma_ints, default=[], metavar="N,N,...", help="after these many steps, "
                   "also the weights alone in --out_dir/step-N, with the training seconds so far (a curve's points; "
                   "under --time_budget the budget's last step too)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out_dir")
    p.add_argument("--allow_changed_settings", action="store_true",
                   help="--resume even where settings differ from the checkpoint's (the new values are used)")
    p.add_argument("--save_dtype", default="auto", choices=SAVE_DTYPES,
                   help="dtype of the saved weights; auto: the dtype the model was stored in (bfloat16 for Qwen3, "
                        "float32 for the tiny presets); train_state.pt keeps fp32 weights for an exact --resume")
    p.add_argument("--weights_only", action="store_true",
                   help="checkpoints without train_state.pt (optimizer moments, fp32 weights, RNG states): much "
                        "smaller and faster to write, but the run cannot be --resume'd")
    if answers:
        p.add_argument("--loss_after", default=None, metavar="TEXT",
                       help="answer-only loss: train on the tokens after TEXT (one token) in each document, up to its "
                       "eos, in windows that begin at a document's start (the task world's documents: ' ='); default "
                       "every token of random windows")
    if answers == "chat":
        p.add_argument("--assistant_only", action="store_true",
                       help="chat data (lib.corpus on a JSONL of {\"messages\"}): train on the assistant turns' tokens "
                       "only, in windows that begin at a conversation; longer conversations are left out, and counted")
    if tasks:
        p.add_argument("--tasks", default=None, metavar="FILE",
                       help="the task world's heldout.jsonl: at every evaluation also exact match and tokens per "
                       f"forward at {tasks}, greedy, by eval.py tasks (task_acc, task_tpf, task_pref in log.jsonl)")
        p.add_argument("--tasks_n", type=int, default=50, help="with --tasks: held-out prompts per family evaluated")
        p.add_argument("--tasks_also", type=thresholds, default=[],
                       help="with --tasks, DLMs: also at these thresholds in (0, 1], comma-separated (task_acc@T, "
                       "task_tpf@T)")
    if frozen:
        p.add_argument("--frozen_dtype", default="auto", choices=FROZEN_DTYPES,
                       help=f"dtype {frozen} is held in; auto: bfloat16 on CUDA (half the memory of fp32; the "
                            f"training runs under bf16 autocast there anyway), float32 on CPU")


def parse_loop_args(p):
    """The parsed flags, with the loop flags checked (p.error on a bad one)."""
    args = p.parse_args()
    for name in ("max_iters", "batch_size", "seq_len", "grad_accum", "lr", "eval_interval", "eval_batches"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be positive")
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if args.grad_accum % world_size:
        p.error(f"--grad_accum {args.grad_accum} is not a multiple of the {world_size} processes (it counts the "
                f"micro-batches of a step over all of them): use {-(-args.grad_accum // world_size) * world_size}")
    if args.fsdp and not args.weights_only:
        p.error("--fsdp writes no train_state.pt (the optimizer state is sharded): add --weights_only")
    if args.fsdp and args.resume:
        p.error("--resume continues from train_state.pt, which an --fsdp run does not write (its optimizer state is "
                "sharded): start a new run, or train without --fsdp to be able to resume")
    if args.time_budget is not None and args.time_budget <= 0:
        p.error("--time_budget must be positive (minutes)")
    if args.time_budget and args.resume:
        p.error("--time_budget counts one process's minutes and cannot be continued: --resume with --max_iters (the "
                "steps the budget allowed are in the checkpoint's log.jsonl)")
    if getattr(args, "tasks_n", 1) <= 0:
        p.error("--tasks_n must be > 0")
    if getattr(args, "tasks", None) and not Path(args.tasks).is_file():
        p.error(f"--tasks {args.tasks}: no such file (python -m worlds.tasks --out_dir DIR writes DIR/heldout.jsonl)")
    return args


def atomic_write(path, write):
    """write(tmp_name), then rename over path: a crash or an error never leaves a half-written file under the real
    name (nor the temporary one: it is removed on failure). The project's one atomic writer (weights, configs,
    tokenizers, train state, logs)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ---- a script's start: --device, --seed, its place in a torchrun job, Ctrl-C in one line ----------------

def setup(device="auto", seed=1337, autocast="auto"):
    """-> (device, autocast context). bf16 autocast on CUDA; plain fp32 on CPU (reproducible there) unless autocast
    is "bf16", or "fast" on a CPU with bf16 instructions ("none": fp32 everywhere); the RNGs seeded.
    Ctrl-C prints one line instead of a traceback (a Run replaces it with its own, which names the checkpoint).
    Under torchrun (WORLD_SIZE > 1) it joins the job: nccl on CUDA (the device cuda:LOCAL_RANK), gloo on a CPU;
    every rank but 0 prints nothing; the process group is torn down at exit. One process: no process group."""
    import numpy as np
    import torch
    import torch.distributed as dist
    sys.excepthook = lambda kind, value, tb: interrupted(kind, value, tb, "")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if world_size > 1 and device == "cuda":
        device = f"cuda:{os.environ['LOCAL_RANK']}"
    try:
        device = torch.device(device)
    except RuntimeError:
        raise SystemExit(f"--device {device}: not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise SystemExit(f"--device {device}: not supported; use auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda requested but no CUDA device is available")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise SystemExit(f"--device {device}: there are only {torch.cuda.device_count()} CUDA devices")
    if world_size > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        atexit.register(dist.destroy_process_group)
        if dist.get_rank() != 0:
            sys.stdout = open(os.devnull, "w")  # rank 0 speaks for the job
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if autocast == "fast":
        autocast = "bf16" if device.type == "cuda" or cpu_has_bf16() else "none"
        print(f"--autocast fast: {'bf16' if autocast == 'bf16' else 'fp32 (this CPU has no bf16 instructions)'}")
    if autocast == "bf16" or (autocast == "auto" and device.type == "cuda"):
        return device, torch.autocast(device.type, dtype=torch.bfloat16)
    return device, contextlib.nullcontext()


def cpu_has_bf16():
    """Whether this CPU multiplies in bf16 natively (x86: AVX-512 BF16 or AMX tiles), where bf16 autocast pays."""
    import torch
    return any(getattr(torch.cpu, f"_is_{n}_supported", lambda: False)() for n in ("avx512_bf16", "amx_tile"))


def interrupted(kind, value, tb, rest):
    """sys.excepthook: Ctrl-C ends a process with one line, `rest` saying where it stopped and how to continue, then
    by SIGINT itself, as a shell expects: left to Python, the training scripts were seen to exit with status 1 after
    the hook (Python 3.11.7, 2026-12-03; the cause not found), which a caller cannot tell from a failure."""
    if not issubclass(kind, KeyboardInterrupt):
        return sys.__excepthook__(kind, value, tb)
    print(f"{Path(sys.argv[0]).name}: interrupted{rest}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
