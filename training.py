"""
The training machinery every training script shares (pretrain.py, align.py, distill.py, dpo.py), behind one object,
`Run`, so that a script keeps its algorithm and a loop a reader sees top to bottom:

    run = training.Run(args, "align")              # device, precision, seeds, torchrun, the Ctrl-C message
    model = run.start(fresh)                       # fresh(), or with --resume the checkpoint's model and step
    run.train(model)                               # --fsdp, --grad_checkpoint, AdamW (its state resumed), --compile
    for step in run.steps():                       # each step's learning rate set; a progress bar
        for batch in run.micro_batches(draw):      # every rank draws every micro-batch and computes its own
            with run.ctx:
                loss, stats = my_loss(model, *batch)
            run.backward(loss, stats, tokens=n, flops=f)
        rec = run.update()                         # sum over ranks, NaN guard, clip, AdamW step, speed, MFU
        if run.eval_due(): rec.update(run.evaluate(evaluate))   # kept: run.last_eval, run.final(evaluate)
        if run.save_due(): run.save(model, tok)    # atomic; --resume continues from it exactly
        run.log(rec)                               # log.jsonl and the bar
    run.results(dict(**run.final(evaluate), ...))  # results.json: the run finished

Notes on the design: docs/methods.md, "training.py" under §8.
"""
import atexit
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

import cli
import data
from checkpoint import rows_with_mask
from model import Qwen3, Qwen3Config
from data import load_splits
from tokenizer import atomic_write, described, fingerprint_of, same_tokenizer
from tokenizer import load_tokenizer  # noqa: F401 (the training scripts' checked loading: training.load_tokenizer)

# Settings a resumed run may change: how long, where and how fast it runs, what it prints; not what a step computes.
RESUMABLE = {"max_iters", "resume", "allow_changed_settings", "device", "compile", "grad_checkpoint", "seed",
             "eval_interval", "eval_batches", "samples", "sample_len", "save_dtype", "out_dir", "init", "weights_only",
             "frozen_dtype"}
SAVE_DTYPES = ("auto", "float32", "bfloat16", "float16")
FROZEN_DTYPES = ("auto", "float32", "bfloat16")
CONVERT_FLAGS = {"bidirectional": "--attn bidirectional", "block": "--attn block --block_size 4"}


