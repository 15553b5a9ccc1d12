"""
The training machinery every training script shares, behind one object, `Run`: a script keeps its algorithm and a
loop a reader sees top to bottom (the checkpoint files: lib/checkpoint.py; several processes: lib/runner.py):

    run = training.Run(args, "align")              # device, precision, seeds, torchrun, the Ctrl-C message
    model = run.prepare(run.start(fresh))          # fresh() or --resume's model; --fsdp, AdamW (resumed), --compile
    for step in run.steps():                       # each step's learning rate set; a progress bar
        for batch in run.micro_batches(draw):      # every rank draws every micro-batch and computes its own
            with run.ctx:
                loss, stats = my_loss(model, *batch)
            run.backward(loss, stats, tokens=n, flops=f)
        rec = run.update()                         # sum over ranks, NaN guard, clip, AdamW step, speed, MFU
        if run.eval_due(): rec.update(run.evaluate(evaluate))   # kept: run.final(evaluate) reuses the last
        if run.save_due(): run.save(model, tok)    # atomic; --resume continues from it exactly
        run.log(rec)                               # log.jsonl and the bar
    run.results(dict(**run.final(evaluate), ...))  # results.json: the run finished
"""
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from model import Qwen3, Qwen3Config
from lib import checkpoint
from lib import cli
from lib import data
from lib import runner
from lib.checkpoint import check_saving, described, prepare_with, same_tokenizer, save_dtype, trained_with
from lib.cli import atomic_write
from lib.hf import resolve, rows_with_mask
from lib.tokenizer import Tokenizer


