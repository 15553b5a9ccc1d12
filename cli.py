"""The command-line conventions every script shares: `--help` shows a short description (the docstring's first
paragraph and its usage lines; the rest of the docstring is for readers of the code) and every flag with its
default; what --device and --seed do and a script's place in a torchrun job (`setup`); Ctrl-C as one line
(`interrupted`); the DLM samplers' end-token flags. torch is imported only inside `setup`."""
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

EOS_RULES = ("free", "last", "penalty")  # the DLM samplers' rules for end tokens (sample.diffusion_generate)


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written (usage lines keep their layout), and each flag's default after its help text."""


def short(doc):
    """A module docstring's first paragraph and the indented (usage) paragraphs right after it."""
    paras = doc.strip("\n").split("\n\n")
    return "\n\n".join([paras[0], *itertools.takewhile(lambda p: p.startswith("    "), paras[1:])])


def parser(doc, **kwargs):
    """The ArgumentParser of a script whose module docstring is `doc`."""
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


# ---- a script's start: --device, --seed, its place in a torchrun job, Ctrl-C in one line ----------------

def setup(device="auto", seed=1337):
    """-> (device, autocast context). bf16 autocast on CUDA; plain fp32 on CPU (reproducible there); the RNGs seeded.
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
        return device, torch.autocast("cuda", dtype=torch.bfloat16)
    return device, contextlib.nullcontext()


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