def add_loop_args(p, *, frozen=None, tasks=None, answers=False, **defaults):
    """The training-loop flags every training script shares, with that script's defaults (max_iters, batch_size,
    seq_len, lr, min_lr, warmup, eval_interval, eval_batches). frozen: what the script's frozen model is (e.g. "the
    teacher"), for its --frozen_dtype flag (frozen_dtype); None: the script has none. tasks: the threshold the
    --tasks evaluation decodes at, in words (Run.task_eval); None: no --tasks. answers: --loss_after (answers_only);
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
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--grad_checkpoint", action="store_true", help="activation checkpointing (memory for compute)")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu; under torchrun "
                   "cuda means cuda:LOCAL_RANK")
    p.add_argument("--seed", type=int, default=1337, help="seeds the data order, masks and rollouts (CPU runs repeat)")
    p.add_argument("--fsdp", action="store_true",
                   help="under torchrun, shard the trained model over the processes (FSDP2: one unit per decoder "
                        "layer, then the root) instead of replicating it; checkpoints are --weights_only")
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
                       "eos, in windows that begin at a document's start (tasks.py's documents: ' ='); default every "
                       "token of random windows")
    if answers == "chat":
        p.add_argument("--assistant_only", action="store_true",
                       help="chat data (data.py on a JSONL of {\"messages\"}): train on the assistant turns' tokens "
                       "only, in windows that begin at a conversation; longer conversations are left out, and counted")
    if tasks:
        p.add_argument("--tasks", default=None, metavar="FILE",
                       help="tasks.py's heldout.jsonl: at every evaluation also exact match and tokens per forward at "
                       f"{tasks}, greedy, by eval.py tasks (task_acc, task_tpf, task_pref in log.jsonl)")
        p.add_argument("--tasks_n", type=int, default=50, help="with --tasks: held-out prompts per family evaluated")
        p.add_argument("--tasks_also", type=cli.thresholds, default=[],
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
    if getattr(args, "tasks_n", 1) <= 0:
        p.error("--tasks_n must be > 0")
    if getattr(args, "tasks", None) and not Path(args.tasks).is_file():
        p.error(f"--tasks {args.tasks}: no such file (tasks.py --out_dir DIR writes DIR/heldout.jsonl)")
    return args


class Run:
    """One training run: its settings (args), device and autocast context (ctx), its place in a torchrun job (rank,
    world_size, fsdp), the generator of all its randomness (gen: batches, masks, rollouts), the model it trains, the
    optimizer and schedule, log.jsonl, checkpoints and --resume. A script makes one and runs its own loop (the
    module docstring); the Run keeps the bookkeeping: the step the run is at and its last checkpoint, for --resume,
    the NaN guard and the Ctrl-C message. generator: "cpu" (the default) or "device" (a generator on the device)."""

    def __init__(self, args, who, *, generator="cpu"):
        self.args, self.who, self.out_dir = args, who, Path(args.out_dir)
        self.device, self.ctx = cli.setup(args.device, args.seed)
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.fsdp, self.is_main = args.fsdp, self.rank == 0
        if self.fsdp and self.world_size == 1:
            raise SystemExit("--fsdp shards the model over the processes of a torchrun job: run under torchrun "
                             "--nproc_per_node=N, or drop --fsdp")
        self.gen = torch.Generator(self.device if generator == "device" else "cpu").manual_seed(args.seed)
        self.at, self.checkpoint, self.state, self.first = None, None, None, 0  # the next step; the last checkpoint
        self.last_eval, self.last_eval_step = {}, None
        self.tasks_child = (None, None)  # task_eval's eval.py process, and the thresholds it decodes at
        sys.excepthook = lambda kind, value, tb: cli.interrupted(kind, value, tb, self.where())
        frozen = getattr(args, "frozen_dtype", "auto")
        self.frozen_dtype = ((torch.bfloat16 if self.device.type == "cuda" else torch.float32) if frozen == "auto"
                             else getattr(torch, frozen))  # of a teacher or DPO's reference

    # ---- set-up ------------------------------------------------------------------------------------

    def load_splits(self, data_dir, *, like=None):
        """(train, val) token arrays of a prepared dataset, each longer than --seq_len (load_splits)."""
        return load_splits(data_dir, self.who, like=like, seq_len=self.args.seq_len)

    def prompt_pool(self, tok, span, *, prompts, data_dir, n, like):
        """data.prompt_pool (--seq_len tokens each), or a one-line exit; prompts cut from data_dir's validation
        split need its tokenizer to be the model like's."""
        if not prompts:
            self.load_splits(data_dir, like=like)
        try:
            return data.prompt_pool(tok, span, prompts=prompts, data_dir=data_dir, seq_len=self.args.seq_len, n=n)
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(f"{self.who}: {e}")

    def start(self, fresh):
        """-> the model to train: with --resume the run in out_dir (its generator, step and train state restored,
        refused when the run's settings differ from the checkpoint's unless --allow_changed_settings); otherwise
        fresh() (the new model), refusing an out_dir that already holds a checkpoint."""
        args, self.at = self.args, 0
        if not args.resume:
            if (self.out_dir / "model.safetensors").exists():
                raise SystemExit(f"{self.out_dir} already holds a checkpoint: pass --resume to continue it, or "
                                 f"another --out_dir")
            return fresh()
        model, self.state = load_checkpoint(self.out_dir, self.device)
        if not args.allow_changed_settings and (diff := changed_settings(self.state["extra"], args)):
            changes = ", ".join(f"--{k} {a} (now {b})" for k, (a, b) in diff.items())
            raise SystemExit(f"--resume: the run in {self.out_dir} was made with {changes}; rerun with its settings, "
                             f"or pass --allow_changed_settings to continue with the new ones")
        self.gen.set_state(self.state["gen"])
        self.checkpoint = self.state["step"]
        self.at = self.first = self.state["step"] + 1
        if self.first >= args.max_iters:
            print(f"--resume: the checkpoint in {self.out_dir} is step {self.state['step']}, the last of --max_iters "
                  f"{args.max_iters} or past it: nothing left to train")
        return model

    def train(self, model, *, compile_too=(), dynamic=None):
        """Make `model` the one trained: sharded (--fsdp: FSDP2 over all ranks, one unit per decoder layer, then the
        root: embeddings, final norm and lm_head, each rank holding 1/world_size of every tensor), activation
        checkpointing (--grad_checkpoint), AdamW (its state restored on --resume), torch.compile in place (--compile:
        model and compile_too, e.g. a teacher; dynamic=True when lengths change from step to step), and the log.
        Gradients are summed over the ranks, as update() sums DDP's. FSDP gathers the root's tensors around
        model.forward, every loss's, evaluation's and sampler's one entry point. -> model."""
        self.model = model
        if self.fsdp:
            from torch.distributed.fsdp import fully_shard
            units = [*model.model.layers, model]
            for unit in units:
                fully_shard(unit)
            for unit in units:
                unit.set_gradient_divide_factor(1.0)  # a sum over the ranks, not their mean (see all_sum)
                unit.set_force_sum_reduction_for_comms(True)  # a plain sum: gloo has no pre-scaled one
        model.model.gradient_checkpointing = self.args.grad_checkpoint
        self.opt = configure_optimizer(model, self.args.lr, self.args.weight_decay, device_type=self.device.type)
        if self.state:
            self.opt.load_state_dict(self.state["optimizer"])
        if self.args.compile:  # in place: parameter names, and so checkpoints, are unchanged
            for m in (model, *compile_too):
                m.model.compile(dynamic=dynamic)
        self.log_file = Log(self.out_dir, self.args.resume, self.checkpoint, self.is_main)
        return model

    # ---- the loop ----------------------------------------------------------------------------------

    def steps(self):
        """The steps left to run, each with its scheduled learning rate set (lr_at) and a progress bar."""
        self.bar = tqdm(range(self.first, self.args.max_iters), initial=self.first, total=self.args.max_iters,
                        desc=self.who, disable=not self.is_main)
        self.t_start, self.step_times = time.time(), []
        for step in self.bar:
            self.step, self.t0, self.sums = step, time.time(), dict(loss=0.0, tokens=0, flops=0)
            self.lr = lr_at(step, self.args.lr, self.args.min_lr, self.args.warmup, self.args.max_iters)
            for g in self.opt.param_groups:
                g["lr"] = self.lr
            yield step

    def micro_batches(self, draw):
        """draw() for each of the step's --grad_accum micro-batches, in order, on every rank, so that every rank's
        generator stays in step; yields the results of this rank's micro-batches (k = rank, rank + world_size, ...)."""
        for k in range(self.args.grad_accum):
            batch = draw()
            if k % self.world_size == self.rank:
                yield batch

    def backward(self, loss, stats=None, *, tokens=0, flops=0):
        """loss.backward() for one micro-batch (its share 1/grad_accum of the step's mean), and the step's sums of
        the loss, the stats (tensors or numbers, each divided by grad_accum), the tokens and the training FLOPs."""
        (loss / self.args.grad_accum).backward()
        for k, v in {"loss": loss, **(stats or {})}.items():  # stats["loss"], if given, is what the step logs
            v = v.detach() if torch.is_tensor(v) else float(v)
            self.sums[k] = self.sums.get(k, 0) + v / self.args.grad_accum
        self.sums["tokens"] += tokens
        self.sums["flops"] += flops

    def update(self):
        """The optimizer step: the step's sums over all ranks, the NaN guard, the gradients summed over the ranks
        and clipped to --grad_clip, AdamW, and the step's record: step, loss, the stats, lr, grad_norm,
        tokens_per_s (the whole job's) and mfu (each GPU's, of the FLOPs passed; None off a GPU of known peak)."""
        sums = self.all_sum(self.sums)
        loss, tokens, flops = torch.as_tensor(sums.pop("loss")), sums.pop("tokens"), sums.pop("flops")
        if not torch.isfinite(loss):
            where = ("no checkpoint was written" if self.checkpoint is None else
                     f"the last good checkpoint is step {self.checkpoint} in {self.out_dir}")
            raise SystemExit(f"loss is {loss.item()} at step {self.step}: stopping; {where} (try a lower --lr, or "
                             f"--grad_clip).")
        if self.world_size > 1 and not self.fsdp:  # each rank holds its micro-batches' terms; FSDP has summed them
            works = [dist.all_reduce(q.grad, async_op=True) for q in self.model.parameters() if q.grad is not None]
            for work in works:
                work.wait()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        dt = time.time() - self.t0
        self.step_times.append(dt)
        rec = dict(step=self.step, loss=loss.item(), **{k: v.tolist() if torch.is_tensor(v) else v
                                                         for k, v in sums.items()},
                   lr=self.lr, grad_norm=(norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item(),
                   tokens_per_s=tokens / dt, mfu=mfu(flops / dt, self.device, self.world_size) if flops else None)
        return rec

    def timing(self):
        """The seconds this process trained: per step (mean and median: optimizer steps, not evaluations and
        saves) and since the first step."""
        times = getattr(self, "step_times", [])  # None: no step ran (a --resume with nothing left to train)
        return dict(step_seconds=float(np.mean(times)) if times else None,
                    step_seconds_median=float(np.median(times)) if times else None,
                    train_seconds_this_run=time.time() - getattr(self, "t_start", time.time()))

    def evaluate(self, fn):
        """fn()'s evaluation record (for this step's log record), kept as last_eval (the bar's, and final's)."""
        self.last_eval, self.last_eval_step = fn(), self.step
        return self.last_eval

    def final(self, fn):
        """The evaluation of the final weights: the last one when it was at the last step, else fn() (a --resume
        with nothing left to train)."""
        return self.last_eval if self.last_eval_step == self.args.max_iters - 1 else fn()

    def eval_due(self):
        """Whether this step evaluates: every --eval_interval steps, and the last."""
        return self.step % self.args.eval_interval == 0 or self.step == self.args.max_iters - 1

    def save_due(self, interval=None):
        """Whether this step writes a checkpoint: every `interval` steps (default --eval_interval), and the last."""
        return self.step % (interval or self.args.eval_interval) == 0 or self.step == self.args.max_iters - 1

    def save(self, model, tokenizer, *, extra=None, exact=None, state_dict=None):
        """The checkpoint of this step (save_checkpoint; extra: what --resume needs besides, default the settings)."""
        save_checkpoint(self.out_dir, model, tokenizer, self.opt, self.step, self.gen,
                        vars(self.args) if extra is None else extra, exact=exact, run=self, state_dict=state_dict)

    def log(self, rec, **postfix):
        """One record in log.jsonl (rank 0), and the bar's postfix."""
        self.log_file(**rec, world_size=self.world_size)
        self.at = rec["step"] + 1
        if postfix:
            self.bar.set_postfix(**postfix)

    def results(self, results):
        """results.json (rank 0), with the run's world_size and timing (seconds per step: mean and median); written
        last, it also says "this run finished"."""
        if self.is_main:
            text = json.dumps(dict(results, **self.timing(), world_size=self.world_size), indent=2) + "\n"
            (self.out_dir / "results.json").write_text(text)

    def task_eval(self, model, tokenizer, *, threshold=0.9):
        """--tasks: exact match of this step's weights on the first --tasks_n held-out prompts of each family, and
        tokens per forward, at `threshold` (AR: greedy), by `eval.py tasks` on a copy of the weights in
        out_dir/task_eval (as a checkpoint would store them; removed after) -> the flat record task_acc,
        task_acc_<family>, task_tpf (the mean over rows), task_pref (right with a full stop), and task_acc@T,
        task_tpf@T for each --tasks_also threshold T (DLMs); {} without --tasks
        and on ranks but 0. The child process (`tasks --ckpt -`: a checkpoint per line of its stdin) is started
        once and serves every evaluation of the run, so torch is imported once; its stderr goes to
        out_dir/task_eval.log, whose last lines a failure shows."""
        if not getattr(self.args, "tasks", None):
            return {}
        full = full_state_dict(model) if self.fsdp else None  # every rank takes part; rank 0 receives the tensors
        rec, d = {}, self.out_dir / "task_eval"
        if self.is_main:
            stored = model.config.torch_dtype  # save_pretrained records the dtype written: the run's stays
            model.save_pretrained(d, dtype=save_dtype(model.config, self.args.save_dtype), state_dict=full)
            model.config.torch_dtype = stored
            tokenizer.save_pretrained(d)
            thresholds = ",".join(f"{t:g}" for t in [threshold, *self.args.tasks_also])
            if self.tasks_child[1] != thresholds:
                self.tasks_child = (self.task_server(thresholds), thresholds)
            child = self.tasks_child[0]
            try:
                child.stdin.write(f"{d}\n")
                child.stdin.flush()
                line = child.stdout.readline()
            except BrokenPipeError:  # it has ended: its log says why
                line = ""
            if not line.startswith("result "):
                tail = " | ".join((self.out_dir / "task_eval.log").read_text().strip().splitlines()[-2:])
                raise SystemExit(f"{self.who}: --tasks: eval.py tasks failed: {tail}")
            runs = json.loads(line.removeprefix("result "))["runs"]
            rec = task_record(runs[0])
            for r in runs[1:]:  # --tasks_also
                rec.update({f"task_acc@{r['threshold']:g}": r["accuracy"],
                            f"task_tpf@{r['threshold']:g}": r["tokens_per_forward"]})
            shutil.rmtree(d)
        self.barrier()
        return rec

    def task_server(self, thresholds):
        """The child `eval.py tasks --ckpt -` for task_eval, ended (its stdin closed) when the run is."""
        with open(self.out_dir / "task_eval.log", "w") as log:  # the child writes to its own copy of the file
            child = subprocess.Popen([sys.executable, str(Path(__file__).with_name("eval.py")), "tasks", "--ckpt", "-",
                                      "--data", str(self.args.tasks), "--num_prompts", str(self.args.tasks_n),
                                      "--thresholds", thresholds, "--device", str(self.device)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                     env=dict(os.environ, WORLD_SIZE="1"))
        weakref.finalize(self, child.stdin.close)
        atexit.register(child.stdin.close)
        return child

    # ---- several processes -------------------------------------------------------------------------

    def all_sum(self, x):
        """x summed over the ranks: a tensor, a number, or a dict of them (summed entry by entry); x itself when
        alone. Each rank accumulates Σ over its micro-batches of value / grad_accum, so the sum over the ranks is
        the step's mean over all of its micro-batches: the number one process logs."""
        if self.world_size == 1:
            return x
        if isinstance(x, dict):
            return {k: self.all_sum(v) for k, v in x.items()}
        t = (x.detach() if torch.is_tensor(x) else torch.tensor(float(x), dtype=torch.float64)).to(self.device,
                                                                                                   copy=True)
        dist.all_reduce(t)
        return t.to(x.device) if torch.is_tensor(x) else t.item()

    def barrier(self):
        if self.world_size > 1:
            dist.barrier()

    def where(self):
        """The Ctrl-C message's end: the step the run is at, and the checkpoint --resume would continue from."""
        at = "" if self.at is None else f" at step {self.at}"
        if self.checkpoint is None:
            return at + (", before the first checkpoint: nothing to resume" if self.at is not None else "")
        last = f"{at}; the last checkpoint is step {self.checkpoint} in {self.out_dir}"
        return last + (" (weights only: not resumable)" if self.args.weights_only else ": rerun with --resume")


def task_record(res):
    """tasks.exact_match's result -> the flat record logged: task_acc, task_acc_<family>, task_tpf, task_pref."""
    return dict(task_acc=res["accuracy"], **{f"task_acc_{f}": r["accuracy"] for f, r in res["families"].items()},
                task_tpf=res["tokens_per_forward"], task_pref=res["preferred"])


def run_script(script, *args, quiet=False):
    """Another of the project's scripts (eval.py, sample.py) in a child process on this Python, its output written
    through this process's sys.stdout and sys.stderr when it ends (quiet: only if it fails); a failure ends this
    run with its last lines."""
    cmd = [sys.executable, str(Path(__file__).with_name(script)), *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, WORLD_SIZE="1"))
    if r.returncode or not quiet:
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
    if r.returncode:
        tail = " | ".join((r.stdout + r.stderr).strip().splitlines()[-2:])
        raise SystemExit(f"{' '.join(cmd[1:])} failed (exit {r.returncode}): {tail}")


def model_flops_per_token(model, seq_len):
    """Training FLOPs per token (forward + backward) of a Qwen3, as in the PaLM appendix / nanoGPT: 6 per weight
    (the input embedding of an untied model aside: a lookup) and 12 per layer, head dim and position of attention."""
    c = model.config
    n = model.num_params() - model.model.embed_tokens.weight.numel() * (not c.tie_word_embeddings)
    return 6 * n + 12 * c.num_hidden_layers * c.num_attention_heads * c.head_dim * seq_len


def flops_per_token(model, seq_len, *, forward_only=None):
    """Training FLOPs per token of model (model_flops_per_token), less 2 per frozen matrix weight (no weight
    gradient), plus the forward of a frozen model (a teacher, a reference: a third of its count)."""
    tied = model.config.tie_word_embeddings
    frozen = sum(q.numel() for k, q in model.named_parameters() if not q.requires_grad and (tied or "embed" not in k))
    extra = model_flops_per_token(forward_only, seq_len) / 3 if forward_only is not None else 0
    return model_flops_per_token(model, seq_len) - 2 * frozen + extra


def mfu(flops_per_s, device, world_size=1):
    """Model FLOPs utilisation of each GPU: flops_per_s is the whole job's training FLOPs per second (flops_per_token
    × tokens/s) over world_size GPUs' dense bf16 peak; None off a GPU of known peak."""
    peak = peak_flops(device)
    return None if peak is None else flops_per_s / (peak * world_size)


def param_group(model, name):
    """The parameter names of a group of a Qwen3: embed, attn, mlp, lm_head (tied: lm_head is embed)."""
    keys = {"embed": "model.embed_tokens.", "attn": ".self_attn.", "mlp": ".mlp.", "lm_head": "lm_head."}
    if name not in keys:
        raise ValueError(f"unknown parameter group {name!r}; choose from {sorted(keys)}")
    key = keys["embed" if name == "lm_head" and model.config.tie_word_embeddings else name]  # tied: one matrix
    return [n for n, _ in model.named_parameters() if key in n or n.startswith(key)]


def freeze(model, groups):
    """No gradients for the parameters of these groups (param_group): they stay as loaded."""
    names = {n for g in groups for n in param_group(model, g)}
    for n, p in model.named_parameters():
        p.requires_grad_(p.requires_grad and n not in names)


def configure_optimizer(model, lr, weight_decay, betas=(0.9, 0.95), device_type="cpu"):
    """AdamW; weight decay on matrices (and embeddings), none on norms and biases; frozen params skipped."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("every parameter is frozen: nothing to train")
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=device_type == "cuda")


def lr_at(step, lr, min_lr, warmup, max_iters):
    """Linear warmup, then cosine decay from lr to min_lr at max_iters."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, max_iters - warmup))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


# ---- checkpoints, models and data, checked ------------------------------------------------------------

def save_dtype(config, name="auto"):
    """The dtype checkpoints are stored in: --save_dtype, or (auto) the model's stored dtype (config.torch_dtype:
    bfloat16 for Qwen3, float32 for the tiny presets; float32 when it names no floating dtype)."""
    name = config.torch_dtype if name == "auto" else name
    dtype = getattr(torch, str(name), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


def save_checkpoint(out_dir, model, tokenizer, optimizer, step, gen, extra=None, *, exact=None, run=None,
                    state_dict=None):
    """Weights first, then the train state naming the same step: a crash between the two is detected.
    The weights are stored in save_dtype(); train_state.pt holds the fp32 value of each tensor that rounds (not of
    frozen ones loaded from the same dtype), so --resume is exact; exact: the names of the tensors whose exact values
    --resume needs (default: all; LoRA, which resumes from its adapters in `extra`, needs none). The tokenizer must be
    the model's own (config.tokenizer_sha256, recorded here for a new model) and that of any checkpoint already in
    out_dir: a checkpoint's tokenizer is never replaced. run (a Run): its settings: nothing at step 0 of a run longer
    than one step (those are the weights it started from), --save_dtype, --weights_only (no train_state.pt; a stale
    one is removed), --fsdp (the shards gathered to rank 0, which alone writes); the run records the checkpoint.
    state_dict: the weights to write instead of the model's own (dpo.py: LoRA merged into plain Qwen3 weights)."""
    args = run.args if run else None
    if step == 0 and args is not None and args.max_iters > 1:
        return
    out_dir = Path(out_dir)
    fix = "a checkpoint keeps the tokenizer it was trained with; use data prepared with it, or another --out_dir"
    same_tokenizer(tokenizer.fingerprint, "the tokenizer being saved", model.config.tokenizer_sha256, "the model", fix)
    same_tokenizer(tokenizer.fingerprint, "the tokenizer being saved", fingerprint_of(out_dir), str(out_dir), fix)
    model.config.tokenizer_sha256 = tokenizer.fingerprint
    dtype = save_dtype(model.config, getattr(args, "save_dtype", "auto"))
    full = full_state_dict(model) if run and run.fsdp else state_dict  # FSDP: every rank takes part, rank 0 receives
    if run is None or run.is_main:
        with interrupts_deferred():  # weights and train state of one step, or neither: --resume needs the pair
            model.save_pretrained(out_dir, metadata={"step": str(step)}, dtype=dtype, state_dict=full)
            tokenizer.save_pretrained(out_dir)
            if getattr(args, "weights_only", False):
                (out_dir / "train_state.pt").unlink(missing_ok=True)  # it would name another step than the weights
            else:
                write_train_state(out_dir, model, optimizer, step, gen, extra, exact, dtype)
            if run:  # before a deferred Ctrl-C is raised: its message names this checkpoint
                run.checkpoint = step
    if run:
        run.checkpoint = step
        run.barrier()  # no rank reads or resumes a checkpoint before it is whole


def write_train_state(out_dir, model, optimizer, step, gen, extra, exact, dtype):
    """train_state.pt: the optimizer, the step, the RNG states (one for all ranks: they draw the same numbers) and
    the fp32 value of each tensor in `exact` (all: None) that the stored dtype rounds."""
    tensors = model.state_dict()
    if model.config.tie_word_embeddings:
        del tensors["lm_head.weight"]  # the embedding matrix
    weights = {k: v for k, v in tensors.items() if (exact is None or k in exact) and v.dtype != dtype
               and not torch.equal(v.to(dtype).to(v.dtype), v)}  # the tensors the stored dtype rounds
    state = dict(step=step, optimizer=optimizer.state_dict(), gen=gen.get_state(), torch_rng=torch.get_rng_state(),
                 cuda_rng=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                 extra=extra or {}, weights=weights or None)  # weights: the exact values the stored ones round
    atomic_write(out_dir / "train_state.pt", lambda f: torch.save(state, f))


def full_state_dict(model):
    """The whole tensors of a model sharded by --fsdp, gathered to rank 0's CPU (the other ranks get {})."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


@contextlib.contextmanager
def interrupts_deferred():
    """Ctrl-C inside the block takes effect at its end (the main thread only: where Python handles signals). A
    process that ignores SIGINT (a background job of a script inherits SIG_IGN) keeps ignoring it."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) in (
            signal.SIG_IGN, None):  # None: a handler set outside Python, which signal.signal could not put back
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda *_: caught.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            raise KeyboardInterrupt


def changed_settings(saved, args):
    """{name: (saved, now)} of the settings in which this run differs from the checkpoint's extra=vars(args) (or
    extra=dict(args=vars(args), ...)), RESUMABLE ones and settings only one side has aside."""
    saved = saved.get("args", saved) if isinstance(saved.get("args"), dict) else saved
    now = vars(args)
    return {k: (saved[k], now[k]) for k in sorted(saved.keys() & now.keys() - RESUMABLE) if saved[k] != now[k]}


def load_checkpoint(out_dir, device):
    """-> (model, train state) of a run in out_dir, for --resume."""
    from safetensors import safe_open
    out_dir = Path(out_dir)
    if not (out_dir / "train_state.pt").is_file():
        raise SystemExit(f"--resume: no train_state.pt in {out_dir}; nothing to resume")
    try:
        state = torch.load(out_dir / "train_state.pt", map_location="cpu", weights_only=False)
        step = state["step"]
    except Exception as e:  # a truncated or foreign file: torch.load raises whatever its unpickler meets
        why = " ".join(str(e).split())[:80]
        raise SystemExit(f"--resume: {out_dir / 'train_state.pt'} cannot be read ({type(e).__name__}: {why}); "
                         f"delete {out_dir} and start again, or restore the file") from None
    with safe_open(out_dir / "model.safetensors", "pt") as f:
        saved_step = int((f.metadata() or {}).get("step", -1))
    if saved_step != step:
        raise SystemExit(f"--resume: weights are from step {saved_step} but train_state.pt from step {step} "
                         f"(the run was killed while saving); delete {out_dir} and start again")
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    model = Qwen3.from_pretrained(out_dir, device=device, dtype=torch.float32)
    if state.get("weights"):  # the exact fp32 values behind the stored tensors that rounded them (save_checkpoint)
        model.load_state_dict(state["weights"], strict=False)
    return model, state


def load_model(path, device, what, *, attn=None, like=None, dtype=torch.float32):
    """A Qwen3 checkpoint in `dtype` (fp32: the training scripts' weights; Run.frozen_dtype for a frozen teacher or
    reference), or a one-line exit naming what it is for. attn: the attention mode it must have ("causal": an AR
    model, e.g. a teacher); like: a model whose tokenizer it must share (a teacher's student). Both are checked
    before the weights are read."""
    try:
        config = Qwen3Config.load(path)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"{what} {path}: {e}")
    if attn is not None and config.attn != attn:
        source = f" (it was converted from {config.converted_from})" if config.converted_from else ""
        raise SystemExit(f"{what} {path} has attn={config.attn!r}, but an attn={attn!r} checkpoint is needed{source}; "
                         f"pass {'the AR checkpoint' if attn == 'causal' else f'a {attn} one'}")
    if like is not None:
        same_tokenizer(config.tokenizer_sha256, f"{what} {path}", like.config.tokenizer_sha256,
                       described(like.config)[0], "pass a checkpoint with the same tokenizer")
    try:
        return Qwen3.from_pretrained(path, device=device, dtype=dtype)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"{what} {path}: {e}")