class Run:
    """One training run: its settings (args), device and autocast context (ctx), its place in a torchrun job (rank,
    world_size, fsdp), the generator of all its randomness (gen: batches, masks, rollouts), the model it trains, the
    optimizer and schedule, log.jsonl, checkpoints and --resume. A script makes one and runs its own loop (the
    module docstring); the Run keeps the bookkeeping: the step the run is at and its last checkpoint, for --resume,
    the NaN guard and the Ctrl-C message. generator: "cpu" (the default) or "device" (a generator on the device)."""

    def __init__(self, args, who, *, generator="cpu"):
        self.args, self.who, self.out_dir = args, who, Path(args.out_dir)
        self.device, self.ctx = cli.setup(args.device, args.seed, getattr(args, "autocast", "auto"))
        self.rank, self.world_size = runner.rank_and_size()
        self.fsdp, self.is_main = args.fsdp, self.rank == 0
        if self.fsdp and self.world_size == 1:
            raise SystemExit("--fsdp shards the model over the processes of a torchrun job: run under torchrun "
                             "--nproc_per_node=N, or drop --fsdp")
        self.gen = torch.Generator(self.device if generator == "device" else "cpu").manual_seed(args.seed)
        self.at, self.checkpoint, self.state, self.first = None, None, None, 0  # the next step; the last checkpoint
        self.last_eval, self.last_eval_step, self.tasks = {}, None, None  # tasks: task_eval's --tasks child
        sys.excepthook = lambda kind, value, tb: cli.interrupted(kind, value, tb, self.where())
        frozen = getattr(args, "frozen_dtype", "auto")
        self.frozen_dtype = ((torch.bfloat16 if self.device.type == "cuda" else torch.float32) if frozen == "auto"
                             else getattr(torch, frozen))  # of a teacher or DPO's reference

    # ---- set-up ------------------------------------------------------------------------------------

    def prompt_pool(self, tok, span, *, prompts, data_dir, n, like):
        """data.prompt_pool with --seq_len tokens a prompt (the data's tokenizer checked to be like's)."""
        return data.prompt_pool(tok, span, prompts=prompts, data_dir=data_dir, seq_len=self.args.seq_len, n=n,
                                like=like, who=self.who)

    def start(self, fresh):
        """-> the model to train: with --resume the run in out_dir (its weights, generator, step and train state
        restored, refused when the run's settings differ from the checkpoint's unless --allow_changed_settings);
        otherwise fresh() (the new model), refusing an out_dir that already holds a checkpoint."""
        args, self.at = self.args, 0
        if not args.resume:
            if (self.out_dir / "model.safetensors").exists():
                raise SystemExit(f"{self.out_dir} already holds a checkpoint: pass --resume to continue it, or "
                                 f"another --out_dir")
            return fresh()
        self.state = checkpoint.read_train_state(self.out_dir, None if args.allow_changed_settings else args)
        model = Qwen3.from_pretrained(self.out_dir, device=self.device, dtype=torch.float32)
        if self.state.get("weights"):  # the exact fp32 values behind the stored tensors that rounded them
            model.load_state_dict(self.state["weights"], strict=False)
        self.gen.set_state(self.state["gen"])
        self.checkpoint = self.state["step"]
        self.at = self.first = self.state["step"] + 1
        if self.first >= args.max_iters:
            print(f"--resume: the checkpoint in {self.out_dir} is step {self.state['step']}, the last of --max_iters "
                  f"{args.max_iters} or past it: nothing left to train")
        return model

    def prepare(self, model, *, compile_too=(), dynamic=None):
        """Make `model` the one trained: sharded (--fsdp: runner.shard), activation checkpointing
        (--grad_checkpoint), AdamW (its state restored on --resume), torch.compile in place (--compile: model and
        compile_too, e.g. a teacher; dynamic=True when lengths change from step to step), and the log. -> model."""
        self.model = model
        if self.fsdp:
            runner.shard(model)
        model.model.gradient_checkpointing = self.args.grad_checkpoint
        self.opt = configure_optimizer(model, self.args.lr, self.args.weight_decay)
        if self.state:
            self.opt.load_state_dict(self.state["optimizer"])
        if self.args.compile:  # in place: parameter names, and so checkpoints, are unchanged
            for m in (model, *compile_too):
                m.model.compile(dynamic=dynamic)
        self.log_file = Log(self.out_dir, self.args.resume, self.checkpoint, self.is_main)
        return model

    # ---- the loop ----------------------------------------------------------------------------------

    def steps(self):
        """The steps left to run, each with its scheduled learning rate set (lr_at) and a progress bar. --time_budget:
        the cosine runs over the budget's seconds (or the steps, whichever ends first), and the step after which the
        next would end past the budget is the last (max_iters becomes its number: evaluated and saved as the last)."""
        self.bar = tqdm(range(self.first, self.args.max_iters), initial=self.first, total=self.args.max_iters,
                        desc=self.who, disable=not self.is_main)
        self.t_start, self.step_times = time.time(), []
        budget, t_warm = 60 * (getattr(self.args, "time_budget", None) or 0), None  # seconds; 0: none
        for step in self.bar:
            if step >= self.args.max_iters:  # the budget's last step is done
                break
            elapsed, frac = time.time() - self.t_start, None
            if budget:
                t_warm = elapsed if step == max(self.first, self.args.warmup) else t_warm
                frac = None if t_warm is None else (elapsed - t_warm) / max(1e-9, budget - t_warm)
                # the next step would end past the budget (judged from the second step on: the first one compiles)
                late = len(self.step_times) > 1 and elapsed + 2 * self.step_times[-1] > budget
                if runner.all_sum(float(late), self.device) > 0:  # every rank stops at the same step
                    self.args.max_iters = step + 1
                    self.bar.total = step + 1
            self.step, self.t0, self.sums = step, time.time(), dict(loss=0.0, tokens=0, flops=0)
            self.lr = lr_at(step, self.args.lr, self.args.min_lr, self.args.warmup, self.args.max_iters, frac)
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
        sums = runner.all_sum(self.sums, self.device)
        loss, tokens, flops = torch.as_tensor(sums.pop("loss")), sums.pop("tokens"), sums.pop("flops")
        if not torch.isfinite(loss):
            where = ("no checkpoint was written" if self.checkpoint is None else
                     f"the last good checkpoint is step {self.checkpoint} in {self.out_dir}")
            raise SystemExit(f"loss is {loss.item()} at step {self.step}: stopping; {where} (try a lower --lr, or "
                             f"--grad_clip).")
        if self.world_size > 1 and not self.fsdp:  # each rank holds its micro-batches' terms; FSDP has summed them
            runner.sum_gradients(self.model)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        dt = time.time() - self.t0
        self.step_times.append(dt)
        stats = {k: v.tolist() if torch.is_tensor(v) else v for k, v in sums.items()}
        grad_norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # --fsdp: a sharded DTensor
        mfu = runner.mfu(flops / dt, self.device, self.world_size) if flops else None
        return dict(step=self.step, loss=loss.item(), **stats, lr=self.lr, grad_norm=grad_norm.item(),
                    tokens_per_s=tokens / dt, mfu=mfu, step_seconds=dt)

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

    def save_due(self, interval=None, *, ends=False):
        """Whether this step writes a checkpoint: every `interval` steps (default --eval_interval), and the last. The
        steps that are multiples of it, or (ends) the steps that complete one (rl.py: a batch of rollouts ends)."""
        return (self.step + ends) % (interval or self.args.eval_interval) == 0 or self.step == self.args.max_iters - 1

    def save(self, model, tokenizer, *, extra=None, exact=None, state_dict=None):
        """The checkpoint of this step (checkpoint.save_checkpoint, by rank 0; with --fsdp every rank gathers the
        shards), in --save_dtype, --weights_only or with train_state.pt; extra: what --resume needs besides (default
        the settings). None at step 0 of a run longer than one step: those are the weights it started from."""
        if self.step == 0 and self.args.max_iters > 1:
            return
        check_saving(tokenizer, model.config, self.out_dir)
        full = runner.full_state_dict(model) if self.fsdp else state_dict  # FSDP: rank 0 receives the tensors
        if self.is_main:
            with checkpoint.interrupts_deferred():  # a Ctrl-C while saving names this checkpoint
                checkpoint.save_checkpoint(self.out_dir, model, tokenizer, self.opt, self.step, self.gen,
                                           vars(self.args) if extra is None else extra, exact=exact,
                                           dtype=save_dtype(model.config, self.args.save_dtype),
                                           weights_only=self.args.weights_only, state_dict=full)
                self.checkpoint = self.step  # inside: a Ctrl-C deferred by the save fires after this, naming it
        else:
            self.checkpoint = self.step  # the other ranks: the NaN guard's message names it
        runner.barrier()  # no rank reads or resumes a checkpoint before it is whole

    def snapshot(self, model, tokenizer, state_dict=None):
        """--snapshots: after each listed number of steps, the weights alone (in --save_dtype) in out_dir/step-N, and
        snapshot.json with the seconds the steps of this process took so far (evaluations and saves not counted): a
        curve's point; under --time_budget the budget's last step is one too. state_dict: a function giving the
        weights to write instead of the model's (called only then)."""
        if not self.snapshot_due():
            return
        full = runner.full_state_dict(model) if self.fsdp else state_dict() if state_dict else None
        where = self.out_dir / f"step-{self.step + 1}"
        if self.is_main:
            check_saving(tokenizer, model.config, where)
            checkpoint.save_checkpoint(where, model, tokenizer, None, self.step, self.gen, weights_only=True,
                                       dtype=save_dtype(model.config, self.args.save_dtype), state_dict=full)
            (where / "snapshot.json").write_text(json.dumps(dict(step=self.step + 1,
                                                                 train_seconds=sum(self.step_times))) + "\n")
        runner.barrier()

    def snapshot_due(self):
        """This step's number is in --snapshots, or it is --time_budget's last step (where --snapshots is given)."""
        budget_end = getattr(self.args, "time_budget", None) and self.step + 1 == self.args.max_iters
        return self.step + 1 in self.args.snapshots or bool(budget_end and self.args.snapshots)

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

    def where(self):
        """The Ctrl-C message's end: the step the run is at, and the checkpoint --resume would continue from."""
        at = "" if self.at is None else f" at step {self.at}"
        if self.checkpoint is None:
            return at + (", before the first checkpoint: nothing to resume" if self.at is not None else "")
        last = f"{at}; the last checkpoint is step {self.checkpoint} in {self.out_dir}"
        return last + (" (weights only: not resumable)" if self.args.weights_only else ": rerun with --resume")


