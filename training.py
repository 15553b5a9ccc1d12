"""
What every training script here shares (pretrain.py, align.py, distill.py and merge.py's DPO),
so each method's script keeps only its algorithm:

- device / precision set-up: bf16 autocast on CUDA, fp32 on CPU, TF32 matmuls, seeded RNGs;
- AdamW with decoupled weight decay on matrices only, and a warmup + cosine learning-rate schedule;
- checkpoints that are a Hugging Face directory (config.json, model.safetensors, tokenizer) plus
  train_state.pt (optimizer, step, RNG states), every file written atomically, so `--resume`
  continues a killed run and reaches the same losses as an uninterrupted one;
- a JSONL log, a NaN/inf guard that names the step, and MFU against the GPU's bf16 peak.
"""
import contextlib
import json
import math
import random
import time
from pathlib import Path

import numpy as np
import torch

import data
from model import Qwen3, atomic_write
from tokenizer import Tokenizer


def add_loop_args(p, **defaults):
    """The training-loop flags every training script shares, with that script's defaults (max_iters, batch_size,
    seq_len, lr, min_lr, warmup, eval_interval, eval_batches)."""
    d = dict(grad_accum=1, weight_decay=0.1, grad_clip=1.0, **defaults)
    for name in ("max_iters", "batch_size", "seq_len", "grad_accum", "warmup", "eval_interval", "eval_batches"):
        p.add_argument(f"--{name}", type=int, default=d[name])
    for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
        p.add_argument(f"--{name}", type=float, default=d[name])
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--grad_checkpoint", action="store_true", help="activation checkpointing (memory for compute)")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--resume", action="store_true", help="continue the run in --out_dir")


def parse_loop_args(p):
    args = p.parse_args()
    for name in ("max_iters", "batch_size", "seq_len", "grad_accum", "lr", "eval_interval", "eval_batches"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be positive")
    return args


def setup(device="auto", seed=1337):
    """-> (device, autocast context). bf16 autocast on CUDA; plain fp32 on CPU (reproducible there)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda requested but no CUDA device is available")
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


def check_finite(loss, step, out_dir):
    if not torch.isfinite(loss):
        raise SystemExit(f"loss is {loss.item()} at step {step}: stopping. The last good checkpoint is in {out_dir} "
                         f"(try a lower --lr, or --grad_clip).")


def load_splits(data_dir, who):
    """(train, val) token arrays of a prepared dataset, or a one-line exit naming the script and the problem."""
    try:
        return data.load_split(data_dir, "train"), data.load_split(data_dir, "val")
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"{who}: {e}")


def load_tokenizer(path, config):
    """The tokenizer saved with a checkpoint (or a dataset), checked against the model's embedding rows."""
    tok = Tokenizer.from_pretrained(path)
    if tok.vocab_size > config.vocab_size:
        raise SystemExit(f"tokenizer in {path} uses {tok.vocab_size} ids but the model has only "
                         f"{config.vocab_size} embedding rows: they do not belong together")
    if config.mask_token_id is not None and config.mask_token_id < tok.vocab_size:
        raise SystemExit(f"mask_token_id {config.mask_token_id} is an ordinary token of the tokenizer in {path}")
    return tok


# ---- checkpoints ---------------------------------------------------------------------------------

def save_checkpoint(out_dir, model, tokenizer, optimizer, step, gen, extra=None):
    """Weights first, then the train state naming the same step: a crash between the two is detected."""
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, metadata={"step": str(step)})
    tokenizer.save_pretrained(out_dir)
    state = dict(step=step, optimizer=optimizer.state_dict(), gen=gen.get_state(), torch_rng=torch.get_rng_state(),
                 cuda_rng=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                 extra=extra or {})
    atomic_write(out_dir / "train_state.pt", lambda f: torch.save(state, f))


def resume_or_start(out_dir, resume, device, gen, fresh):
    """-> (model, train state or None, first step). --resume: the run in out_dir, its batch/mask generator
    restored; otherwise fresh() (the new model), refusing an out_dir that already holds a checkpoint."""
    if resume:
        model, state = load_checkpoint(out_dir, device)
        gen.set_state(state["gen"])
        return model, state, state["step"] + 1
    if (Path(out_dir) / "model.safetensors").exists():
        raise SystemExit(f"{out_dir} already holds a checkpoint: pass --resume to continue it, or another --out_dir")
    return fresh(), None, 0


def load_model(path, device, what):
    """A Qwen3 checkpoint in fp32 (the training scripts' weights), or a one-line exit naming what it is for."""
    try:
        return Qwen3.from_pretrained(path, device=device, dtype=torch.float32)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"{what} {path}: {e}")


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
    return Qwen3.from_pretrained(out_dir, device=device, dtype=torch.float32), state


class Log:
    """One JSON object per line in out_dir/log.jsonl (appended, so a resumed run continues the file)."""

    def __init__(self, out_dir, resume):
        self.path = Path(out_dir) / "log.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not resume:
            self.path.write_text("")
        self.t0 = time.time()

    def __call__(self, **rec):
        rec["time"] = round(time.time() - self.t0, 3)
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")


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
    peak = peak_flops(device)
    return None if peak is None else model.flops_per_token(seq_len) * tokens_per_s / peak