def require_dlm(config, where, who, attn=None):
    """Exit with one line naming the fix unless `config` is a DLM made by convert.py (attn not causal, a mask token
    and a shift convention) of the kind `attn` ("bidirectional", "block" with a block size; None: either)."""
    ok = config.attn != "causal" and config.mask_token_id is not None and config.shift is not None
    if attn is not None:
        ok = ok and config.attn == attn and (attn != "block" or bool(config.block_size))
    if not ok:
        flags = CONVERT_FLAGS[attn or "bidirectional"]
        raise SystemExit(f"{who}: {where} is not a {attn + ' ' if attn else ''}DLM (attn={config.attn!r}, block_size="
                         f"{config.block_size}, mask_token_id={config.mask_token_id}, shift={config.shift}); make one "
                         f"with: python convert.py --ar AR_DIR --out_dir DLM_DIR {flags}")


def load_teacher(path, student, device, who, *, same_shapes=False, dtype=torch.float32, share=False):
    """The frozen AR teacher of a DLM student (eval mode, no gradients, in dtype: a Run's frozen_dtype): an
    attn="causal" checkpoint with the student's tokenizer and vocabulary, and with same_shapes its very tensor shapes
    (a teacher whose hidden states are compared with the student's). path None: the student's config.converted_from.
    share: the student's frozen tensors become the teacher's (share_frozen)."""
    path = path or student.config.converted_from
    if path is None:
        raise SystemExit(f"{who}: no --teacher given and the student's config has no converted_from")
    teacher = load_model(path, device, f"{who}: teacher", attn="causal", like=student, dtype=dtype)
    s = student.config
    if s.mask_token_id == teacher.config.vocab_size and s.vocab_size == rows_with_mask(s.mask_token_id):
        teacher = teacher.with_rows(s.vocab_size)  # the rows convert.py appended for the student's mask token
    teacher.requires_grad_(False).eval()
    def shape(m):
        return ({k: v.shape for k, v in m.state_dict().items()}, m.config.tie_word_embeddings)
    if teacher.config.vocab_size != student.config.vocab_size or same_shapes and shape(teacher) != shape(student):
        raise SystemExit(f"{who}: the teacher {path} and the student have different "
                         f"{'shapes' if same_shapes else 'vocabularies'}")
    return share_frozen(student, teacher, who) if share else teacher