def task_eval(run, model, tokenizer):
    """--tasks: runner.TaskEval's record of this step's weights (--tasks_n prompts a family, at the run's --threshold,
    0.9 without one, and each --tasks_also), its child process started once per run; {} without --tasks and on ranks
    but 0."""
    if not getattr(run.args, "tasks", None):
        return {}
    full = runner.full_state_dict(model) if run.fsdp else None  # every rank takes part; rank 0 receives
    rec = {}
    if run.is_main:
        if run.tasks is None:
            thresholds = [getattr(run.args, "threshold", 0.9), *run.args.tasks_also]
            run.tasks = runner.TaskEval(run.args.tasks, run.args.tasks_n, thresholds, run.out_dir, run.device, run.who)
        rec = run.tasks(model, tokenizer, save_dtype(model.config, run.args.save_dtype), full)
    runner.barrier()
    return rec


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


def configure_optimizer(model, lr, weight_decay, betas=(0.9, 0.95), fused=True):
    """AdamW; weight decay on matrices (and embeddings), none on norms and biases; frozen params skipped. fused: one
    kernel per group (on a CPU too: benchmarks/bench.py --what pack measures it against the per-tensor loop)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("every parameter is frozen: nothing to train")
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)


def lr_at(step, lr, min_lr, warmup, max_iters, time_frac=None):
    """Linear warmup, then cosine decay from lr to min_lr at max_iters, or sooner: at time_frac 1 (the share of a
    time budget's seconds after the warmup spent so far)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, max((step - warmup) / max(1, max_iters - warmup), time_frac or 0.0))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


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
        same_tokenizer(trained_with(config), f"{what} {path}", trained_with(like.config),
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
        flags = "--attn block --block_size 4" if attn == "block" else "--attn bidirectional"
        raise SystemExit(f"{who}: {where} is not a {attn + ' ' if attn else ''}DLM (attn={config.attn!r}, block_size="
                         f"{config.block_size}, mask_token_id={config.mask_token_id}, shift={config.shift}); make one "
                         f"with: python convert.py --ar AR_DIR --out_dir DLM_DIR {flags}")


def load_tokenizer(path, config):
    """The tokenizer saved with a checkpoint (or a dataset), checked against the model: its embedding rows, its mask
    token, and the tokenizer the model was trained with (config.tokenizer_sha256); a one-line exit otherwise."""
    try:
        path = resolve(path)
        tok = Tokenizer.from_pretrained(path)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"tokenizer: {e}")
    if config.path is not None and Path(path).resolve() == Path(config.path).resolve():  # the checkpoint's own
        same_tokenizer(tok.fingerprint, f"the tokenizer files in {path}", trained_with(config),
                       "its config.json", "they were replaced after the checkpoint was saved; restore them")
    model, model_dir = described(config)
    same_tokenizer(tok.fingerprint, str(path), trained_with(config), model, prepare_with(model_dir))
    if tok.vocab_size > config.vocab_size:
        raise SystemExit(f"tokenizer in {path} uses {tok.vocab_size} ids but the model has only "
                         f"{config.vocab_size} embedding rows: they do not belong together")
    if config.mask_token_id is not None and config.mask_token_id < tok.vocab_size:
        raise SystemExit(f"mask_token_id {config.mask_token_id} is an ordinary token of the tokenizer in {path}")
    return tok


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
