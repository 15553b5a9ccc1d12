"""
The processes of a training run, kept off the training loop's page (training.Run calls these): the ranks of a torchrun
job (DDP: each rank's gradients summed by all_reduce; FSDP2: the model sharded, one unit per decoder layer, then the
root), sums and barriers over them, sharded weights gathered for saving; and the child processes a run starts: the
project's other scripts, and `eval.py tasks --ckpt -`, which serves every --tasks evaluation of a run. With one process
(no torchrun) the rank functions are no-ops.
"""
import atexit
import json
import os
import shutil
import subprocess
import sys
import weakref
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]  # the project's scripts (eval.py, sample.py)


def rank_and_size():
    """-> (rank, world_size) of this process in its torchrun job; (0, 1) alone."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def shard(model):
    """FSDP2 over every rank: one unit per decoder layer, then the root (embeddings, final norm and lm_head), each
    rank holding 1/world_size of every tensor. The gradients are summed over the ranks, as sum_gradients sums DDP's;
    FSDP gathers the root's tensors around model.forward, every loss's, evaluation's and sampler's one entry point."""
    from torch.distributed.fsdp import fully_shard
    units = [*model.model.layers, model]
    for unit in units:
        fully_shard(unit)
    for unit in units:
        unit.set_gradient_divide_factor(1.0)  # a sum over the ranks, not their mean (see all_sum)
        unit.set_force_sum_reduction_for_comms(True)  # a plain sum: gloo has no pre-scaled one


def sum_gradients(model):
    """DDP without the wrapper: each rank holds its own micro-batches' gradient terms; all_reduce sums them."""
    works = [dist.all_reduce(q.grad, async_op=True) for q in model.parameters() if q.grad is not None]
    for work in works:
        work.wait()


def all_sum(x, device):
    """x summed over the ranks: a tensor, a number, or a dict of them (summed entry by entry); x itself when alone.
    Each rank accumulates Σ over its micro-batches of value / grad_accum, so the sum over the ranks is the step's
    mean over all of its micro-batches: the number one process logs."""
    if rank_and_size()[1] == 1:
        return x
    if isinstance(x, dict):
        return {k: all_sum(v, device) for k, v in x.items()}
    t = (x.detach() if torch.is_tensor(x) else torch.tensor(float(x), dtype=torch.float64)).to(device, copy=True)
    dist.all_reduce(t)
    return t.to(x.device) if torch.is_tensor(x) else t.item()


def barrier():
    """Every rank waits for the others (alone: returns)."""
    if dist.is_initialized():
        dist.barrier()


def full_state_dict(model):
    """The whole tensors of a model sharded by --fsdp, gathered to rank 0's CPU (the other ranks get {})."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def run_script(script, *args, quiet=False):
    """Another of the project's scripts (eval.py, sample.py) in a child process on this Python, its output written
    through this process's sys.stdout and sys.stderr when it ends (quiet: only if it fails); a failure ends this
    run with its last lines."""
    cmd = [sys.executable, str(ROOT / script), *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, WORLD_SIZE="1"))
    if r.returncode or not quiet:
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
    if r.returncode:
        tail = " | ".join((r.stdout + r.stderr).strip().splitlines()[-2:])
        raise SystemExit(f"{' '.join(cmd[1:])} failed (exit {r.returncode}): {tail}")


def task_record(res):
    """tasks.exact_match's result -> the flat record logged: task_acc, task_acc_<family>, task_tpf, task_pref."""
    return dict(task_acc=res["accuracy"], **{f"task_acc_{f}": r["accuracy"] for f, r in res["families"].items()},
                task_tpf=res["tokens_per_forward"], task_pref=res["preferred"])


# The --tasks protocol, between a training run (TaskEval) and its child `eval.py tasks --ckpt -` (eval.task_serve):
# the run writes a checkpoint directory and its path, one line, to the child's stdin; the child answers with one line
# on its stdout, RESULT followed by eval.task_curve's result as JSON (everything else it prints goes to its stderr,
# task_eval.log); the child ends when its stdin closes. Any other answer, or none, is the child's failure.
RESULT = "result "


class TaskEval:
    """--tasks: exact match of a run's weights on the first n held-out prompts of each family of `tasks`
    (heldout.jsonl), and tokens per forward, at each of `thresholds` (AR: greedy), by `eval.py tasks` in a child
    process (`--ckpt -`: a checkpoint per line of its stdin), started once so that torch is imported once, ended
    (its stdin closed) with the run; its stderr goes to out_dir/task_eval.log, whose last lines a failure shows."""

    def __init__(self, tasks, n, thresholds, out_dir, device, who):
        self.out_dir, self.who = Path(out_dir), who
        with open(self.out_dir / "task_eval.log", "w") as log:  # the child writes to its own copy of the file
            self.child = subprocess.Popen(
                [sys.executable, str(ROOT / "eval.py"), "tasks", "--ckpt", "-", "--data",
                 str(tasks), "--num_prompts", str(n), "--thresholds", ",".join(f"{t:g}" for t in thresholds),
                 "--device", str(device)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                env=dict(os.environ, WORLD_SIZE="1"))
        weakref.finalize(self, self.child.stdin.close)
        atexit.register(self.child.stdin.close)

    def __call__(self, model, tokenizer, dtype, state_dict=None):
        """The weights (stored in dtype, in out_dir/task_eval, removed after) evaluated -> the flat record task_acc,
        task_acc_<family>, task_tpf (the mean over rows), task_pref (right with a full stop) at the first threshold
        (task_record), and task_acc@T, task_tpf@T at each later one."""
        d = self.out_dir / "task_eval"
        stored = model.config.torch_dtype  # save_pretrained records the dtype written: the run's stays
        model.save_pretrained(d, dtype=dtype, state_dict=state_dict)
        model.config.torch_dtype = stored
        tokenizer.save_pretrained(d)
        try:
            self.child.stdin.write(f"{d}\n")
            self.child.stdin.flush()
            line = self.child.stdout.readline()
        except BrokenPipeError:  # it has ended: its log says why
            line = ""
        if not line.startswith(RESULT):
            tail = " | ".join((self.out_dir / "task_eval.log").read_text().strip().splitlines()[-2:])
            raise SystemExit(f"{self.who}: --tasks: eval.py tasks failed: {tail}")
        runs = json.loads(line.removeprefix(RESULT))["runs"]
        rec = task_record(runs[0])
        for r in runs[1:]:
            rec.update({f"task_acc@{r['threshold']:g}": r["accuracy"],
                        f"task_tpf@{r['threshold']:g}": r["tokens_per_forward"]})
        shutil.rmtree(d)
        return rec


def mfu(flops_per_s, device, world_size=1):
    """Model FLOPs utilisation of each GPU: flops_per_s is the whole job's training FLOPs per second (flops_per_token
    × tokens/s) over world_size GPUs' dense bf16 peak; None off a GPU of known peak."""
    peak = peak_flops(device)
    return None if peak is None else flops_per_s / (peak * world_size)


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