def share_frozen(student, teacher, who="align"):
    """Every frozen student tensor made the teacher's too (checked equal first), so that memory holds one copy; a
    teacher in another dtype than the student (--frozen_dtype) keeps its own (a module cannot mix). -> teacher"""
    if teacher.lm_head.weight.dtype != student.lm_head.weight.dtype:
        return teacher
    for name, param in student.named_parameters():
        if not param.requires_grad:
            if not torch.equal(param, teacher.get_parameter(name)):
                raise SystemExit(f"{who}: frozen tensor {name} differs between student and teacher, so it cannot be "
                                 f"shared (a --scratch student?): freeze nothing, or start from the converted weights")
            module, _, leaf = name.rpartition(".")
            setattr(teacher.get_submodule(module), leaf, param)
    if teacher.config.tie_word_embeddings:
        teacher.lm_head.weight = teacher.model.embed_tokens.weight
    return teacher


def answers_only(text, tok, train_data, val_data, window, who):
    """--loss_after TEXT -> (sep_id, starts): the separator's id and, per split, the offsets at which a window of
    `window` tokens begins a document (data.document_starts). TEXT None -> (None, no starts: any offset)."""
    if text is None:
        return None, dict(train=None, val=None)
    sep = tok.encode(text)
    if len(sep) != 1 or not (train_data == sep[0]).any():
        raise SystemExit(f"{who}: --loss_after {text!r} is {len(sep)} tokens of the data's tokenizer and must be "
                         f"one that occurs in the training data; pass one such token's text")
    return sep[0], dict(train=data.document_starts(train_data, tok.eos_id, window),
                        val=data.document_starts(val_data, tok.eos_id, window))


