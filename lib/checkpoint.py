"""
A training run's checkpoint: the weights and train state of one step, written together for an exact --resume (a
Ctrl-C waits for both), and the tokenizer a checkpoint or a dataset must share with its model. The Hugging Face
directory format itself (config.json, safetensors) is lib/hf.py.
"""
import contextlib
import signal
import threading
from pathlib import Path

import torch

from lib.cli import atomic_write
from lib.tokenizer import fingerprint_of


# ---- a training run's checkpoint: the weights and train state of one step, for an exact --resume ---------------------

# Settings a resumed run may change: how long, where and how fast it runs, what it prints; not what a step computes.
RESUMABLE = {"max_iters", "resume", "allow_changed_settings", "device", "compile", "grad_checkpoint", "seed",
             "eval_interval", "eval_batches", "samples", "sample_len", "save_dtype", "out_dir", "init", "weights_only",
             "frozen_dtype", "time_budget"}


def save_dtype(config, name="auto"):
    """The dtype checkpoints are stored in: --save_dtype, or (auto) the model's stored dtype (config.torch_dtype:
    bfloat16 for Qwen3, float32 for the tiny presets; float32 when it names no floating dtype)."""
    name = config.torch_dtype if name == "auto" else name
    dtype = getattr(torch, str(name), None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


def save_checkpoint(out_dir, model, tok, optimizer, step, gen, extra=None, *, exact=None, dtype=None,
                    weights_only=False, state_dict=None):
    """Weights first, then the train state naming the same step: a crash between the two is detected (read_train_state),
    and a Ctrl-C waits for both. The weights are stored in dtype (default save_dtype's); train_state.pt holds the
    fp32 value of each tensor that rounds (not of frozen ones loaded from the same dtype), so --resume is exact;
    exact: the names of the tensors whose exact values --resume needs (default: all; LoRA, which resumes from its
    adapters in `extra`, needs none). weights_only: no train_state.pt (a stale one is removed). The caller checks
    the tokenizer first (check_saving: never another one than the model's, nor over a checkpoint's own).
    state_dict: the weights to write instead of the model's own (dpo.py: LoRA merged into plain Qwen3 weights;
    --fsdp: the gathered shards)."""
    out_dir = Path(out_dir)
    dtype = dtype or save_dtype(model.config)
    with interrupts_deferred():  # weights and train state of one step, or neither: --resume needs the pair
        model.save_pretrained(out_dir, metadata={"step": str(step)}, dtype=dtype, state_dict=state_dict)
        tok.save_pretrained(out_dir)
        if weights_only:
            (out_dir / "train_state.pt").unlink(missing_ok=True)  # it would name another step than the weights
        else:
            write_train_state(out_dir, model, optimizer, step, gen, extra, exact, dtype)


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


def read_train_state(out_dir, args=None):
    """-> the train state of the run in out_dir (write_train_state's dict), checked to name the step of the weights
    beside it and, given the new run's args, its settings (changed_settings), with the RNGs restored; a one-line exit
    naming the fix when it is missing, unreadable, of another step or of other settings. The caller loads the
    weights, then state["weights"] over them (the exact fp32 values)."""
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
    if args is not None and (diff := changed_settings(state["extra"], args)):
        changes = ", ".join(f"--{k} {a} (now {b})" for k, (a, b) in diff.items())
        raise SystemExit(f"--resume: the run in {out_dir} was made with {changes}; rerun with its settings, or pass "
                         f"--allow_changed_settings to continue with the new ones")
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return state


def changed_settings(saved, args):
    """{name: (saved, now)} of the settings in which this run differs from the checkpoint's extra=vars(args) (or
    extra=dict(args=vars(args), ...)), RESUMABLE ones and settings only one side has aside."""
    saved = saved.get("args", saved) if isinstance(saved.get("args"), dict) else saved
    now = vars(args)
    return {k: (saved[k], now[k]) for k in sorted(saved.keys() & now.keys() - RESUMABLE) if saved[k] != now[k]}


@contextlib.contextmanager
def interrupts_deferred():
    """Ctrl-C inside the block takes effect at its end (the main thread only: where Python handles signals); inside
    another such block, at the outer one's end. A process that ignores SIGINT (a background job of a script inherits
    SIG_IGN) keeps ignoring it."""
    handler = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or handler in (signal.SIG_IGN, None) or getattr(
            handler, "deferring", False):  # None: a handler set outside Python, which signal.signal could not put back
        yield
        return
    caught = []

    def defer(*_):
        caught.append(True)
    defer.deferring = True
    previous = signal.signal(signal.SIGINT, defer)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            raise KeyboardInterrupt


# ---- a checkpoint's or a dataset's tokenizer, checked against the model ------------------------------------

def trained_with(config):
    """The fingerprint of the tokenizer a model was trained with: config.tokenizer_sha256, or for a checkpoint that
    records none (written before fingerprints were, or downloaded) that of the tokenizer files in its directory,
    then kept in config; None when unknown."""
    if config.tokenizer_sha256 is None and config.path is not None:
        config.tokenizer_sha256 = fingerprint_of(config.path)
    return config.tokenizer_sha256


def check_saving(tok, config, out_dir):
    """Exit with one line unless tok may be saved with a model of this config into out_dir: it must be the model's
    own tokenizer (trained_with) and that of any checkpoint already in out_dir (never replaced). Then config records
    it (a new model's)."""
    fix = "a checkpoint keeps the tokenizer it was trained with; use data prepared with it, or another --out_dir"
    same_tokenizer(tok.fingerprint, "the tokenizer being saved", trained_with(config), "the model", fix)
    same_tokenizer(tok.fingerprint, "the tokenizer being saved", fingerprint_of(out_dir), str(out_dir), fix)
    config.tokenizer_sha256 = tok.fingerprint


def same_tokenizer(fp, where, want, want_where, fix):
    """Exit with one line naming both sides when two tokenizer fingerprints differ (None: unknown, not refused)."""
    if None not in (fp, want) and fp != want:
        raise SystemExit(f"tokenizer mismatch: {where} (sha256 {fp[:12]}) vs {want_where} (sha256 {want[:12]}); {fix}")


def described(config):
    """-> ("the model DIR", DIR) for messages; DIR is a placeholder for a model not read from a directory."""
    return (f"the model {config.path}", config.path) if config.path else ("the model", "MODEL_DIR")


def prepare_with(model_dir):
    return f"prepare the data with the model's tokenizer: python -m lib.corpus --tokenizer {model_dir} --out_dir DIR"
