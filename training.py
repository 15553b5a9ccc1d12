"""
What every training script here shares (pretrain.py, align.py, distill.py and merge.py's DPO),
so each method's script keeps only its algorithm:

- device / precision set-up: bf16 autocast on CUDA, fp32 on CPU, TF32 matmuls, seeded RNGs;
- AdamW with decoupled weight decay on matrices only, and a warmup + cosine learning-rate schedule;
- checkpoints that are a Hugging Face directory (config.json, model.safetensors in --save_dtype, tokenizer) plus
  train_state.pt (optimizer, step, RNG states, and the fp32 value of every tensor --save_dtype rounds), every file
  written atomically, so `--resume` continues a killed run and reaches the same losses as an uninterrupted one;
  --weights_only writes the Hugging Face directory alone (at Qwen3-0.6B 1.2 GB instead of 8.4 GB: AdamW's
  moments and the fp32 weights are 7.2 GB), for runs that will not be resumed;
- frozen models (a teacher, DPO's reference) in --frozen_dtype: bf16 on CUDA, fp32 on CPU by default;
- a JSONL log, a NaN/inf guard that names the step, and MFU against the GPU's bf16 peak;
- several processes under torchrun (setup reads RANK / WORLD_SIZE / LOCAL_RANK; one process: nothing changes).
  The number of processes does not change the optimisation: every rank draws the same global batch (the same
  generator, the same seed) and computes its share of the --grad_accum micro-batches (mine); the gradients are
  summed over the ranks before clipping (clip_grads), so a step is the one-process step up to float rounding.
  Only rank 0 prints, logs and saves; every rank evaluates (the same numbers as one process). --fsdp shards the
  trained model with FSDP2 (shard) instead of replicating it.

Bad input ends a run with one line, not a traceback, and loses nothing:
- a model and data (or a teacher and its student) tokenized differently are refused, by the tokenizer fingerprints
  datasets and checkpoints record (Tokenizer.fingerprint), and no checkpoint's tokenizer is ever overwritten;
- `load_model(..., attn="causal")` refuses a checkpoint of another kind (a DLM passed as the AR teacher);
- `--resume` refuses settings that differ from the checkpoint's (RESUMABLE ones aside) and cuts log.jsonl back to
  the checkpoint's step; Ctrl-C prints where the run stopped and the checkpoint `--resume` continues from.
The scripts need not pass anything for this: the run's settings, its last logged step and its last checkpoint are
kept in RUN by parse_loop_args, resume_or_start, Log and save_checkpoint.
"""
import atexit
import contextlib
import json
import math
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import data
from model import Qwen3, Qwen3Config
from tokenizer import atomic_write
from tokenizer import Tokenizer, fingerprint_of

# This process's training run so far: its settings (parse_loop_args), output directory, the next step to run (Log,
# resume_or_start) and the step of the last checkpoint written or resumed from (save_checkpoint, resume_or_start).
RUN = dict(args=None, out_dir=None, step=None, checkpoint=None)
# Settings a resumed run may change: how long, where and how fast it runs, what it prints; not what a step computes.
RESUMABLE = {"max_iters", "resume", "allow_changed_settings", "device", "compile", "grad_checkpoint", "seed",
             "eval_interval", "eval_batches", "samples", "sample_len", "save_dtype", "out_dir", "init", "weights_only",
             "frozen_dtype"}
# This process's place in a torchrun job (setup): its rank, the number of processes, whether the model is sharded.
DIST = dict(rank=0, world_size=1, fsdp=False, device=torch.device("cpu"))
SAVE_DTYPES = ("auto", "float32", "bfloat16", "float16")
FROZEN_DTYPES = ("auto", "float32", "bfloat16")


def add_loop_args(p, *, frozen=None, **defaults):
    """The training-loop flags every training script shares, with that script's defaults (max_iters, batch_size,
    seq_len, lr, min_lr, warmup, eval_interval, eval_batches). frozen: what the script's frozen model is (e.g. "the
    teacher"), for its --frozen_dtype flag (frozen_dtype); None: the script has none."""
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
    if frozen:
        p.add_argument("--frozen_dtype", default="auto", choices=FROZEN_DTYPES,
                       help=f"dtype {frozen} is held in; auto: bfloat16 on CUDA (half the memory of fp32; the "
                            f"training runs under bf16 autocast there anyway), float32 on CPU")