def loss_targets(args, tok, train_data, val_data, window, who):
    """--loss_after TEXT or --assistant_only -> (answers, starts): the training split's tokens to train on (a 0/1
    array along it, for data.answer_batch; None: every token; evaluation masks every position) and, per split, the
    offsets at which a window of `window` tokens may begin (None: any). --loss_after: answers_only's rule, applied
    to the whole split at once (a window begins at a document, so it sees each answer's document from its start).
    --assistant_only: a chat dataset's assistant marks (data.load_roles), windows beginning at a conversation that
    fits whole in one (with its eos); the others are left out and counted."""
    if not getattr(args, "assistant_only", False):
        sep_id, starts = answers_only(args.loss_after, tok, train_data, val_data, window, who)
        if sep_id is None:
            return None, starts
        x = torch.from_numpy(np.asarray(train_data, dtype=np.int64))[None]  # the split as one row
        return data.after_separator(x, sep_id, tok.eos_id)[0].numpy(), starts
    if args.loss_after is not None:
        raise SystemExit(f"{who}: --assistant_only and --loss_after choose the trained tokens two ways: pass one")
    answers, starts = data.load_roles(args.data, "train"), {}
    if answers is None:
        raise SystemExit(f"{who}: --assistant_only needs a chat dataset ({args.data} holds plain documents): "
                         "python data.py --source CONVERSATIONS.jsonl --tokenizer CHECKPOINT --out_dir DIR")
    for split, d in (("train", train_data), ("val", val_data)):
        ends = np.flatnonzero(np.asarray(d) == tok.eos_id)  # each conversation's eos
        first = np.concatenate([[0], ends[:-1] + 1])  # and its first token
        fits = (ends - first + 1 <= window) & (first <= len(d) - window)
        if not fits.all():
            print(f"{who}: --assistant_only: {int((ends - first + 1 > window).sum())} of {len(first)} {split} "
                  f"conversations are longer than --seq_len {window} and {int((first > len(d) - window).sum())} "
                  f"begin in the split's last {window} tokens: left out")
        if not fits.any():
            raise SystemExit(f"{who}: --assistant_only: no {split} conversation fits --seq_len {window}")
        starts[split] = first[fits]
    return answers, starts


