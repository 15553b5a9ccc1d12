"""Every script explains itself: `--help` shows every flag with its help text and its default."""
import argparse
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["align.py", "benchmarks/bench.py", "convert.py", "lib/corpus.py", "distill.py", "dpo.py", "eval.py",
           "merge.py", "lib/plot.py", "pretrain.py", "sample.py", "worlds/tasks.py",
           "worlds/stdlib.py"]


class Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


def script_parser(script, monkeypatch):
    """The parser a script builds, caught at its parse_args call (the script does nothing else)."""
    def catch(self, *a, **kw):
        raise Captured(self)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", catch)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", catch)
    monkeypatch.setattr(sys, "argv", [script])
    with pytest.raises(Captured) as e:
        runpy.run_path(str(ROOT / script), run_name="__main__")
    return e.value.parser


def parsers(parser, name):
    """(name, parser) for the parser and every subcommand's, recursively."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, p in action.choices.items():
                yield from parsers(p, f"{name} {sub}")


def flag_help(parser, action):
    """The --help text of one flag, as the parser formats it (on one line: no wrapping inside a default)."""
    f = parser.formatter_class(parser.prog, width=10_000)
    f.add_argument(action)
    return f.format_help()


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_flag_has_help_and_shows_its_default(script, monkeypatch):
    for name, p in parsers(script_parser(script, monkeypatch), script):
        if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions):
            assert issubclass(p.formatter_class, argparse.ArgumentDefaultsHelpFormatter), name
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert a.help and a.help.strip(), f"{name}: {'/'.join(a.option_strings) or a.dest} has no help text"
            if a.option_strings and a.default not in (None, False, argparse.SUPPRESS):
                assert f"(default: {a.default})" in flag_help(p, a), \
                    f"{name}: {a.option_strings[0]} does not show its default {a.default!r}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_is_a_short_description(script, monkeypatch):
    """--help gives the docstring's first paragraph and usage lines, not the notes for readers of the code."""
    from lib import cli
    doc = runpy.run_path(str(ROOT / script), run_name="not_main").get("__doc__") or ""
    for name, p in parsers(script_parser(script, monkeypatch), script):
        text = p.format_help()
        assert "What is notable" not in text, name
    assert cli.short(doc).split("\n")[0] in script_parser(script, monkeypatch).format_help()


@pytest.mark.parametrize("has_bf16", [True, False])
def test_autocast_fast_follows_the_cpu(has_bf16, monkeypatch, capsys):
    """--autocast fast: bf16 on a CPU with bf16 instructions, fp32 (no autocast) on one without; auto: fp32 on a CPU."""
    import torch

    from lib import cli
    monkeypatch.setattr(cli, "cpu_has_bf16", lambda: has_bf16)
    _, ctx = cli.setup("cpu", 0, "fast")
    assert isinstance(ctx, torch.autocast) == has_bf16
    assert ("bf16" if has_bf16 else "fp32") in capsys.readouterr().out
    assert not isinstance(cli.setup("cpu", 0, "auto")[1], torch.autocast)
    assert isinstance(cli.cpu_has_bf16(), bool)


def loop_args(argv, tmp_path):
    from lib import cli
    p = cli.parser("a training script")
    cli.add_loop_args(p, max_iters=100, batch_size=1, seq_len=8, lr=1e-3, min_lr=1e-4, warmup=2, eval_interval=10,
                      eval_batches=1)
    p.add_argument("--out_dir", default=str(tmp_path))
    monkeypatch_argv = [sys.argv[0], *argv]
    old, sys.argv = sys.argv, monkeypatch_argv
    try:
        return p, cli.parse_loop_args(p)
    finally:
        sys.argv = old


def test_time_budget_ends_at_the_last_step_that_fits_and_runs_the_cosine_over_it(tmp_path, monkeypatch):
    """A fake clock, every step 10 s: a 1-minute budget runs steps 0-5 (step 5 ends at 60 s; a seventh would end at
    70 s), the last one numbered max_iters - 1 and kept as a snapshot, and the cosine's progress is the share of the
    budget after warmup."""
    import torch

    from lib import training
    _, args = loop_args(["--time_budget", "1", "--snapshots", "3,100"], tmp_path)
    clock = [1000.0]
    monkeypatch.setattr(training, "time", argparse.Namespace(time=lambda: clock[0]))
    run = training.Run(args, "test")
    run.opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    steps, lrs, snapshots = [], [], []
    for step in run.steps():
        steps.append(step)
        lrs.append(run.lr)
        snapshots += [step + 1] * run.snapshot_due()
        clock[0] += 10.0
        run.step_times.append(10.0)
    assert steps == list(range(6)) and args.max_iters == 6 and run.bar.total == 6
    assert snapshots == [3, 6]  # the listed step, and the budget's last (100 is never reached)
    assert lrs[:3] == [5e-4, 1e-3, 1e-3]  # warmup over 2 steps; the cosine starts at step 2 (20 s)
    assert all(a > b for a, b in zip(lrs[2:], lrs[3:]))
    assert lrs[5] == pytest.approx(training.lr_at(5, 1e-3, 1e-4, 2, 100, time_frac=(50 - 20) / (60 - 20)))
    assert training.lr_at(5, 1e-3, 1e-4, 2, 6) == training.lr_at(5, 1e-3, 1e-4, 2, 6, time_frac=None)


@pytest.mark.parametrize("argv, says", [(["--time_budget", "0"], "positive"),
                                        (["--time_budget", "5", "--resume"], "cannot be continued")])
def test_time_budget_refuses_bad_input_in_one_line(argv, says, tmp_path, capsys):
    with pytest.raises(SystemExit):
        loop_args(argv, tmp_path)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert says in err and "--time_budget" in err