def parse_loop_args(p):
    """The parsed flags, checked; also kept in RUN as the run's settings (for --resume and save_checkpoint)."""
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
    RUN.update(args=args, out_dir=None, step=None, checkpoint=None)
    return args


def setup(device="auto", seed=1337):
    """-> (device, autocast context). bf16 autocast on CUDA; plain fp32 on CPU (reproducible there).
    Also installs the Ctrl-C message (interrupted) in place of a KeyboardInterrupt traceback. Under torchrun
    (WORLD_SIZE > 1) it joins the job: nccl on CUDA (the device cuda:LOCAL_RANK), gloo on a CPU; every rank but 0
    prints nothing; the process group is torn down at exit. One process: no process group."""
    sys.excepthook = interrupted
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
        DIST.update(rank=dist.get_rank(), world_size=world_size)
        if DIST["rank"] != 0:
            sys.stdout = open(os.devnull, "w")  # rank 0 speaks for the job
    DIST.update(device=device, fsdp=getattr(RUN["args"], "fsdp", False))
    if DIST["fsdp"] and DIST["world_size"] == 1:
        raise SystemExit("--fsdp shards the model over the processes of a torchrun job: run under torchrun "
                         "--nproc_per_node=N, or drop --fsdp")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        return device, torch.autocast("cuda", dtype=torch.bfloat16)
    return device, contextlib.nullcontext()


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


def optimizer(model, args, device, state=None):
    """AdamW for the run's --lr / --weight_decay (configure_optimizer), its state restored when resuming."""
    opt = configure_optimizer(model, args.lr, args.weight_decay, device_type=device.type)
    if state:
        opt.load_state_dict(state["optimizer"])
    return opt


def set_lr(opt, step, args):
    """Write this step's scheduled learning rate (lr_at with the run's flags) into every group; returns it."""
    lr = lr_at(step, args.lr, args.min_lr, args.warmup, args.max_iters)
    for g in opt.param_groups:
        g["lr"] = lr
    return lr


# ---- several processes (torchrun) ----------------------------------------------------------------

def is_main():
    """Whether this is rank 0: the process that prints, logs and saves (every process, alone)."""
    return DIST["rank"] == 0


def mine(k):
    """Whether micro-batch k of a step is this rank's: rank r takes k = r, r + world_size, ... (grad_accum /
    world_size of them). Every rank draws every micro-batch all the same, so all generators stay in step."""
    return k % DIST["world_size"] == DIST["rank"]


def all_sum(x):
    """x summed over the ranks: a tensor, a number, or a dict of them (summed entry by entry); x itself when
    alone. Each rank accumulates Σ over its micro-batches of value / grad_accum, so the sum over the ranks is the
    step's mean over all of its micro-batches: the number one process logs."""
    if DIST["world_size"] == 1:
        return x
    if isinstance(x, dict):
        return {k: all_sum(v) for k, v in x.items()}
    t = (x.detach() if torch.is_tensor(x) else torch.tensor(float(x), dtype=torch.float64)).to(DIST["device"],
                                                                                               copy=True)
    dist.all_reduce(t)
    return t.to(x.device) if torch.is_tensor(x) else t.item()


def barrier():
    if DIST["world_size"] > 1:
        dist.barrier()


def shard(model):
    """--fsdp: FSDP2 over all ranks, one unit per decoder layer, then the root (the embeddings, the final norm and
    lm_head, one tensor when tied), each rank holding 1/world_size of every tensor; call it before making the
    optimizer. Gradients are reduce-scattered in backward and summed over the ranks, as clip_grads sums DDP's.
    FSDP gathers the root's tensors around model.forward, which is every loss's, evaluation's and sampler's one
    entry point. Without --fsdp the model is returned as it is (replicated on every rank)."""
    if not DIST["fsdp"]:
        return model
    from torch.distributed.fsdp import fully_shard
    units = [*model.model.layers, model]
    for unit in units:
        fully_shard(unit)
    for unit in units:
        unit.set_gradient_divide_factor(1.0)  # a sum over the ranks, not their mean (see all_sum)
        unit.set_force_sum_reduction_for_comms(True)  # a plain sum: gloo has no pre-scaled one
    return model