class Log:
    """One JSON object per line in out_dir/log.jsonl (written by rank 0), each with its time since the start. A
    resumed run continues the file, first cut back (atomically) to the records up to the checkpoint's step, so the
    steps after it are not logged twice."""

    def __init__(self, out_dir, resume, checkpoint=None, is_main=True):
        self.path, self.t0, self.is_main = Path(out_dir) / "log.jsonl", time.time(), is_main
        if not is_main:  # rank 0 logs for the job
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not resume:
            self.path.write_text("")
        elif self.path.exists() and checkpoint is not None:
            keep = [line for line in self.path.read_text().splitlines(keepends=True) if logged_step(line) <= checkpoint]
            atomic_write(self.path, lambda f: Path(f).write_text("".join(keep)))

    def __call__(self, **rec):
        rec.update(time=round(time.time() - self.t0, 3))
        if self.is_main:
            with open(self.path, "a") as f:
                f.write(json.dumps(rec) + "\n")


def logged_step(line):
    """The step of a log.jsonl line: -1 for a record without one, inf for a line cut off by a kill."""
    try:
        return json.loads(line).get("step", -1)
    except json.JSONDecodeError:
        return math.inf


def peak_flops(device):
    """Dense bf16 peak of the GPU, for MFU; None on CPU or an unknown GPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, flops in [("H200", 989e12), ("H100", 989e12), ("A100", 312e12), ("L40", 181e12), ("4090", 165e12),
                       ("A10", 125e12), ("L4", 121e12), ("3090", 71e12)]:
        if key in name:
            return flops
    return None