def clip_grads(model, max_norm):
    """Sum the gradients over the ranks (each holds its micro-batches' terms of the step's mean gradient; FSDP has
    summed its shards in backward already), then clip their global norm to max_norm. -> the norm before clipping."""
    if DIST["world_size"] > 1 and not DIST["fsdp"]:
        works = [dist.all_reduce(q.grad, async_op=True) for q in model.parameters() if q.grad is not None]
        for work in works:
            work.wait()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return (norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item()


def write_results(out_dir, results):
    """results.json (rank 0), with the run's world_size; written last, it also says "this run finished"."""
    if is_main():
        text = json.dumps(dict(results, world_size=DIST["world_size"]), indent=2) + "\n"
        (Path(out_dir) / "results.json").write_text(text)


def check_finite(loss, step, out_dir):
    if not torch.isfinite(loss):
        last = RUN["checkpoint"]
        where = "no checkpoint was written" if last is None else f"the last good checkpoint is step {last} in {out_dir}"
        raise SystemExit(f"loss is {loss.item()} at step {step}: stopping; {where} (try a lower --lr, or --grad_clip).")


def interrupted(kind, value, tb):
    """sys.excepthook (setup): Ctrl-C ends a run with one line saying where it stopped and how to continue."""
    if not issubclass(kind, KeyboardInterrupt):
        return sys.__excepthook__(kind, value, tb)
    at = "" if RUN["step"] is None else f" at step {RUN['step']}"
    if RUN["checkpoint"] is None:
        rest = ", before the first checkpoint: nothing to resume" if RUN["step"] is not None else ""
    elif getattr(RUN["args"], "weights_only", False):
        rest = f"; the last checkpoint is step {RUN['checkpoint']} in {RUN['out_dir']} (weights only: not resumable)"
    else:
        rest = f"; the last checkpoint is step {RUN['checkpoint']} in {RUN['out_dir']}: rerun with --resume"
    print(f"{Path(sys.argv[0]).name}: interrupted{at}{rest}", file=sys.stderr)


def same_tokenizer(fp, where, want, want_where, fix):
    """Exit with one line naming both sides when two tokenizer fingerprints differ (None: unknown, not refused)."""
    if None not in (fp, want) and fp != want:
        raise SystemExit(f"tokenizer mismatch: {where} (sha256 {fp[:12]}) vs {want_where} (sha256 {want[:12]}); {fix}")


def described(config):
    """-> ("the model DIR", DIR) for messages; DIR is a placeholder for a model not read from a directory."""
    return (f"the model {config.path}", config.path) if config.path else ("the model", "MODEL_DIR")


def prepare_with(model_dir):
    return f"prepare the data with the model's tokenizer: python data.py --tokenizer {model_dir} --out_dir DIR"


def load_splits(data_dir, who, *, like=None):
    """(train, val) token arrays of a prepared dataset, or a one-line exit naming the script and the problem: a
    missing or inconsistent dataset, a split not longer than the run's --seq_len, or data tokenized with another
    tokenizer than the model `like` was trained with."""
    try:
        splits = data.load_split(data_dir, "train"), data.load_split(data_dir, "val")
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"{who}: {e}")
    seq_len = getattr(RUN["args"], "seq_len", None)
    for name, split in zip(("train", "val"), splits):
        if seq_len is not None and len(split) <= seq_len:
            raise SystemExit(f"{who}: the {name} split of {data_dir} has {len(split):,} tokens, not more than "
                             f"--seq_len {seq_len}; use a smaller --seq_len (or more data)")
    if like is not None:
        model, model_dir = described(like.config)
        same_tokenizer(fingerprint_of(data_dir), f"{who}: the data {data_dir}", like.config.tokenizer_sha256, model,
                       prepare_with(model_dir))
    return splits


def load_tokenizer(path, config):
    """The tokenizer saved with a checkpoint (or a dataset), checked against the model: its embedding rows, its mask
    token, and the tokenizer the model was trained with (config.tokenizer_sha256); a one-line exit otherwise."""
    try:
        tok = Tokenizer.from_pretrained(path)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"tokenizer: {e}")
    if config.path is not None and Path(path).resolve() == Path(config.path).resolve():  # the checkpoint's own
        same_tokenizer(tok.fingerprint, f"the tokenizer files in {path}", config.tokenizer_sha256,
                       "its config.json", "they were replaced after the checkpoint was saved; restore them")
    model, model_dir = described(config)
    same_tokenizer(tok.fingerprint, str(path), config.tokenizer_sha256, model, prepare_with(model_dir))
    if tok.vocab_size > config.vocab_size:
        raise SystemExit(f"tokenizer in {path} uses {tok.vocab_size} ids but the model has only "
                         f"{config.vocab_size} embedding rows: they do not belong together")
    if config.mask_token_id is not None and config.mask_token_id < tok.vocab_size:
        raise SystemExit(f"mask_token_id {config.mask_token_id} is an ordinary token of the tokenizer in {path}")
    return tok


# ---- checkpoints ---------------------------------------------------------------------------------

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


def save_dtype(config, args):
    """The dtype checkpoints are stored in: --save_dtype, or (auto) the model's stored dtype (config.torch_dtype:
    bfloat16 for Qwen3, float32 for the tiny presets; float32 when it names no floating dtype)."""
    name = getattr(args, "save_dtype", "auto")
    name = config.torch_dtype if name == "auto" else name
    dtype = getattr(torch, str(name), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


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


def save_checkpoint(out_dir, model, tokenizer, optimizer, step, gen, extra=None, *, exact=None):
    """Weights first, then the train state naming the same step: a crash between the two is detected.
    Nothing at step 0 of a run longer than one step (those are the weights it started from). The weights are stored
    in save_dtype(); train_state.pt holds the fp32 value of each tensor that rounds (not of frozen ones loaded from
    the same dtype), so --resume is exact; exact: the names of the tensors whose exact values --resume needs
    (default: all; LoRA, which resumes from its adapters in `extra`, needs none). With --weights_only there is no
    train_state.pt (a stale one is removed). The tokenizer must be the model's own (config.tokenizer_sha256,
    recorded here for a new model) and that of any checkpoint already in out_dir: a checkpoint's tokenizer is never
    replaced."""
    args = RUN["args"]
    if step == 0 and args is not None and args.max_iters > 1:
        return
    out_dir = Path(out_dir)
    fix = "a checkpoint keeps the tokenizer it was trained with; use data prepared with it, or another --out_dir"
    same_tokenizer(tokenizer.fingerprint, "the tokenizer being saved", model.config.tokenizer_sha256, "the model", fix)
    same_tokenizer(tokenizer.fingerprint, "the tokenizer being saved", fingerprint_of(out_dir), str(out_dir), fix)
    model.config.tokenizer_sha256 = tokenizer.fingerprint
    dtype = save_dtype(model.config, args)
    full = full_state_dict(model) if DIST["fsdp"] else None  # every rank takes part; rank 0 receives the tensors
    if is_main():
        with interrupts_deferred():  # weights and train state of one step, or neither: --resume needs the pair
            model.save_pretrained(out_dir, metadata={"step": str(step)}, dtype=dtype, state_dict=full)
            tokenizer.save_pretrained(out_dir)
            if getattr(args, "weights_only", False):
                (out_dir / "train_state.pt").unlink(missing_ok=True)  # it would name another step than the weights
            else:
                write_train_state(out_dir, model, optimizer, step, gen, extra, exact, dtype)
    RUN.update(out_dir=out_dir, checkpoint=step)
    barrier()  # no rank reads or resumes a checkpoint before it is whole


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


def changed_settings(saved, args):
    """{name: (saved, now)} of the settings in which this run differs from the checkpoint's extra=vars(args) (or
    extra=dict(args=vars(args), ...)), RESUMABLE ones and settings only one side has aside."""
    saved = saved.get("args", saved) if isinstance(saved.get("args"), dict) else saved
    now = vars(args)
    return {k: (saved[k], now[k]) for k in sorted(saved.keys() & now.keys() - RESUMABLE) if saved[k] != now[k]}


def resume_or_start(out_dir, resume, device, gen, fresh):
    """-> (model, train state or None, first step). --resume: the run in out_dir, its batch/mask generator
    restored, refused when the run's settings (RUN) differ from the checkpoint's (unless --allow_changed_settings);
    otherwise fresh() (the new model), refusing an out_dir that already holds a checkpoint."""
    RUN.update(out_dir=out_dir, step=0)
    if resume:
        model, state = load_checkpoint(out_dir, device)
        args = RUN["args"]
        if args is not None and not args.allow_changed_settings and (diff := changed_settings(state["extra"], args)):
            changes = ", ".join(f"--{k} {a} (now {b})" for k, (a, b) in diff.items())
            raise SystemExit(f"--resume: the run in {out_dir} was made with {changes}; rerun with its settings, or "
                             f"pass --allow_changed_settings to continue with the new ones")
        gen.set_state(state["gen"])
        RUN.update(step=state["step"] + 1, checkpoint=state["step"])
        return model, state, state["step"] + 1
    if (Path(out_dir) / "model.safetensors").exists():
        raise SystemExit(f"{out_dir} already holds a checkpoint: pass --resume to continue it, or another --out_dir")
    return fresh(), None, 0


def frozen_dtype(device):
    """The dtype of the run's frozen model (--frozen_dtype; auto: bfloat16 on CUDA, float32 elsewhere)."""
    name = getattr(RUN["args"], "frozen_dtype", "auto")
    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return getattr(torch, name)


def load_model(path, device, what, *, attn=None, like=None, dtype=torch.float32):
    """A Qwen3 checkpoint in `dtype` (fp32: the training scripts' weights; frozen_dtype() for a frozen teacher or
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


CONVERT_FLAGS = {"bidirectional": "--attn bidirectional", "block": "--attn block --block_size 4"}


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


def load_teacher(path, student, device, who, *, same_shapes=False):
    """The frozen AR teacher of a DLM student (eval mode, no gradients, in frozen_dtype()): an attn="causal"
    checkpoint with the student's tokenizer and vocabulary, and with same_shapes its very tensor shapes (a teacher
    whose hidden states are compared with the student's). path None: the student's config.converted_from."""
    path = path or student.config.converted_from
    if path is None:
        raise SystemExit(f"{who}: no --teacher given and the student's config has no converted_from")
    teacher = load_model(path, device, f"{who}: teacher", attn="causal", like=student, dtype=frozen_dtype(device))
    teacher.requires_grad_(False).eval()
    shape = lambda m: ({k: v.shape for k, v in m.state_dict().items()}, m.config.tie_word_embeddings)
    if teacher.config.vocab_size != student.config.vocab_size or same_shapes and shape(teacher) != shape(student):
        raise SystemExit(f"{who}: the teacher {path} and the student have different "
                         f"{'shapes' if same_shapes else 'vocabularies'}")
    return teacher


def load_checkpoint(out_dir, device):
    """-> (model, train state) of a run in out_dir, for --resume."""
    from safetensors import safe_open
    out_dir = Path(out_dir)
    if not (out_dir / "train_state.pt").is_file():
        raise SystemExit(f"--resume: no train_state.pt in {out_dir}; nothing to resume")
    state = torch.load(out_dir / "train_state.pt", map_location="cpu", weights_only=False)
    with safe_open(out_dir / "model.safetensors", "pt") as f:
        saved_step = int((f.metadata() or {}).get("step", -1))
    if saved_step != state["step"]:
        raise SystemExit(f"--resume: weights are from step {saved_step} but train_state.pt from step {state['step']} "
                         f"(the run was killed while saving); delete {out_dir} and start again")
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    model = Qwen3.from_pretrained(out_dir, device=device, dtype=torch.float32)
    if state.get("weights"):  # the exact fp32 values behind the stored tensors that rounded them (save_checkpoint)
        model.load_state_dict(state["weights"], strict=False)
    return model, state


class Log:
    """One JSON object per line in out_dir/log.jsonl, each with the run's world_size (written by rank 0). A resumed
    run continues the file, first cut back (atomically) to the records up to the checkpoint's step, so the steps
    after it are not logged twice. Each record's step is also RUN's, for the Ctrl-C message."""

    def __init__(self, out_dir, resume):
        self.path, self.t0 = Path(out_dir) / "log.jsonl", time.time()
        if not is_main():  # rank 0 logs for the job
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not resume:
            self.path.write_text("")
        elif self.path.exists() and RUN["checkpoint"] is not None:
            keep = [line for line in self.path.read_text().splitlines(keepends=True)
                    if logged_step(line) <= RUN["checkpoint"]]
            atomic_write(self.path, lambda f: Path(f).write_text("".join(keep)))

    def __call__(self, **rec):
        rec.update(world_size=DIST["world_size"], time=round(time.time() - self.t0, 3))
        if is_main():
            with open(self.path, "a") as f:
                f.write(json.dumps(rec) + "\n")
        if "step" in rec:
            RUN["step"] = rec["step"] + 1


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


def mfu(model, tokens_per_s, seq_len, device):
    """Model FLOPs utilisation of each GPU: tokens_per_s is the whole job's."""
    peak = peak_flops(device)
    return None if peak is None else model.flops_per_token(seq_len) * tokens_per_s / (peak * DIST["world_size"])
