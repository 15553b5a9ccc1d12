"""scripts/report.py, world_tables.py, protocol.py, claims.py and stats.py: each table of run.sh and the reproduction
scripts, rendered from small JSON files made here (the shapes eval.py, merge.py, align.py and distill.py write), with
the numbers where they belong; the statistics against tables' critical values and by-hand computations; README's
claims table from docs/claims/."""
import json
import math
from pathlib import Path

import pytest

from scripts import claims, conversion, protocol, report, stats, world_tables


def write(path, obj):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))


def p_two_seeds(d1, d2):
    """The paired t's two-sided p over two seeds' differences, by hand: df = 1 (Student's t is then Cauchy), t = |d1 +
    d2| / |d1 - d2|, p = 1 - 2 atan(t) / π."""
    return 1 - 2 * math.atan(abs(d1 + d2) / abs(d1 - d2)) / math.pi


def task_run(threshold, right, tpf):
    fam = {f: dict(right=right + k / 100, accuracy=right, preferred=0.0) for k, f in enumerate(("sort", "rev", "add"))}
    lengths = {"add/2": dict(n=3, accuracy=right, tokens_per_forward=tpf), "sort/4": dict(n=5, accuracy=right,
                                                                                       tokens_per_forward=tpf + 1)}
    return dict(threshold=threshold, right=right, accuracy=right, preferred=0.25, tokens_per_forward=tpf, families=fam,
                lengths=lengths, canvas=6, forwards_answer=2.0, forwards_after=0.5)


# scipy.stats' values (scipy 1.17.1), fixed here: 2 * t.sf(t, df) and binomtest(n01, n01 + n10).pvalue
T_SCIPY = ((2.7764, 4, 0.05000230771740174), (1000, 4, 5.999960000209998e-12), (3.0, 343, 0.00289730529688209),
           (2.0, 400, 0.04617594517356813), (25.0, 1000, 1.5203541383321418e-107),
           (40.0, 10, 2.2808577430857535e-12), (1e6, 2, 9.999999999985001e-13), (0.3, 100000, 0.7641777791903376))
MCNEMAR_SCIPY = ((0, 60, 1.734723475976807e-18), (3, 200, 2.1693555718929497e-55), (40, 60, 0.05688793364098089),
                 (1, 1000, 9.351301457402253e-299))


def test_t_two_sided_against_scipy():
    """Student's t two-sided p against scipy's constants: large t, df >= 343 (where math.gamma overflows), p down
    to 1e-107; the Cauchy case (df 1) in closed form; a t beyond the floats' range gives 0.0, a true bound."""
    for t, df, p in T_SCIPY:
        assert stats.t_two_sided(t, df) == pytest.approx(p, rel=1e-9)
        assert stats.t_two_sided(-t, df) == pytest.approx(p, rel=1e-9)
    for t in (0.5, 3.0, 1e4):
        assert stats.t_two_sided(t, 1) == pytest.approx(2 / math.pi * math.atan(1 / t), rel=1e-9)
    assert stats.t_two_sided(0.0, 4) == 1.0
    assert 0.0 <= stats.t_two_sided(1e200, 400) < 1e-300
    with pytest.raises(ValueError, match="df must be positive"):
        stats.t_two_sided(1.0, 0)


def test_t_two_sided_against_live_scipy():
    """The same over a grid of t and df, where scipy is installed (requirements-dev.txt installs it)."""
    sst = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 5, 10, 30, 342, 343, 1000, 10 ** 5):
        for t in (0.0, 0.2, 1.0, 1.96, 3.0, 6.0, 20.0, 300.0):
            p = 2 * float(sst.t.sf(t, df))
            assert stats.t_two_sided(t, df) == pytest.approx(p, rel=1e-8, abs=1e-300)


def test_paired_t_and_mcnemar_against_scipy():
    """paired_t at df 399 (an OverflowError before) and McNemar's exact p down to 1e-298, against scipy."""
    assert stats.paired_t([0.0] * 400, [(i % 3) * 0.1 for i in range(400)]) == pytest.approx(4.438058509598643e-81,
                                                                                           rel=1e-8)
    for n01, n10, p in MCNEMAR_SCIPY:
        a, b = [True] * n01 + [False] * n10 + [True] * 5, [False] * n01 + [True] * n10 + [True] * 5
        assert stats.mcnemar(a, b) == pytest.approx(p, rel=1e-9)
    assert protocol.pval(0.0) == "< 1e-300" and protocol.pval(2.1693555718929497e-55) == "2.17e-55"


def test_paired_by_hand():
    a, b = [0.5, 0.6, 0.4, 0.55, 0.5], [0.6, 0.62, 0.5, 0.5, 0.6]  # differences 0.1, 0.02, 0.1, -0.05, 0.1
    d = [y - x for x, y in zip(a, b)]
    m = sum(d) / 5
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / 4)
    t = m / (sd / math.sqrt(5))
    assert stats.paired(a, b) == (f"{m:+.3f} ± {sd:.3f}, t = {t:.2f}, p = {stats.t_two_sided(t, 4):.3f}, "
                                   "ahead in 4/5")
    assert stats.paired([0.5, 0.5], [0.5, 0.5]).endswith("t = 0.00, p = 1.000, ahead in 0/2")
    assert stats.paired([0.5, 0.4], [0.6, 0.5]).endswith("t = inf, p = 0.000, ahead in 2/2")  # equal differences
    assert stats.paired([0.5], [0.7]) == "+0.200 (one seed: no test)"
    with pytest.raises(ValueError):
        stats.paired([0.5], [0.5, 0.6])  # not paired


MERGE = dict(best_gamma=0.5, gammas=[0, 0.5], train=dict(n_pairs=8, reward_accuracy=[0.5, 0.875]),
             heldout=dict(reward_accuracy=[0.5, 0.75], n_pairs=4), win_rate=0.625, samples=16)


def test_tasks_world(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write("out/tasks/eval/ar.json", dict(results=dict(runs=[task_run(None, 0.9, 1.0)])))
    write("out/tasks/eval/align.json", dict(results=dict(runs=[task_run(0.5, 0.4, 2.5), task_run(0.9, 0.6, 1.5)])))
    write("out/tasks/merged/merge.json", MERGE)
    world_tables.tasks_world("ar", "align")
    out = capsys.readouterr().out
    assert "| AR teacher (`pretrain.py`, 1200 steps) | 0.90 | 0.91 | 0.92 | 1.00 (N 6; 2.00 + 0.50) | — | 0.25 |" in out
    assert ("| REPR-ALIGN, λ = 10 (`align.py`, 200 steps) | 0.60 | 0.61 | 0.62 | 1.50 (N 6; 2.00 + 0.50) | 0.40 / 2.50 "
            "| 0.25 |") in out and "(the DLMs' canvas: N = 6 (align))" in out
    assert "| align | 0.40 / 2.50 | 0.60 / 1.50 |" in out and "| ar |" not in out.split("Accuracy against")[1]
    assert "γ = 0.5 chosen on 8 training pairs (reward accuracy 0.875); held-out reward accuracy 0.750" in out
    assert "| sort | 4 | 5 | 2.50 |" in out  # tokens per forward at 0.9 by the answer's length


def test_stdlib_world(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write("out/dlm-merged/merge.json", MERGE)
    write("out/ar-dpo/results.json", dict(heldout_reward_acc=0.9))
    gen = dict(gen_perplexity=12.34, unigram_entropy_bits=4.5, tokens_per_forward=1.25)
    write("out/eval/ar-tiny.likelihood.json", dict(results=dict(kind="AR", bits_per_token=5.4971)))
    write("out/eval/ar-tiny.generate.json", dict(results=gen))
    write("out/eval/align.likelihood.json", dict(results={"kind": "DLM", "nelbo_bits_per_token": 6.9861,
                                                          "stderr": 0.0123, "acc@0.5": 0.3333}))
    write("out/eval/align.generate.json", dict(results=gen))
    world_tables.stdlib_world("ar-tiny", "align")
    out = capsys.readouterr().out
    assert "| ar-tiny: AR teacher (pretrain.py) | 5.497 | — | 12.3 | 4.50 | 1.25 | — |" in out
    assert "| align: REPR-ALIGN, λ = 10 (align.py) | 6.986 ± 0.012 | 0.333 | 12.3 | 4.50 | 1.25 | — |" in out
    assert "win rate of out/dlm-merged over out/align under the rule 'prefer single quotes': 0.625 (16 samples" in out


def test_repro_align(tmp_path, capsys):
    for r, acc in (("lambda0", 0.2), ("lambda10", 0.3)):
        recs = [dict(step=s, **{"val_acc@0.15": acc, "val_acc@0.5": acc + s / 100, "val_acc@0.9": acc,
                                "val_loss@0.5": 5.0, "val_nelbo": 6.0 - s / 10}, val_cos=[0.5, 0.7]) for s in (0, 5)]
        write(tmp_path / r / "log.jsonl", "".join(json.dumps(x) + "\n" for x in recs))
        write(tmp_path / r / "results.json", dict(recs[-1], lambda_align=float(r[6:]), freeze=[], scratch=False,
                                                 step_seconds_median=2.0 if r == "lambda0" else 4.0))
    report.repro_align(tmp_path, "lambda0", "lambda10")
    out = capsys.readouterr().out
    assert "| 5 | 0.250 | 0.350 | 5.500 | 5.500 |" in out  # acc@0.5 of both, then -ELBO of both
    assert "| 5 | 0.600 | 0.600 |" in out  # the mean cosine
    assert "| lambda0 | 0.200 | 0.250 | 0.200 | 5.000 | 5.500 | 0.50 0.70 | 0.50x |" in out
    rows = (tmp_path / "curves.csv").read_text().splitlines()
    assert rows[0].startswith("run,lambda_align,freeze,scratch,step") and len(rows) == 5
    assert rows[1].split(",")[:5] == ["lambda0", "0.0", "", "0", "0"]


def test_repro_merge(tmp_path, capsys):
    stats = dict(reward_accuracy=[0.5, 0.75], dpo_loss=[0.69, 0.6], margin=[0.0, 0.1], margin_per_gamma=[None, 0.2],
                 same_sign=[None, 1.0], reward_chosen=[0.0, 0.05], reward_rejected=[0.0, -0.05], n_pairs=4)
    def run(masks):
        return dict(MERGE, masks=masks, n_masks=2, train=dict(stats, n_pairs=8), heldout=stats,
                    win_rates=[None, 0.6], chosen_by=dict(accuracy=0.5, dpo=0.5), density=0.2, drop=0.9)
    for name in ("linear", "ties", "dare"):
        write(tmp_path / f"merged-{name}/merge.json", run("shared"))
    write(tmp_path / "merged-linear-independent/merge.json", run("independent"))
    write(tmp_path / "ar-dpo/results.json", dict(steps=30, beta=0.1, heldout_reward_acc=0.9, heldout_pairs=4,
                                                 heldout_pref_acc_before=0.5, heldout_pref_acc=0.75))
    write(tmp_path / "spectrum.json", dict(ar="AR", dlm="DLM", summary={"q_proj": dict(
        count=2, diff=1.5, pref=0.01, ratio=150.0, min_ratio=100.0)}))
    report.repro_merge(tmp_path)
    out = capsys.readouterr().out
    assert "held-out reward accuracy 0.900 on 4 pairs" in out and "0.500 before, 0.750 after" in out
    assert "| 0.5 | shared | 0.750 | 0.6000 | 0.750 | 0.1000 | 0.2000 | 1.000 | 0.0500 | -0.0500 | 0.600 |" in out
    assert "| γ by --select dpo | 0.5 | 0.5 | 0.5 | 0.5 |" in out
    assert "| q_proj | 2 | 1.5 | 0.01 | 150 | 100 |" in out


def test_repro_tasks(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    R = Path("out/tasks/repro")
    for m in ("align0", "align", "distill-off", "distill", "distill-T0", "distill-t05", "distill-off-t05"):
        for s, acc in (("1", 0.5), ("2", 0.7)):
            acc += 0.1 * (m == "align") * int(s)  # REPR-ALIGN ahead by 0.1 and 0.2
            runs = [task_run(0.5, acc, 2.0), task_run(0.9, acc, 1.0)]
            write(R / f"eval-{m}-s{s}.json", dict(results=dict(runs=runs)))
    for m in ("ar", "ar-dpo", "ar-dpo-plain"):
        write(R / f"eval-{m}.json", dict(results=dict(runs=[task_run(None, 0.8, 1.0)])))
    write("out/tasks/ar-dpo/results.json", dict(heldout_reward_acc=0.95))
    write(R / "ar-dpo-plain/results.json", dict(heldout_reward_acc=0.99))
    write(R / "eval-merged-g0.5.json", dict(results=dict(runs=[task_run(0.9, 0.55, 1.2)])))
    write(R / "merged-g0.5/merge.json", dict(heldout=dict(reward_accuracy=[0.6])))
    write(R / "merged-shared/merge.json", dict(MERGE, chosen_by=dict(accuracy=0.5, dpo=0.5)))
    write(R / "merged-independent/merge.json", dict(MERGE, chosen_by=dict(accuracy=0, dpo=0.5),
                                                   train=dict(reward_accuracy=[0.6, 0.55])))
    write(R / "spectrum.json", dict(summary={"q_proj": dict(count=2, diff=1.5, pref=0.01, ratio=150.0,
                                                            min_ratio=100.0)}))
    report.repro_tasks("1 2", "0.5", "1 2")
    out = capsys.readouterr().out
    assert "| REPR-ALIGN, λ = 10 | 0.75 ± 0.21 / 2.00 ± 0.00 | 0.75 ± 0.21 / 1.00 ± 0.00 | 0.75 ± 0.21 |" in out
    t = 0.15 / (0.1 / math.sqrt(2) / math.sqrt(2))  # differences 0.1, 0.2: mean 0.15, sd 0.0707: t = 3
    assert (f"| REPR-ALIGN λ = 10 − λ = 0 | 0.9 | +0.150 ± 0.071, t = {t:.2f}, p = {stats.t_two_sided(t, 1):.3f}, "
            "ahead in 2/2 |") in out
    assert "| OPDLM on-policy − off-policy | 0.5 | +0.000 ± 0.000, t = 0.00, p = 1.000, ahead in 0/2 |" in out
    assert "| sort | 4 | 5 | 2.00 | 2.00 | 2.00 | 2.00 |" in out  # tokens per forward at 0.9 by answer length
    assert "| on-policy, temperature 0, threshold 0.9 | 0.60 ± 0.14 / 2.00 ± 0.00 | 0.60 ± 0.14 / 1.00 ± 0.00 |" \
        in out
    assert "| 0.5 | 0.875 / 0.750 | 0.550 / 0.750 |" in out
    assert "| γ chosen (accuracy; dpo) | 0.5; 0.5 | 0; 0.5 |" in out
    assert "| q_proj | 2 | 1.5 | 0.01 | 150 | 100 |" in out
    assert "| plain DPO (--sft_weight 0) | 0.80 / 0.00 | 0.80 / 0.00 | 0.80 / 0.00 | 0.990 |" in out
    assert "| the teacher | 0.80 / 0.00 | 0.80 / 0.00 | 0.80 / 0.00 | — |" in out
    assert "| 0.5 | 0.600 | 0.55 | 0.55 | 0.25 | 1.20 |" in out


def test_repro_align_tasks(tmp_path, capsys):
    """Every run's log.jsonl: evaluations at steps 0, 20, 40, 60, 79; the tables read them at 40, 60 and the last."""
    names = ["lam0", "lam10", "lam10-below-final", "lam10-final", "lam0-lr3e-4", "lam10-lr3e-4", "cos1", "l2-0.3",
             "l2-1", "l2-3", "l2-10"]
    for k, name in enumerate(names):
        for s in (1, 2):
            recs = [dict(step=st, task_acc=0.5 + 0.01 * k + 0.001 * st + 0.01 * s, **{"task_acc@1": 0.4 + 0.01 * s},
                         task_tpf=1.5, val_cos=[0.5, 0.7], val_nelbo=2.0) for st in (0, 20, 40, 60, 79)]
            write(tmp_path / f"{name}-s{s}/log.jsonl", "\n".join(json.dumps(r) for r in recs) + "\n")
    report.repro_align_tasks(tmp_path, "1 2", "1 2")
    out = capsys.readouterr().out
    # λ = 0: @1.0 is 0.41, 0.42; @0.9 at 40: 0.55, 0.56; at 79: 0.589, 0.599
    assert "| λ = 0 | 0.415 ± 0.007 | 0.415 ± 0.007 | 0.555 ± 0.007 | 0.575 ± 0.007 | 0.594 ± 0.007 | 1.500 ± 0.000 |" \
        in out
    assert "| λ = 10, every hidden state | 0.9 | 40 | +0.010 ± 0.000, t = inf, p = 0.000, ahead in 2/2 |" in out
    # against lr 3e-4's own λ = 0
    assert "| λ = 10, lr 3e-4 | 1.0 | 60 | +0.000 ± 0.000, t = 0.00, p = 1.000, ahead in 0/2 |" in out
    assert "| L2, λ = 10 | 0.600 ± 0.000 | 0.655 ± 0.007 |" in out  # k = 10


def test_repro_distill(tmp_path, capsys):
    def gen(ppl):
        return dict(results=dict(gen_perplexity=ppl, unigram_entropy_bits=3.0, repetition_4gram=0.1,
                                 tokens_per_forward=1.5))
    write(tmp_path / "eval/teacher-gen-T1.0-ar.json", gen(20.0))
    write(tmp_path / "eval/teacher-gen-T0-ar.json", gen(10.0))
    names = ["shift-untrained", "noshift-untrained"] + [f"{n}-s1" for n in ("shift-on", "shift-off", "shift-data",
                                                                          "noshift-on")]
    for name in names:
        for f in ("gen-T1.0-0.9", "gen-T0-0.9", "gen-T1.0-0.7"):
            write(tmp_path / f"eval/{name}-{f}.json", gen(30.0))
        write(tmp_path / f"eval/{name}-lik.json", dict(results=dict(nelbo_bits_per_token=7.25)))
        write(tmp_path / name / "results.json", dict(val_kl_data=1.0, val_kl=0.5))
    report.repro_distill(tmp_path, "1", "60", "120")
    out = capsys.readouterr().out
    assert "| teacher (AR) | — | — | — | 20.00 | 3.00 | 0.10 | 10.00 | 3.00 | 0.10 | — | — |" in out
    assert "| **shifted, on-policy (OPDLM), 60 steps**: mean of 1 seeds | 1.000 | 0.500 | 7.250 | 30.00" in out
    assert "| **unshifted (as published), on-policy, 120 steps**: mean of 1 seeds |" in out


def test_repro_dlm_dpo(tmp_path, monkeypatch, capsys):
    """Both routes per world and seed, each route's seconds summed over its stages, and the paired comparison."""
    monkeypatch.chdir(tmp_path)  # no run.sh outputs here: no "before" rows
    def merge(acc):
        return dict(gammas=[0, 1], best_gamma=1, heldout=dict(reward_accuracy=[0.5, acc]))
    for s, (a, b) in (("1", (0.8, 0.9)), ("2", (0.7, 0.95))):
        def run(right, pref):
            return dict(results=dict(runs=[dict(right=right, preferred=pref, tokens_per_forward=1.5)]))
        write(f"o/tasks/{s}/merged/merge.json", merge(a))
        write(f"o/tasks/{s}/dlm-dpo/results.json", dict(heldout_reward_acc=b))
        write(f"o/tasks/{s}/eval/merged.json", run(0.6, 0.0))
        write(f"o/tasks/{s}/eval/dlm-dpo.json", run(0.5, 0.4 + int(s) / 10))
        write(f"o/stdlib/{s}/merged/merge.json", merge(a))
        write(f"o/stdlib/{s}/dlm-dpo/results.json", dict(heldout_reward_acc=b))
        write(f"o/stdlib/{s}/winrate.json", dict(results=dict(win_rates=[0.8, 0.75], samples=32)))
        for m in ("merged", "dlm-dpo"):
            write(f"o/stdlib/{s}/{m}.likelihood.json", dict(results=dict(nelbo_bits_per_token=7.0, stderr=0.1)))
    write("o/seconds.tsv", "tasks 1 ar-dpo\t7\ntasks 1 merge\t8\ntasks 1 dlm-dpo\t12\n")
    report.repro_dlm_dpo("o", 1, 2)
    out = capsys.readouterr().out
    assert "| 1 | AR-MAP (γ = 1) | 0.800 | 0.60 | 0.00 | 1.50 | 15 |" in out
    assert "| 1 | DLM-only | 0.900 | 0.50 | 0.50 | 1.50 | 12 |" in out
    assert "with the full stop +0.550 ± 0.071" in out and "ahead in 2/2" in out
    assert "| 2 | DLM-only | 0.950 | 0.750 | 7.000 ± 0.100 | 0 |" in out and "win rate -0.050 ± 0.000" in out


def test_repro_mark(tmp_path, capsys):
    def run(right, pref):
        return dict(results=dict(runs=[dict(right=right, preferred=pref, tokens_per_forward=1.25)]))
    for m, pref in (("ar", 0.0), ("ar-dpo", 0.9), ("align", 0.0), ("dlm-dpo", 0.5), ("merged-1", 0.3)):
        write(tmp_path / f"eval/{m}.json", run(0.7, pref))
    write(tmp_path / "ar-dpo/results.json", dict(heldout_reward_acc=0.99))
    write(tmp_path / "dlm-dpo/results.json", dict(heldout_reward_acc=0.95))
    write(tmp_path / "merged-1/merge.json", dict(best_gamma=1, heldout=dict(reward_accuracy=[0.8])))
    report.repro_mark(tmp_path, "ar", "ar-dpo", "align", "dlm-dpo", "merged-1")
    out = capsys.readouterr().out
    assert "| AR teacher | 0.70 | 0.00 | 1.25 | — |" in out and "| AR after DPO | 0.70 | 0.90 | 1.25 | 0.990 |" in out
    assert "| AR-MAP, γ = 1 | 0.70 | 0.30 | 1.25 | 0.800 |" in out and "| DLM-only" in out


def test_paired_statistics_by_hand():
    """McNemar's exact test, the paired t-test and Holm's correction (scripts/report.py), against values worked
    out here."""
    a, b = [True, True, False, False, True], [False, True, True, True, True]  # discordant: 1 and 2
    assert stats.mcnemar(a, b) == pytest.approx(2 * (1 + 3) / 8)  # capped at 1
    assert stats.mcnemar([False] * 6, [True] * 6) == pytest.approx(2 / 64)
    assert stats.mcnemar([True, False], [True, False]) == 1.0
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    d = [0.5, 0.25, 0.0, 0.75]  # b - a
    t = (sum(d) / 4) / (math.sqrt(sum((x - 0.375) ** 2 for x in d) / 3) / 2)
    assert stats.paired_t([1, 1, 1, 1], [1 + x for x in d]) == pytest.approx(stats.t_two_sided(t, 3))
    assert stats.paired_t([1, 2], [1, 2]) == 1.0


def test_real_sweep_rules_choose_as_named(tmp_path, capsys):
    """repro_real.sh's rules: "nelbo" the lowest −ELBO; "stop" the highest full-stop share among the rates within
    0.5 bits per token of the start (ties: the lower −ELBO), none within: the lowest −ELBO."""
    (tmp_path / "eval").mkdir()

    def val(arm, rate, nelbo, stop):
        run = dict(accuracy=0.5, full_stop=stop, f1=0.5)
        (tmp_path / f"eval/{arm}-{rate}.json").write_text(json.dumps(dict(nelbo_bits=nelbo, runs={"0.9": run})))

    for rate, nelbo in (("1e-3", 3.1), ("3e-4", 2.9), ("1e-4", 3.0)):
        val("align", rate, nelbo, 0.0)
    assert report.sweep_choice(tmp_path, "align", ["1e-3", "3e-4", "1e-4"])[0] == "3e-4"
    for rate, nelbo, stop in (("2e-4", 9.0, 1.0), ("2e-5", 1.4, 0.8), ("2e-6", 1.1, 0.8), ("2e-7", 1.0, 0.6)):
        val("ar-dpo", rate, nelbo, stop)
    rates = ["2e-4", "2e-5", "2e-6", "2e-7"]
    assert report.sweep_choice(tmp_path, "ar-dpo", rates, start=1.0)[0] == "2e-6"  # 2e-4 too far; 0.8 tie: lower
    assert report.sweep_choice(tmp_path, "ar-dpo", rates, start=0.2)[0] == "2e-7"  # none within 0.5 bits
    report.real_sweep(str(tmp_path), "ar-dpo", "-", " ".join(rates))
    assert capsys.readouterr().out.strip() == "2e-7"  # no start: the lowest −ELBO
    report.real_sweep("--extend", str(tmp_path), "ar-dpo", "-", *rates)  # the edge: the sweep goes on past it
    assert capsys.readouterr().out.strip() == "6e-8"  # one half-decade step down (the grid 2e-4, 6e-5, 2e-5, ...)
    val("ar-dpo", "6e-8", 1.2, 0.5)
    report.real_sweep("--extend", str(tmp_path), "ar-dpo", "-", *rates, "6e-8")
    assert capsys.readouterr().out.strip() == ""  # 2e-7 now inside: nothing more
    (tmp_path / "ar-dpo.rates").write_text("2e-4 2e-5\n")  # the rates the sweep ran, as repro_real.sh writes them
    report.real_sweep(str(tmp_path), "ar-dpo", "-")
    assert capsys.readouterr().out.strip() == "2e-5"
    report.real_sweep_table(str(tmp_path), "1e-3 3e-4 1e-4", " ".join(rates))
    assert "| align | nelbo | 3e-4 * | 2.900 |" in capsys.readouterr().out


def test_real_verdicts_test_the_seeds_first(tmp_path, capsys):
    """repro_real.sh's verdicts: per comparison the paired t over the seeds' means (primary; p by hand for two seeds),
    McNemar over (seed, prompt) pairs beside it, Holm across the row; a comparison whose models a seed lacks is left
    out; one seed has no primary test; each seed's means printed."""
    def ev(seed, model, stops, f1=0.5):
        rows = [dict(right=False, full_stop=s, f1=f1) for s in stops]
        write(tmp_path / f"s{seed}/eval/{model}.json", dict(runs={"0.9": dict(rows=rows)}))

    for seed, base, arm in ((1, [False] * 4, [True, True, False, False]), (2, [False] * 4, [True] * 4)):
        ev(seed, "align", base)
        ev(seed, "merged", arm)
    dirs = [str(tmp_path / "s1"), str(tmp_path / "s2")]
    report.real_verdicts(*dirs)
    out = capsys.readouterr().out
    assert "align0" not in out and "dlm-dpo" not in out  # neither seed ran them
    row = next(line for line in out.splitlines() if "merged against align | full_stop" in line).split(" | ")
    assert row[3:6] == ["0.000", "0.750", "2 ahead, 0 tied of 2"]
    assert float(row[6]) == pytest.approx(p_two_seeds(0.5, 1.0), rel=1e-2)  # the seeds' differences 0.5 and 1
    assert float(row[8].rstrip(" |")) == pytest.approx(2 / 2 ** 6, rel=1e-2)  # McNemar: 6 discordant pairs, all one way
    assert "| s2 | merged | 0.000 | 1.000 | 0.500 |" in out
    report.real_verdicts(dirs[0])
    row = next(line for line in capsys.readouterr().out.splitlines() if "merged against align" in line).split(" | ")
    assert row[6:8] == ["—", "—"] and float(row[8].rstrip(" |")) == pytest.approx(2 / 2 ** 2, rel=1e-2)


def test_repro_rl(tmp_path, capsys):
    """repro_rl.sh's tables: early stopping (a run's kept weights, the highest validation exact match, a tie the fewer
    steps), the sweep's rule on it (the highest, a tie the lower rate) and its edge (the rate past it), each arm's
    held-out means, wall seconds summed over its stages, the per-seed paired t (primary, Holm) and McNemar over
    (seed, prompt) pairs beside it, the reward curve."""
    def ev(name, runs):
        write(tmp_path / f"eval/{name}.json", dict(results=dict(runs=runs)))

    def run(t, correct, tpf=1.0):
        fams = {"sort": dict(accuracy=sum(correct) / len(correct))}
        return dict(threshold=t, accuracy=sum(correct) / len(correct), correct=correct, families=fams,
                    tokens_per_forward=tpf, canvas=6)

    ev("start.val", [run(0.9, [True, False])])
    for arm, accs in {"rl": (0.5, 0.7, 0.7), "dlm-dpo": (0.9, 0.1, 0.2), "ar-map": (0.1, 0.2, 0.3)}.items():
        for rate, a in zip(("3e-4", "1e-4", "3e-5"), accs):
            ev(f"{arm}-1337-{rate}-40.val", [dict(threshold=0.9, accuracy=a)])
    for k, a in ((10, 0.1), (20, 0.95), (30, 0.95)):  # dlm-dpo at 1e-4: its quarters; 20 steps beat the end's 0.1
        ev(f"dlm-dpo-1337-1e-4-{k}.val", [dict(threshold=0.9, accuracy=a)])
    assert report.rl_steps(tmp_path, "dlm-dpo", 1337, "1e-4") == (20, {10: 0.1, 20: 0.95, 30: 0.95, 40: 0.1})
    assert report.rl_choice(tmp_path, "rl", ["3e-4", "1e-4", "3e-5"])[0] == "3e-5"  # a tie: the lower rate
    report.rl_sweep(str(tmp_path), "dlm-dpo", "3e-4", "1e-4", "3e-5")
    assert capsys.readouterr().out.strip() == "1e-4"  # at its early-stopped 20 steps
    report.rl_sweep("--extend", str(tmp_path), "dlm-dpo", "3e-4", "1e-4", "3e-5")
    assert capsys.readouterr().out.strip() == ""  # inside the sweep
    report.rl_sweep("--extend", str(tmp_path), "ar-map", "3e-4", "1e-4", "3e-5")
    assert capsys.readouterr().out.strip() == "1e-5"  # its lowest rate: the sweep goes on below it
    report.rl_pick(str(tmp_path), "dlm-dpo", "1337", "1e-4")
    assert capsys.readouterr().out.strip() == "20"
    start = [False] * 10
    ev("start.test", [run(0.9, start), run(1.0, start)])
    for s, right in (("1", 5), ("2", 6)):
        ev(f"rl-{s}.test", [run(0.9, [True] * right + [False] * (10 - right), 1.5),
                            run(1.0, [True] * 4 + [False] * 6, 1.0)])
        ev(f"dlm-dpo-{s}.test", [run(0.9, start), run(1.0, start)])
        ev(f"ar-map-{s}.test", [run(0.9, [True] + [False] * 9), run(1.0, start)])
        for arm, rate in (("rl", "3e-5"), ("dlm-dpo", "1e-4"), ("ar-map", "3e-5")):
            ev(f"{arm}-{s}-{rate}-40.val", [dict(threshold=0.9, accuracy=0.5)])
        ev(f"dlm-dpo-{s}-1e-4-{10 * int(s)}.val", [dict(threshold=0.9, accuracy=0.6)])
        write(tmp_path / s / "rl-3e-5/log.jsonl",
              "".join(json.dumps(dict(step=i, reward=0.1 * i, tokens_per_forward=1.0)) + "\n" for i in range(0, 40, 4)))
    write(tmp_path / "seconds.tsv", "rl 1 3e-5\t100\nrl 2 3e-5\t120\npairs ar 1\t10\nar-dpo 1 ar-map-x\t1\n")
    report.repro_rl(str(tmp_path), "1", "2")
    out = capsys.readouterr().out
    assert "| rl | 3e-4: 0.500 | 1e-4: 0.700 | 3e-5: 0.700 * |" in out
    assert "| dlm-dpo | 3e-4: 0.900 | 1e-4: 0.950 * | 3e-5: 0.200 |" in out
    assert "| diffu-GRPO (rl.py) | 3e-5 | 110 | 40 / 40 | 0.500 / 0.600 | 0.550 | 0.550 | 0.400 | 1.50 | 1.00 |" in out
    assert "| DPO on the DLM (judged pairs) | 1e-4 | 0 | 10 / 20 |" in out  # each seed stopped early
    # rl against the start, per seed: differences 0.5 and 0.6, t = 0.55 / (0.0707 / √2) = 11 on 1 df, where Student's
    # t is Cauchy: p = 1 − (2/π) atan(11); Holm's rank 1 of 5 multiplies it by 5 (by 4 here: the one at rank 2 ties
    # it and the larger is kept). McNemar: 11 discordant pairs one way, rank 1 of 5 by Holm
    p = 1 - 2 / math.pi * math.atan(11)
    row = next(line for line in out.splitlines() if line.startswith("| rl against the start |"))
    cells = row.strip("|").split("|")
    assert [c.strip() for c in cells[:4]] == ["rl against the start", "0.000", "0.550", "2 ahead, 0 tied of 2"]
    assert float(cells[4]) == pytest.approx(p, rel=1e-2) and float(cells[5]) == pytest.approx(4 * p, rel=1e-2)
    assert float(cells[6]) == pytest.approx(5 * 2 / 2 ** 11, rel=1e-2)
    assert "| dlm-dpo against the start | 0.000 | 0.000 | 0 ahead, 2 tied of 2 | 1 | 1 | 1 |" in out
    assert "| 0-0 | 0.000 | 1.00 |" in out and "| 32-36 | 3.400 | 1.00 |" in out  # 10 steps: 8 bins of 1 or 2
    assert "| 36-36 |" not in out


def test_align_protocol(tmp_path, capsys):
    """repro_align_tasks.sh's protocol tables: the sweep's rule (the highest validation exact match, a tie the lower
    rate), the test means, the paired t over the seeds' means with Holm across the four tests, McNemar over (seed,
    prompt) pairs beside it."""
    for arm, accs in (("p-lam0", (0.2, 0.5, 0.5)), ("p-lam10", (0.6, 0.4, 0.1))):
        for r, a in zip(("3e-3", "1e-3", "3e-4"), accs):
            write(tmp_path / f"{arm}-{r}-s1/results.json", {"task_acc": a, "task_acc@1": a / 2,
                                                           "step_seconds_median": 0.1})
    protocol.val_sweep(str(tmp_path), "p-lam0", "3e-3", "1e-3", "3e-4")
    assert capsys.readouterr().out.strip() == "3e-4"  # 1e-3 and 3e-4 tie: the lower rate
    protocol.val_sweep(str(tmp_path), "p-lam10", "3e-3", "1e-3", "3e-4")
    assert capsys.readouterr().out.strip() == "3e-3"

    def ev(name, correct):
        runs = [dict(threshold=t, accuracy=sum(correct) / len(correct), correct=correct, tokens_per_forward=1.0,
                     canvas=6) for t in (0.9, 1.0)]
        write(tmp_path / f"eval/{name}.json", dict(results=dict(runs=runs)))
    for s, k in (("1", 4), ("2", 6)):
        ev(f"p-lam0-3e-4-s{s}", [False] * 8)
        ev(f"p-lam10-3e-3-s{s}", [True] * k + [False] * (8 - k))
        ev(f"p-lam0time-3e-4-s{s}", [True] * 4 + [False] * 4)
    protocol.align_protocol(str(tmp_path), "3e-4", "3e-3", "118", "3e-3 1e-3 3e-4", "1", "2")
    out = capsys.readouterr().out
    assert "| λ = 0 | 0.200 (0.100), 0.100 s | 0.500 (0.250), 0.100 s | 0.500 (0.250), 0.100 s * |" in out
    p, q = p_two_seeds(0.5, 0.75), 2 / 2 ** 10  # per seed; McNemar: 10 discordant (seed, prompt) pairs, one way
    assert (f"| λ = 10 against λ = 0, equal steps | 0.9 | 0.000 | 0.625 | 2 ahead, 0 tied of 2 | {p:.3g} | "
            f"{4 * p:.3g} | {4 * q:.3g} |") in out  # Holm: the two at p take 4× and 3× (kept monotone: 4×)
    p = p_two_seeds(0, 0.25)
    assert f"| λ = 10 against λ = 0, equal time | 1 | 0.500 | 0.625 | 1 ahead, 1 tied of 2 | {p:.3g} | 1 | 1 |" in out
    assert "| λ = 0, lr 3e-4, 118 steps (λ = 10's 80 steps of time) | 0.500 | 0.500 | 1.00 | 1.00 |" in out
    assert "| λ = 10, lr 3e-3, 80 steps | 1 | 0.500 / 0.750 |" in out  # each seed's, at each threshold


def test_l2_protocol(tmp_path, capsys):
    """Cosine against L2: L2's (λ, rate) by the highest validation exact match (a tie: the lower λ, then the lower
    rate), its sweep rows, and the cosine-against-L2 test at both thresholds."""
    for lam, accs in (("0.3", (0.1, 0.4)), ("1", (0.4, 0.2)), ("3", (0.3, 0.3))):
        for r, a in zip(("1e-2", "1e-3"), accs):
            write(tmp_path / f"p-l2-{lam}-{r}-s1/results.json", {"task_acc": a, "step_seconds_median": 0.2})
    protocol.l2_sweep(str(tmp_path), "0.3 1 3", "1e-2 1e-3")
    assert capsys.readouterr().out.strip() == "0.3 1e-3"  # 0.4 twice: the lower λ

    def ev(name, correct):
        runs = [dict(threshold=t, accuracy=sum(correct) / len(correct), correct=correct, tokens_per_forward=1.0,
                     canvas=6) for t in (0.9, 1.0)]
        write(tmp_path / f"eval/{name}.json", dict(results=dict(runs=runs)))
    for s in ("1", "2", "3"):
        ev(f"p-l2-0.3-1e-3-s{s}", [False] * 4)
        ev(f"p-lam10-3e-3-s{s}", [True] * 4 if s != "3" else [True, True, False, False])
    protocol.l2_protocol(str(tmp_path), "3e-3", "0.3", "1e-3", "0.3 1 3", "1e-2 1e-3", "1", "2", "3")
    out = capsys.readouterr().out
    assert "| L2, λ = 0.3 | 0.100, 0.200 s | 0.400, 0.200 s * |" in out
    assert "| L2, λ = 1 | 0.400, 0.200 s | 0.200, 0.200 s |" in out
    # per seed: differences 1, 1, 0.5: t = 5 with df = 2, whose two-sided p is 1 - t / sqrt(t² + 2)
    p, q = 1 - 5 / math.sqrt(27), 2 / 2 ** 10  # McNemar: 10 discordant pairs, one way
    assert (f"| cosine against L2 | 1 | 0.000 | 0.833 | 3 ahead, 0 tied of 3 | {p:.3g} | {2 * p:.3g} | {2 * q:.3g} |"
            in out)


def test_opdlm_protocol(tmp_path, capsys):
    """repro_tasks.sh's protocol tables: five thresholds, one comparison each, Holm across the five; the equal-time
    arm and its five tests only when off-policy's steps at equal time differ from 200."""
    for pol in ("on", "off"):
        for r in ("1e-2", "1e-3"):
            write(tmp_path / f"{pol}-{r}-s1/results.json", {"task_acc": 0.5, "step_seconds_median": 0.1})
    thresholds = (0.5, 0.7, 0.9, 0.95, 1.0)

    def ev(name, correct):
        runs = [dict(threshold=t, accuracy=sum(correct) / len(correct), correct=correct, tokens_per_forward=1.5,
                     canvas=8) for t in thresholds]
        write(tmp_path / f"eval/{name}.json", dict(results=dict(runs=runs)))
    for s in ("1", "2"):
        ev(f"on-1e-3-s{s}", [True] * (5 if s == "1" else 7) + [False] * (5 if s == "1" else 3))
        ev(f"off-1e-2-s{s}", [False] * 10)
        ev(f"offtime-1e-2-s{s}", [True] * 5 + [False] * 5)
    protocol.opdlm_protocol(str(tmp_path), "1e-3", "1e-2", "200", "1e-2 1e-3", "1", "2")
    out = capsys.readouterr().out
    p, q = p_two_seeds(0.5, 0.7), 2 / 2 ** 12  # McNemar: 12 discordant pairs, one way; Holm over five equal p: × 5
    assert (f"| on against off, equal steps | 0.95 | 0.000 | 0.600 | 2 ahead, 0 tied of 2 | {p:.3g} | {5 * p:.3g} | "
            f"{5 * q:.3g} |") in out
    assert "equal time" not in out and "Holm across the 5" in out
    assert "| on-policy | 0.500, 0.100 s | 0.500, 0.100 s * |" in out  # a tie goes to the lower rate, 1e-3
    protocol.opdlm_protocol(str(tmp_path), "1e-3", "1e-2", "230", "1e-2 1e-3", "1", "2")
    out = capsys.readouterr().out
    assert "| on against off, equal time | 1 | 0.500 | 0.600 | 1 ahead, 1 tied of 2 | 0.5 | 1 | 1 |" in out
    assert "off-policy, lr 1e-2, 230 steps (on-policy's 200 steps of time)" in out and "Holm across the 10" in out


def test_mark_protocol(tmp_path, capsys):
    """repro_mark.sh's protocol: the sweep's rule on the preferred share, DLM-only's steps at AR-MAP's seconds, the
    transfer test and AR-MAP against DLM-only on the preferred and the right (either form) outcomes, Holm across
    them."""
    def ev(name, correct, preferred):
        run = dict(threshold=0.9, correct=correct, preferred_rows=preferred, canvas=6, tokens_per_forward=1.2,
                   preferred=sum(preferred) / len(preferred), right=sum(c or p for c, p in zip(correct, preferred))
                   / len(correct))
        write(tmp_path / f"eval/{name}.json", dict(results=dict(runs=[run])))
    for route, shares in (("ar-map", (2, 4, 4)), ("dlm-dpo", (6, 1, 0))):
        for r, k in zip(("3e-3", "1e-3", "3e-4"), shares):
            ev(f"val-{route}-{r}", [False] * 10, [True] * k + [False] * (10 - k))
    for r in ("3e-3", "1e-3", "3e-4"):
        write(tmp_path / f"ar-map-{r}-s1/merge.json", dict(best_gamma=0.25))
    protocol.mark_sweep(str(tmp_path), "ar-map", "3e-3", "1e-3", "3e-4")
    assert capsys.readouterr().out.strip() == "3e-4"  # 1e-3 and 3e-4 tie: the lower rate
    protocol.mark_sweep(str(tmp_path), "dlm-dpo", "3e-3", "1e-3", "3e-4")
    assert capsys.readouterr().out.strip() == "3e-3"
    protocol.mark_sweep("--extend", str(tmp_path), "3e-3", "1e-3", "3e-4")
    assert capsys.readouterr().out.strip() == "1e-4"  # AR-MAP's choice is the low edge (DLM-only's the high one)
    for r, k in (("1e-4", 3), ("1e-2", 2)):  # past both edges: AR-MAP peaks at 3e-4, DLM-only at 3e-3
        ev(f"val-ar-map-{r}", [False] * 10, [True] * k + [False] * (10 - k))
        ev(f"val-dlm-dpo-{r}", [False] * 10, [True] * k + [False] * (10 - k))
    protocol.mark_sweep("--extend", str(tmp_path), "3e-3", "1e-3", "3e-4", "1e-4")
    assert capsys.readouterr().out.strip() == "1e-2"  # then DLM-only's high edge
    protocol.mark_sweep("--extend", str(tmp_path), "3e-3", "1e-3", "3e-4", "1e-4", "1e-2")
    assert capsys.readouterr().out.strip() == ""  # both choices inside
    write(tmp_path / "seconds.tsv", "ar-dpo 3e-4 1\t10\nmerge 3e-4 1\t5\ndlm-dpo 3e-3 1\t10\ndlm-dpo 3e-3 2\t12\n"
          "ar-dpo 3e-4 2\t12\nmerge 3e-4 2\t7\n")
    protocol.dlm_dpo_steps(str(tmp_path), "3e-4", "3e-3", "100", "1")
    assert capsys.readouterr().out.strip() == "150"  # AR-MAP's 15 s against 10 s
    protocol.dlm_dpo_steps(str(tmp_path), "3e-4", "3e-3", "100", "2")
    assert capsys.readouterr().out.strip() == "158"  # seed 2's stages: 12 + 7 s against 12 s
    ev("align-s0", [True] * 6 + [False] * 4, [False] * 10)
    for s in ("1", "2"):
        write(tmp_path / f"ar-map-3e-4-s{s}/merge.json", dict(best_gamma=0.25 * int(s)))
        k = 6 if s == "1" else 7  # preferred; right: k + 2
        ev(f"ar-map-3e-4-s{s}", [True] * 2 + [False] * 8, [False] * 2 + [True] * k + [False] * (8 - k))
        ev(f"dlm-dpo-3e-3-s{s}", [False] * 10, [True] * 6 + [False] * 4)  # right 6, preferred 6
        ev(f"dlm-dpo-time-3e-3-s{s}", [False] * 10, [True] * 6 + [False] * 4)
    protocol.mark_protocol(str(tmp_path), "3e-4", "3e-3", "150", "3e-3 1e-3 3e-4", "1", "2")
    out = capsys.readouterr().out
    assert "| ar-map | 0.200 (0.200), γ 0.25 | 0.400 (0.400), γ 0.25 | 0.400 (0.400), γ 0.25 * |" in out
    assert ("| AR-MAP, DPO lr 3e-4 | 0.850 | 0.650 | 0.800 / 0.900 | 0.600 / 0.700 | 1.20 | 0.25, 0.5 | 17 |"
            in out)  # seconds: (15 + 19) / 2
    assert "| DPO on the DLM, lr 3e-3, 150 steps (AR-MAP's seconds) |" in out
    p, q = p_two_seeds(0.6, 0.7), 2 / 2 ** 13  # the transfer; McNemar: 13 discordant pairs (6 and 7), one way
    assert (f"| the transfer: AR-MAP against the start | preferred | 0.000 | 0.650 | 2 ahead, 0 tied of 2 | {p:.3g} | "
            f"{p:.3g} | {q:.3g} |") in out
    # right: 0.8 and 0.9 against 0.6; discordant: prompts 7-8 of seed 1, 7-9 of seed 2 -> 5 pairs one way
    p, q = p_two_seeds(0.2, 0.3), 2 / 2 ** 5
    assert (f"| AR-MAP against DPO on the DLM, equal steps | right | 0.600 | 0.850 | 2 ahead, 0 tied of 2 | {p:.3g} | "
            f"{4 * p:.3g} | {4 * q:.3g} |") in out  # Holm: p × 4 (then × 3, kept monotone), the 0.5s × 2 -> 1
    # preferred: seed 1 tied, seed 2 ahead by 0.1; discordant 4 (DLM-only) against 5 (AR-MAP): McNemar p = 1
    assert ("| AR-MAP against DPO on the DLM, equal time | preferred | 0.600 | 0.650 | 1 ahead, 1 tied of 2 | 0.5 | "
            "1 | 1 |") in out
    protocol.mark_protocol(str(tmp_path), "3e-4", "3e-3", "100", "3e-3 1e-3 3e-4", "1", "2")  # no time arm
    out = capsys.readouterr().out
    assert "equal time" not in out and "AR-MAP's seconds" not in out and "Holm across the 2" in out


def test_stdlib_align_protocol(tmp_path, capsys):
    """The standard library's protocol: the sweep's rule on the first half's -ELBO (the lowest, a tie the lower rate),
    and the paired t-test over (seed, sequence) on the other half, against a by-hand computation, Holm across two."""
    def lik(name, seqs):
        write(tmp_path / f"eval/{name}.json", dict(results=dict(nelbo_bits_per_token=sum(seqs) / len(seqs),
                                                                per_sequence=seqs, n_draws=4)))
    for arm, vals in (("lam0", (7.0, 6.5, 6.5)), ("lam10", (6.0, 6.8, 7.2))):
        for r, v in zip(("3e-3", "1e-3", "3e-4"), vals):
            lik(f"val-{arm}-{r}", [v, v])
            write(tmp_path / f"{arm}-{r}-s1/results.json", dict(step_seconds_median=0.5))
    protocol.nelbo_sweep(str(tmp_path), "val-lam0", "3e-3", "1e-3", "3e-4")
    assert capsys.readouterr().out.strip() == "3e-4"  # 6.5 twice: the lower rate
    base, arm = {"1": [7.0, 7.2, 6.9], "2": [7.1, 7.0, 7.3]}, {"1": [6.8, 7.0, 6.9], "2": [7.0, 6.8, 7.3]}
    for s in ("1", "2"):
        lik(f"lam0-3e-4-s{s}", base[s])
        lik(f"lam10-3e-3-s{s}", arm[s])
        lik(f"lam0time-3e-4-s{s}", arm[s])
    protocol.stdlib_align_protocol(str(tmp_path), "3e-4", "3e-3", "130", "3e-3 1e-3 3e-4", "1", "2")
    out = capsys.readouterr().out
    assert "| λ = 10 | 6.000, 0.500 s * | 6.800, 0.500 s | 7.200, 0.500 s |" in out
    a, b = base["1"] + base["2"], arm["1"] + arm["2"]
    p, pooled = p_two_seeds(-0.4 / 3, -0.1), stats.paired_t(a, b)  # the seeds' mean differences; (seed, sequence)
    d = sum(y - x for x, y in zip(a, b)) / 6
    assert (f"| λ = 10 against λ = 0, equal steps | {sum(a) / 6:.3f} | {sum(b) / 6:.3f} | {d:+.3f} | "
            f"2 ahead, 0 tied of 2 | {p:.3g} | {2 * p:.3g} | {2 * pooled:.3g} |") in out  # Holm: the smaller × 2
    assert "| λ = 10 against λ = 0, equal time | 6.967 | 6.967 | +0.000 | 0 ahead, 2 tied of 2 | 1 | 1 | 1 |" in out
    assert "| λ = 0, lr 3e-4, 130 steps (λ = 10's 100 steps of time) | 6.967 |" in out


def test_stdlib_opdlm_protocol(tmp_path, capsys):
    """On against off in the standard library: one test at equal steps when a step costs the same (k = STEPS), and
    the equal-time arm with its test otherwise."""
    def lik(name, seqs):
        write(tmp_path / f"eval/{name}.json", dict(results=dict(nelbo_bits_per_token=sum(seqs) / len(seqs),
                                                                per_sequence=seqs, n_draws=4)))
    for pol in ("on", "off"):
        lik(f"val-{pol}-1e-3", [6.0])
        write(tmp_path / f"{pol}-1e-3-s1/results.json", dict(step_seconds_median=0.7))
    for s in ("1", "2"):
        lik(f"on-1e-3-s{s}", [6.0, 6.2] if s == "1" else [6.2, 6.2])
        lik(f"off-1e-3-s{s}", [6.1, 6.5])
        lik(f"offtime-1e-3-s{s}", [6.0, 6.2] if s == "1" else [6.2, 6.2])
    protocol.stdlib_opdlm_protocol(str(tmp_path), "1e-3", "1e-3", "60", "60", "1e-3", "1", "2")
    out = capsys.readouterr().out
    p, pooled = p_two_seeds(-0.2, -0.1), stats.paired_t([6.1, 6.5] * 2, [6.0, 6.2, 6.2, 6.2])  # one test: no Holm
    assert (f"| on against off, equal steps | 6.300 | 6.150 | -0.150 | 2 ahead, 0 tied of 2 | {p:.3g} | {p:.3g} | "
            f"{pooled:.3g} |") in out
    assert "equal time" not in out and "Holm across the 1" in out
    protocol.stdlib_opdlm_protocol(str(tmp_path), "1e-3", "1e-3", "75", "60", "1e-3", "1", "2")
    out = capsys.readouterr().out
    assert "| off-policy, lr 1e-3, 75 steps (on-policy's 60 steps of time) | 6.150 |" in out and "across the 2" in out
    assert "| on against off, equal time | 6.150 | 6.150 | +0.000 | 0 ahead, 2 tied of 2 | 1 | 1 | 1 |" in out


def test_stdlib_armap_protocol(tmp_path, capsys):
    """The standard library's AR-MAP protocol: the sweep's rule on the validation win rate, the transfer's test on
    the rule scores, and AR-MAP against DPO on the DLM on the rule score (higher ahead) and the -ELBO (lower ahead),
    each at equal steps and equal time, Holm across the four."""
    def ev(name, results):
        write(tmp_path / f"eval/{name}.json", dict(results=results))
    for r, wins in (("6e-4", [0.7, 0.6]), ("2e-4", [0.8, 0.6])):
        ev(f"val-{r}", dict(win_rates=wins))
        write(tmp_path / f"ar-map-{r}-s1/merge.json", dict(best_gamma=2.0))
    protocol.winrate_sweep(str(tmp_path), "0", "6e-4", "2e-4")
    assert capsys.readouterr().out.strip() == "2e-4"
    protocol.winrate_sweep(str(tmp_path), "1", "6e-4", "2e-4")
    assert capsys.readouterr().out.strip() == "2e-4"  # a tie: the lower rate
    write(tmp_path / "seconds.tsv", "ar-dpo 2e-4 1\t10\nmerge 2e-4 1\t20\ndlm-dpo 2e-4 1\t15\n"
          "ar-dpo 2e-4 2\t10\nmerge 2e-4 2\t20\ndlm-dpo 2e-4 2\t15\ndlm-dpo-time 2e-4 1\t30\ndlm-dpo-time 2e-4 2\t30\n")
    ev("lik-align", dict(nelbo_bits_per_token=7.0, per_sequence=[7.0, 7.0]))
    for s in ("1", "2"):
        write(tmp_path / f"ar-map-2e-4-s{s}/merge.json", dict(best_gamma=float(s)))
        armap = [1.0, 1.0, 0.5] if s == "1" else [1.0, 0.5, 0.5]  # rule scores; -ELBO 8.1, then 8.2
        ev(f"test-s{s}", dict(win_rates=[0.9, 0.7, 0.7], scores_ref=[-1.0, 0.0, -0.5],
                              scores=[armap, [0.0, 1.0, 0.0], [0.0, 1.0, 0.0]]))
        ev(f"lik-ar-map-2e-4-s{s}", dict(nelbo_bits_per_token=8.1, per_sequence=[7.9, 8.3] if s == "1" else [8.1, 8.3]))
        ev(f"lik-dlm-dpo-2e-4-s{s}", dict(nelbo_bits_per_token=7.1, per_sequence=[7.0, 7.2]))
        ev(f"lik-dlm-dpo-time-2e-4-s{s}", dict(nelbo_bits_per_token=7.1, per_sequence=[7.0, 7.2]))
    protocol.stdlib_armap_protocol(str(tmp_path), "2e-4", "2e-4", "60", "6e-4 2e-4", "1", "2")
    out = capsys.readouterr().out
    assert "| AR-MAP | 0.700, γ 2 | 0.800, γ 1 * |" in out and "| DPO on the DLM | 0.600 | 0.600 * |" in out
    assert "| AR-MAP, DPO lr 2e-4 | 0.900 / 0.900 | 0.750 | 0.833 / 0.667 | 8.150 | 8.100 / 8.200 | 1, 2 | 30 |" in out
    assert ("| DPO on the DLM, lr 2e-4, 60 steps (AR-MAP's seconds) | 0.700 / 0.700 | 0.333 | 0.333 / 0.333 | 7.100 | "
            "7.100 / 7.100 | — | 30 |") in out
    assert "| the REPR-ALIGN DLM (the start) | — | -0.500 | -0.500 / -0.500 | 7.000 | — | — | — |" in out
    a, b = [-1.0, 0.0, -0.5] * 2, [1.0, 1.0, 0.5, 1.0, 0.5, 0.5]
    p = p_two_seeds(4 / 3, 7 / 6)  # the seeds' differences: 0.833 and 0.667 against -0.5
    assert (f"| the transfer: AR-MAP against the start, rule score | -0.500 | 0.750 | 2 ahead, 0 tied of 2 | {p:.3g} | "
            f"{p:.3g} | {stats.paired_t(a, b):.3g} |") in out
    rule, nelbo = (stats.paired_t([0.0, 1.0, 0.0] * 2, [1.0, 1.0, 0.5, 1.0, 0.5, 0.5]),
                   stats.paired_t([7.0, 7.2] * 2, [7.9, 8.3, 8.1, 8.3]))  # pooled, (seed, item) pairs
    p, pooled = p_two_seeds(1.0, 1.1), stats.holm([rule, nelbo, rule, nelbo])[1]
    assert "| AR-MAP against DPO on the DLM, equal time: -ELBO | 7.100 | 8.150 | 0 ahead, 0 tied of 2 |" in out
    assert (f"| AR-MAP against DPO on the DLM, equal steps: -ELBO | 7.100 | 8.150 | 0 ahead, 0 tied of 2 | {p:.3g} |"
            in out and "Holm across the 4" in out and f"| {pooled:.3g} |" in out)
    p = p_two_seeds(0.5, 1 / 3)
    assert (f"| AR-MAP against DPO on the DLM, equal steps: rule score | 0.333 | 0.750 | 2 ahead, 0 tied of 2 | "
            f"{p:.3g} |") in out


def test_stdlib_l2_protocol(tmp_path, capsys):
    """Cosine against L2 in the standard library: L2's (λ, rate) by the lowest first-half -ELBO (a tie: the lower λ,
    then the lower rate), one test on the other half."""
    def lik(name, seqs):
        write(tmp_path / f"eval/{name}.json", dict(results=dict(nelbo_bits_per_token=sum(seqs) / len(seqs),
                                                                per_sequence=seqs, n_draws=4)))
    for lam, vals in (("0.3", (7.5, 7.0)), ("1", (7.0, 7.2))):
        for r, v in zip(("3e-3", "1e-3"), vals):
            lik(f"val-l2-{lam}-{r}", [v])
            write(tmp_path / f"l2-{lam}-{r}-s1/results.json", dict(step_seconds_median=0.6))
    protocol.nelbo_l2_sweep(str(tmp_path), "0.3 1", "3e-3 1e-3")
    assert capsys.readouterr().out.strip() == "0.3 1e-3"  # 7.0 twice: the lower λ
    for s in ("1", "2"):
        lik(f"l2-0.3-1e-3-s{s}", [7.0, 7.4])
        lik(f"lam10-3e-3-s{s}", [6.9, 7.0] if s == "1" else [7.0, 7.0])
    protocol.stdlib_l2_protocol(str(tmp_path), "3e-3", "0.3", "1e-3", "0.3 1", "3e-3 1e-3", "1", "2")
    out = capsys.readouterr().out
    assert "| L2, λ = 0.3 | 7.500, 0.600 s | 7.000, 0.600 s * |" in out and "| L2, λ = 1 | 7.000, 0.600 s |" in out
    p, pooled = p_two_seeds(-0.25, -0.2), stats.paired_t([7.0, 7.4] * 2, [6.9, 7.0, 7.0, 7.0])
    assert (f"| cosine against L2 | 7.200 | 6.975 | -0.225 | 2 ahead, 0 tied of 2 | {p:.3g} | {p:.3g} | {pooled:.3g} |"
            in out)


def test_time_steps(tmp_path, capsys):
    """The equal-time arm's steps: the cheaper arm's steps in the costlier one's time, or STEPS when the costlier is
    within 5% (no time arm)."""
    for name, sec in (("costly", 0.13), ("cheap", 0.10), ("close", 0.104)):
        write(tmp_path / f"{name}/results.json", dict(step_seconds_median=sec))
    protocol.time_steps(str(tmp_path / "costly"), str(tmp_path / "cheap"), "80")
    assert capsys.readouterr().out.strip() == "104"  # 80 × 1.3
    protocol.time_steps(str(tmp_path / "close"), str(tmp_path / "cheap"), "80")
    assert capsys.readouterr().out.strip() == "80"


def conversion_run(acc_sum, acc_cap, tpf, f1, open_tpf=None):
    """A realworld.py run over a capital, a sum and an open prompt; open_tpf: the open reply's tokens per forward
    (default tpf)."""
    rows = [dict(family=f, prompt=f"{f} prompt", reply=f"{f} reply", right=None if f == "open" else True,
                 tokens_per_forward=tpf if f != "open" or open_tpf is None else open_tpf)
            for f in ("capital", "sum", "open")]
    return dict(accuracy_capital=acc_cap, accuracy_sum=acc_sum, accuracy=(acc_sum + acc_cap) / 2, f1=f1, f1_open=f1,
                tokens_per_forward=sum(r["tokens_per_forward"] for r in rows) / 3, canvas=32, rows=rows)


def test_conversion_curve_and_table(tmp_path, capsys, monkeypatch):
    """scripts/conversion.py: an arm's curve from its snapshots (minutes from snapshot.json, kept = student over
    teacher) and the frontier of its last snapshot; run.sh real's student-against-teacher table."""
    write(tmp_path / "ar.json", dict(prompts=3, runs=dict(greedy=conversion_run(0.4, 0.6, 1.0, 1.0))))
    R = tmp_path / "arm"
    for step, sec, acc in ((10, 300, 0.2), (40, 1200, 0.45)):
        write(R / f"step-{step}" / "snapshot.json", dict(step=step, train_seconds=sec))
        runs = {"0.9": conversion_run(acc, acc, 1.8, 0.5)} | ({"1": conversion_run(acc, 0.5, 1.5, 0.6, 0.9)}
                                                              if step == 40 else {})
        write(R / "eval" / f"step-{step}.json", dict(runs=runs, nelbo_bits=2.5))
    conversion.conversion_curve(str(R), str(tmp_path / "ar.json"))
    out = capsys.readouterr().out
    assert "| 10 | 5.0 | 0.20 | 0.20 | 0.20 | 40% | 0.50 | 0.50 | 2.500 | 1.80 |" in out
    assert "| 40 | 20.0 | 0.45 | 0.45 | 0.45 | 90% |" in out
    assert "| 1 | 0.47 | 95% | 0.60 | 1.30 | 1.50 |" in out  # the last snapshot at threshold 1: (1.5+1.5+0.9)/3
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure
    R2 = tmp_path / "seed2"  # a second seed, its one snapshot at step 40 only
    write(R2 / "step-40" / "snapshot.json", dict(step=40, train_seconds=1500))
    write(R2 / "eval" / "step-40.json", dict(runs={"0.9": conversion_run(0.25, 0.25, 1.8, 0.5)}, nelbo_bits=2.5))
    drawn, savefig = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig), savefig(fig, *a, **k)))
    conversion.conversion_plot(str(tmp_path / "curve.png"), str(tmp_path / "ar.json"), str(R), f"{R},{R2}")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    acc = drawn[0].axes[0]
    assert list(acc.lines[0].get_ydata()) == [0.2, 0.45]  # the curve: each snapshot
    (bar,) = acc.containers  # the two seeds: the mean of their last points, the range as the bar
    x, y = bar.lines[0].get_data()
    assert list(x) == pytest.approx([22.5]) and list(y) == pytest.approx([0.35])
    assert bar.lines[2][0].get_segments()[0][:, 1].tolist() == pytest.approx([0.25, 0.45])
    O = tmp_path / "real"
    write(O / "eval" / "ar.json", dict(prompts=3, runs=dict(greedy=conversion_run(0.4, 0.6, 1.0, 1.0))))
    write(O / "eval" / "student.json", dict(prompts=3, nelbo_bits=2.25, runs={"0.9": conversion_run(0.4, 0.5, 1.6,
                                                                                                  0.7)}))
    write(O / "student" / "results.json", dict(steps=400, train_seconds_this_run=1500))
    conversion.conversion(str(O))
    out = capsys.readouterr().out
    assert "400 steps, 25.0 min of training" in out and "1 capital, 1 sum, 1 open" in out
    assert "| student, threshold 0.9 | 0.50 | 0.40 | 0.45 | 90% | 0.70 | 0.70 | 1.60 | 1.60 | 2.250 |" in out
    assert "| 'open prompt' | 'open reply' | 'open reply' | 1.60 |" in out


def test_conversion_verdicts_take_the_training_run_as_the_unit(tmp_path, capsys):
    """Two arms x 3 seeds: the primary test is the paired t over the seeds' means (Holm across the two metrics),
    the per-prompt paired t beside it; an arm ahead in every seed by a steady margin is "ahead", one whose seeds
    disagree is "level" even where the prompts, pooled, would call it."""
    import random
    rng = random.Random(0)

    def arm(name, seed, p_right, f1):
        R = tmp_path / f"{name}-s{seed}"
        write(R / "step-100" / "snapshot.json", dict(step=100, train_seconds=600))
        rows = [dict(family=f, right=None if f == "open" else rng.random() < p_right, f1=f1 + rng.random() * 0.01)
                for f in ["sum", "capital", "open"] * 40]
        write(R / "eval" / "step-100.json", dict(runs={"0.9": dict(rows=rows)}, nelbo_bits=3.0))
        return str(R)
    a = [arm("a", s, 0.3, 0.5) for s in range(3)]
    b = [arm("b", s, p, 0.6) for s, p in zip(range(3), (0.2, 0.6, 0.45))]  # accuracy: seeds disagree in size
    conversion.conversion_verdicts(",".join(a), ",".join(b))
    out = capsys.readouterr().out
    seeds = [sum(r["right"] for r in json.loads((Path(R) / "eval/step-100.json").read_text())["runs"]["0.9"]["rows"]
                 if r["right"] is not None) / 80 for R in a + b]
    p_acc = stats.paired_t(seeds[:3], seeds[3:])
    f1_row = next(line for line in out.splitlines() if line.startswith("| F1 with the teacher"))
    acc_row = next(line for line in out.splitlines() if line.startswith("| accuracy"))
    assert "| 3 ahead, 0 tied of 3 |" in f1_row and f1_row.endswith("| 120 | ahead |")
    assert f"| {protocol.pval(p_acc)} |" in acc_row and acc_row.endswith("| 80 | level |") and p_acc > 0.05
    prompt_p = [float(row.split(" | ")[6]) for row in (acc_row, f1_row)]  # beside it: the per-prompt p, and Holm's
    assert [float(row.split(" | ")[7]) for row in (acc_row, f1_row)] == pytest.approx(stats.holm(prompt_p), rel=1e-2)
    assert f"| a-s1 | b-s1 | {seeds[1]:.3f} | {seeds[4]:.3f} | " in out  # each pair's units, in the seeds' order
    with pytest.raises(SystemExit):
        conversion.conversion_verdicts(",".join(a), b[0])  # seeds that do not pair
    write(tmp_path / "b0.json", json.loads((Path(b[0]) / "eval/step-100.json").read_text()))
    conversion.conversion_verdicts(a[0], str(tmp_path / "b0.json"))  # one run each (B as a realworld.py result)
    out = capsys.readouterr().out
    right = [[r["right"] for r in json.loads((Path(R) / "eval/step-100.json").read_text())["runs"]["0.9"]["rows"]
              if r["right"] is not None] for R in (a[0], b[0])]
    p_acc = stats.mcnemar(*right)  # right/wrong per prompt: McNemar's exact test, not a t-test
    acc_row = next(line for line in out.splitlines() if line.startswith("| accuracy"))
    assert "No verdict" in out and "ahead" not in out and "level" not in out
    assert acc_row.startswith(f"| accuracy (sums and capitals) | {seeds[0]:.3f} | {seeds[3]:.3f} | "
                              f"{protocol.pval(p_acc)} |") and acc_row.endswith("| 80 |")


def test_conversion_goal_tests_each_run_against_the_goal(tmp_path, capsys):
    """scripts/conversion.py conversion_goal: each run's kept share (accuracy on the checked prompts over the
    teacher's) and its tokens per forward on them, against the goals over the runs (one-sample t, Holm across the
    two), the per-prompt test beside it; short, met or not settled by the Holm p and the mean's side."""
    families = ["capital", "sum", "open", "capital", "sum"] * 8  # 32 checked prompts, 8 open ones
    teacher = [dict(family=f, prompt=f"p{k}", right=None if f == "open" else k % 4 != 0, tokens_per_forward=1.0)
               for k, f in enumerate(families)]  # the teacher answers 24 of the 32 checked prompts: 0.75
    write(tmp_path / "ar.json", dict(runs=dict(greedy=dict(rows=teacher))))

    def run(name, n_right, tpf):  # right on the first n_right checked prompts, tpf on each checked reply
        rows, seen = [], 0
        for r in teacher:
            seen += r["right"] is not None
            rows.append(dict(r, right=None if r["right"] is None else seen <= n_right,
                             tokens_per_forward=0.5 if r["right"] is None else tpf))
        write(tmp_path / f"{name}.json", dict(runs={"0.9": dict(rows=rows)}))
        return str(tmp_path / f"{name}.json")

    def rows_of(out):
        return {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in out.splitlines()
                if line.startswith(("| kept", "| tokens"))}
    short = [run(f"short{k}", n, t) for k, (n, t) in enumerate(((14, 1.3), (15, 1.32), (13, 1.29)))]
    conversion.conversion_goal(str(tmp_path / "ar.json"), ",".join(short))
    out = capsys.readouterr().out
    kept = [n / 32 / 0.75 for n in (14, 15, 13)]  # 58%, 62%, 54%: short of 90% in every run
    p = stats.holm([stats.paired_t([0.9] * 3, kept), stats.paired_t([1.5] * 3, [1.3, 1.32, 1.29])])
    rows = rows_of(out)
    assert rows["kept share of the teacher's accuracy"][1:5] == ["90%", "58%", "0 of 3", protocol.pval(
        stats.paired_t([0.9] * 3, kept))]
    assert rows["kept share of the teacher's accuracy"][5] == protocol.pval(p[0]) and p[0] < 0.05
    assert rows["kept share of the teacher's accuracy"][-1].rstrip(" |") == "short"
    assert rows["tokens per forward (sums and capitals)"][2] == "1.30"  # the open replies' 0.5 left out
    assert "| short1.json | 0.469 | 62% | 1.32 |" in out.replace(f"{tmp_path.name}/", "")
    above = [run(f"above{k}", n, t) for k, (n, t) in enumerate(((31, 2.0), (32, 2.1), (30, 2.05)))]
    conversion.conversion_goal(str(tmp_path / "ar.json"), ",".join(above), "0.9", "1.5")
    assert [r[-1].rstrip(" |") for r in rows_of(capsys.readouterr().out).values()] == ["met", "met"]
    mixed = [run(f"mixed{k}", n, t) for k, (n, t) in enumerate(((10, 1.2), (31, 1.8), (20, 1.5)))]
    conversion.conversion_goal(str(tmp_path / "ar.json"), ",".join(mixed), "0.5", "1.6")
    rows = rows_of(capsys.readouterr().out)
    assert rows["kept share of the teacher's accuracy"][1] == "50%" and rows["tokens per forward (sums and "
                                                                            "capitals)"][1] == "1.60"
    p_tpf = stats.paired_t([1.6] * 3, [1.2, 1.8, 1.5])
    assert rows["tokens per forward (sums and capitals)"][4] == protocol.pval(p_tpf)
    assert [r[-1].rstrip(" |") for r in rows.values()] == ["not settled", "not settled"]
    prompt_acc = [sum(bool(r["right"]) for r in rows_) / 3 for rows_ in zip(*[
        [r for r in json.loads(Path(R).read_text())["runs"]["0.9"]["rows"] if r["right"] is not None] for R in mixed])]
    checked = [r for r in teacher if r["right"] is not None]
    assert rows["kept share of the teacher's accuracy"][6] == protocol.pval(
        stats.paired_t([0.5 * r["right"] for r in checked], prompt_acc))  # beside it: the prompts
    conversion.conversion_goal(str(tmp_path / "ar.json"), ",".join(short))
    rows = rows_of(capsys.readouterr().out)  # by hand (scipy.stats.ttest_1samp of each prompt's difference): the
    # mean over runs of right, minus 0.9 x the teacher's 0/1; its mean is accuracy − 0.9 x 0.75 = 0.4375 − 0.675
    assert rows["kept share of the teacher's accuracy"][6] == "0.0432"  # 0.04320 by scipy
    assert rows["tokens per forward (sums and capitals)"][6] == "< 1e-300"  # every prompt 1.3067 against 1.5: no spread
    conversion.conversion_goal(str(tmp_path / "ar.json"), short[0])  # one run: no test over runs, no verdict
    out = capsys.readouterr().out
    assert "no verdict" in out and all(r[4:6] == ["—", "—"] and r[-1].rstrip(" |") == "—"
                                       for r in rows_of(out).values())
    other = json.loads(Path(short[1]).read_text())
    other["runs"]["0.9"]["rows"].reverse()
    write(tmp_path / "other.json", other)
    with pytest.raises(SystemExit, match="did not answer the teacher's held-out prompts"):
        conversion.conversion_goal(str(tmp_path / "ar.json"), f"{short[0]},{tmp_path / 'other.json'}")
    write(tmp_path / "none.json", dict(runs=dict(greedy=dict(rows=[dict(r, right=r["right"] and False)
                                                                   for r in teacher]))))
    with pytest.raises(SystemExit, match="answers none of the checked prompts"):
        conversion.conversion_goal(str(tmp_path / "none.json"), short[0])


def test_conversion_sweep_names_the_chosen_rate_and_its_edge(tmp_path, capsys):
    """scripts/conversion.py conversion_sweep: the lowest −ELBO on the validation prompts chooses the rate (not the
    corpus's validation −ELBO beside it), a tie the lower rate; a choice at either end of the rates is an edge."""
    write(tmp_path / "ar.json", dict(runs=dict(greedy=conversion_run(0.2, 0.4, 1.0, 1.0))))  # the teacher: 0.30

    def runs(nelbos, corpus=(3.0, 3.1, 3.2)):
        out = [str(tmp_path / "ar.json")]
        for (rate, v), c in zip(nelbos.items(), corpus):
            write(tmp_path / rate / "results.json", dict(val_nelbo=c, steps=125, train_seconds_this_run=600))
            write(tmp_path / rate / "eval/validation.json",
                  dict(nelbo_bits=v, runs={"0.9": conversion_run(0.2, 0.3, 1.4, 0.5, open_tpf=1.1)}))
            out.append(f"{rate}={tmp_path / rate}")
        return out
    conversion.conversion_sweep(*runs({"3e-4": 3.9, "1e-4": 3.7, "3e-5": 3.8}))
    out = capsys.readouterr().out  # kept: 0.25 of the teacher's 0.30; tokens per forward: the open reply left out
    assert "| 0.0001 * | 125 | 10.0 | 3.700 | 0.25 | 83% | 0.50 | 1.40 | 3.100 |" in out
    assert "chosen: 0.0001 (inside the sweep)" in out
    assert out.index("| 3e-05 |") < out.index("| 0.0001 *") < out.index("| 0.0003 |")  # in rate order
    conversion.conversion_sweep(*runs({"3e-4": 3.5, "1e-4": 3.7, "3e-5": 3.8}, corpus=(3.9, 3.0, 3.0)))
    assert "chosen: 0.0003 (an edge of the sweep: extend it past this rate)" in capsys.readouterr().out
    conversion.conversion_sweep(*runs({"3e-4": 3.7, "1e-4": 3.7, "3e-5": 3.8}))
    assert "chosen: 0.0001 (inside" in capsys.readouterr().out  # a tie: the lower rate


def test_claims_rule_gives_each_word():
    """scripts/claims.py verdict, the one rule, on hand-made tests (setting, sign, Holm p; None: not tested)."""
    v = claims.verdict
    assert v([("steps", 1, 0.01), ("time", 1, 0.049)]) == "reproduced"
    assert v([("steps", -1, 0.001), ("time", -1, 0.02)]) == "contradicted"
    assert v([("0.5", -1, 0.01), ("0.7", 1, 0.4), ("0.9", 1, 0.01)]) == \
        "mixed (ahead at 0.9; behind at 0.5; level at 0.7)"
    assert v([("steps", 1, 0.01), ("time", 1, 0.05)]) == "mixed (ahead at steps; level at time)"  # 0.05 is not < 0.05
    assert v([("steps", 1, 0.2), ("time", -1, 0.6)]) == "not significant"
    assert v([("0.9", 1, 0.001), ("1.0", 1, None)]) == "reproduced where tested"
    assert v([("0.5", -1, 0.001), ("0.9", 1, None)]) == "contradicted where tested"
    assert v([("steps", 1, None)], seeds_run=1) == "one seed: not tested"
    assert v([("steps", 1, None)], seeds_run=3) == "not tested per seed"
    assert v([("steps", 0, 0.0)]) == "not significant"  # a tie is a tie, never a win, whatever its p
    # metrics within one setting: one significant and none the other way decides it; both ways split it
    assert v([("steps", -1, 0.01), ("steps", 1, 0.3)]) == "contradicted"
    assert v([("steps", -1, 0.01), ("steps", 1, 0.01)]) == "mixed (split at steps)"


def claims_row(cell, claim="A claim"):
    fixed = {"text": "—", "reason": "not run"}
    return {"claim": claim, "cells": {"tasks": cell, "stdlib": fixed, "real": fixed}}


def claims_cell(tests, **kw):
    return {"arms": {"A": "base", "B": "paper"}, "metric": "exact match", "better": "higher", "seeds_run": 3,
            "source": {"section": "S", "command": "C"}, "not_per_seed": "why", "tests": tests, **kw}


def claims_test(setting, a, b, pooled=("0.40", "0.50", "0.001")):
    t = {"setting": setting, "pooled": dict(zip(("A", "B", "p_holm"), pooled), test="McNemar")}
    if a is not None:
        t["per_seed"] = {"seeds": list(range(1, len(a) + 1)), "A": " / ".join(a), "B": " / ".join(b)}
    return t


def test_claims_cells_from_hand_made_numbers(tmp_path):
    """A cell's words: the paired t over the seeds' means with Holm across the cell's tests, the seeds ahead (ties
    apart), the settings without per-seed numbers named, the pooled test's word by the same rule; lower-is-better
    flips "ahead"."""
    a, steady, noisy = ["0.40", "0.50", "0.45"], ["0.50", "0.61", "0.54"], ["0.50", "0.40", "0.45"]
    write(tmp_path / "1.json", claims_row(claims_cell([claims_test("steps", a, steady), claims_test("time", a, noisy),
                                                       claims_test("1.0", None, None, ("0.5", "0.4", "0.01"))])))
    rows = claims.load(tmp_path)
    p = stats.holm([stats.paired_t([.4, .5, .45], [.5, .61, .54]), stats.paired_t([.4, .5, .45], [.5, .4, .45])])
    text = claims.table(rows).splitlines()[2]
    assert text.startswith(f"| A claim | mixed (ahead at steps; level at time) (paper ahead in 3/3 seeds at "
                           f"steps, p = {p[0]:.2g}; in 1/3 seeds, 1 tied at time, p = {p[1]:.2g}; 1.0 untested); "
                           f"pooled per prompt: mixed (ahead at steps, time; behind at 1.0) | — | — |")
    assert p[0] < 0.05 < p[1]
    lower = claims_cell([claims_test("steps", steady, a, ("0.5", "0.4", "0.02"))], better="lower")
    write(tmp_path / "1.json", claims_row(lower))
    assert "| reproduced, tentatively (3 seeds; a verdict needs 5) (paper ahead in 3/3 seeds at steps" in \
        claims.table(claims.load(tmp_path))  # fewer seeds than the protocol's five
    five = ["0.40", "0.50", "0.45", "0.42", "0.47"], ["0.50", "0.61", "0.54", "0.50", "0.58"]
    write(tmp_path / "1.json", claims_row(claims_cell([claims_test("steps", *five)], seeds_run=5)))
    assert "| reproduced (paper ahead in 5/5 seeds at steps, p = " in claims.table(claims.load(tmp_path))
    write(tmp_path / "1.json", claims_row(claims_cell([claims_test("", ["0.3"], ["0.2"])], seeds_run=1)))
    assert "| one seed: not tested; pooled per prompt: reproduced |" in claims.table(claims.load(tmp_path))


def test_claims_refuse_a_bad_file_in_one_line(tmp_path):
    """claims.load: a file that is not JSON, or lacks a world, a reason or a field, or whose per-seed numbers do not
    line up, is refused in one line naming the file and what is wrong."""
    good = claims_cell([claims_test("steps", ["0.1", "0.2"], ["0.3", "0.4"])])
    bad = {"not JSON": ("{", "not JSON"), "no cells": ({"claim": "x"}, "needs {\"claim\""),
           "a world missing": ({"claim": "x", "cells": {"tasks": good}}, "cells must be exactly tasks, stdlib, real"),
           "seeds and values": (claims_row(claims_cell([claims_test("steps", ["0.1", "0.2"], ["0.3"])])),
                                "per_seed has 2 seeds, 2 A and 1 B values"),
           "better": (claims_row(dict(good, better="more")), "better: \"higher\" or \"lower\""),
           "not numbers": (claims_row(claims_cell([claims_test("steps", ["0.1", "x"], ["0.3", "0.4"])])),
                           "not numbers: '0.1 / x'"),
           "no reason": (claims_row({k: v for k, v in claims_cell([claims_test("1.0", None, None)]).items()
                                     if k != "not_per_seed"}), "say why in not_per_seed"),
           "a typo": (claims_row(dict(good, seed_run=3)), "unknown keys ['seed_run']"),
           "fixed without reason": (claims_row({"text": "not measurable here"}), "a fixed cell has a text, a reason")}
    for what, (obj, why) in bad.items():
        folder = tmp_path / what.replace(" ", "-")
        write(folder / "1-row.json", obj if isinstance(obj, str) else json.dumps(obj))
        with pytest.raises(SystemExit) as e:
            claims.load(folder)
        msg = str(e.value)
        assert msg.startswith("claims: ") and "1-row.json: " in msg and why in msg and "\n" not in msg, (what, msg)
    write(tmp_path / "ok" / "1.json", claims_row(good))
    assert len(claims.load(tmp_path / "ok")) == 1


def test_claims_check_passes_on_the_readme_and_fails_on_a_changed_copy(tmp_path, capsys):
    """`python -m scripts.report claims --check`: README.md's table is the one docs/claims/ gives (every number there
    found in the docs/results.md section its source names); a changed cell or a missing row fails in one line."""
    report.TABLES["claims"]("--check")
    readme = (Path(claims.ROOT) / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| OPDLM: on-policy beats off-policy |"))
    last = next(line for line in readme.splitlines() if line.startswith("| AR-MAP beats DPO on the DLM itself |"))
    for changed, where in ((readme.replace(row, row.replace("not significant", "contradicted", 1)),
                            "at line 6 ('OPDLM: on-policy beats off-policy')"),
                           (readme.replace(last + "\n", ""), "('AR-MAP beats DPO on the DLM itself', missing)")):
        (tmp_path / "README.md").write_text(changed)
        with pytest.raises(SystemExit) as e:
            claims.claims("--check", "--readme", tmp_path / "README.md")
        assert "claims table differs" in str(e.value) and where in str(e.value) and "\n" not in str(e.value)
    claims.claims()
    assert capsys.readouterr().out.strip().splitlines() == claims.readme_table(readme)


def test_claims_numbers_are_the_ones_results_md_prints():
    """verify() finds every copied number in its source's section and refuses one that is not there."""
    results = (Path(claims.ROOT) / "docs/results.md").read_text()
    rows = claims.load()
    claims.verify(rows, results)
    t = rows[0]["cells"]["tasks"]["tests"][0]
    assert t["per_seed"]["strings"][0] == "0.392 / 0.463 / 0.477 / 0.528 / 0.390"
    assert stats.paired_t(t["per_seed"]["a"], t["per_seed"]["b"]) == pytest.approx(0.022334, abs=1e-5)  # scipy's
    t["per_seed"]["strings"][0] = "0.392 / 0.463 / 0.477 / 0.528 / 0.391"
    with pytest.raises(SystemExit, match="is not in results.md's section 'REPR-ALIGN under the protocol"):
        claims.verify(rows, results)


def test_a_sweep_that_chose_its_edge_goes_on_past_it():
    assert [stats.next_rate(r, up=False) for r in ("1e-4", "3e-5", "3e-4", "1e-3")] == ["3e-5", "1e-5", "1e-4", "3e-4"]
    assert [stats.next_rate(r, up=True) for r in ("1e-4", "3e-5", "3e-4")] == ["3e-4", "1e-4", "1e-3"]
    assert stats.beyond_edge(["3e-4", "1e-4", "3e-5"], "3e-5") == "1e-5"
    assert stats.beyond_edge(["3e-4", "1e-4", "3e-5"], "3e-4") == "1e-3"
    assert stats.beyond_edge(["3e-4", "1e-4", "3e-5"], "1e-4") is None
    with pytest.raises(ValueError, match="half-decade"):
        stats.next_rate("2e-4", up=False)
    assert stats.beyond_edge(["6e-4", "2e-4", "6e-5"], "6e-4") == "2e-3"  # off the grid: the sweep's own step
    assert stats.beyond_edge(["6e-4", "2e-4", "6e-5"], "6e-5") == "2e-5"
    assert stats.beyond_edge(["6e-4", "2e-4", "6e-5"], "2e-4") is None


def test_winrate_sweep_extends_past_either_routes_edge(tmp_path, capsys):
    """repro_dlm_dpo.sh's sweep: both routes run each rate; --extend names the rate past AR-MAP's edge, else
    DLM-only's, else nothing."""
    for r, wins in (("6e-4", [0.7, 0.8]), ("2e-4", [0.8, 0.6]), ("6e-5", [0.5, 0.5])):
        write(tmp_path / f"eval/val-{r}.json", dict(results=dict(win_rates=wins)))
    protocol.winrate_sweep("--extend", str(tmp_path), "6e-4", "2e-4", "6e-5")
    assert capsys.readouterr().out.strip() == "2e-3"  # AR-MAP chose 2e-4 (inside), DLM-only 6e-4 (the top edge)
    protocol.winrate_sweep("--extend", str(tmp_path), "6e-4", "2e-4")
    assert capsys.readouterr().out.strip() == "6e-5"  # AR-MAP chose 2e-4, now the lower edge


def test_extend_forms_of_the_task_world_sweeps(tmp_path, capsys):
    """val_sweep --extend: the rate past a chosen edge, nothing inside; l2_sweep --extend: λ first, then the rate."""
    for r, a in zip(("1e-3", "3e-4", "1e-4"), (0.2, 0.3, 0.4)):
        write(tmp_path / f"p-lam0-{r}-s1/results.json", {"task_acc": a})
    protocol.val_sweep("--extend", str(tmp_path), "p-lam0", "1e-3", "3e-4", "1e-4")
    assert capsys.readouterr().out.strip() == "3e-5"
    protocol.val_sweep("--extend", str(tmp_path), "p-lam0", "1e-3", "3e-4")
    assert capsys.readouterr().out.strip() == "1e-4"  # 3e-4 chosen: the lower edge of ("1e-3", "3e-4")
    for lam, accs in (("0.3", (0.1, 0.4, 0.2)), ("1", (0.4, 0.3, 0.1))):
        for r, a in zip(("1e-2", "1e-3", "1e-4"), accs):
            write(tmp_path / f"p-l2-{lam}-{r}-s1/results.json", {"task_acc": a})
    protocol.l2_sweep("--extend", str(tmp_path), "0.3 1", "1e-2 1e-3 1e-4")
    assert capsys.readouterr().out.split() == ["lambda", "0.1"]  # (0.3, 1e-3): λ at its edge, the rate inside
    protocol.l2_sweep("--extend", str(tmp_path), "0.3 1", "1e-3 1e-4")
    assert capsys.readouterr().out.split() == ["lambda", "0.1"]
    write(tmp_path / "p-l2-0.3-1e-3-s1/results.json", {"task_acc": 0.0})
    protocol.l2_sweep("--extend", str(tmp_path), "0.3 1", "1e-2 1e-3 1e-4")  # (1, 1e-2): λ's upper edge first
    assert capsys.readouterr().out.split() == ["lambda", "3"]
    protocol.l2_sweep(str(tmp_path), "0.3 1", "1e-2 1e-3 1e-4")
    assert capsys.readouterr().out.split() == ["1", "1e-2"]
    write(tmp_path / "p-lam10-1e-3-s1/results.json", {"task_acc": 0.5, "step_seconds_median": 0.2})
    protocol.sweep_table(tmp_path, [("λ = 10", "p-lam10", "1e-3")], ["1e-3", "3e-4", "1e-3"], 80)
    assert "| λ = 10 | 0.500, 0.200 s * | — |" in capsys.readouterr().out  # each rate once; — : not run


def test_extend_forms_of_the_standard_library_sweeps(tmp_path, capsys):
    """nelbo_sweep and nelbo_l2_sweep --extend: the lowest -ELBO chooses; the value past a chosen edge is printed."""
    def lik(name, v):
        write(tmp_path / f"eval/{name}.json", dict(results=dict(nelbo_bits_per_token=v)))
    for r, v in zip(("3e-3", "1e-3"), (6.0, 6.5)):
        lik(f"val-lam0-{r}", v)
    protocol.nelbo_sweep("--extend", str(tmp_path), "val-lam0", "3e-3", "1e-3")
    assert capsys.readouterr().out.strip() == "1e-2"  # the highest rate chosen: one step up
    for lam, vals in (("0.3", (7.0, 6.9)), ("1", (7.1, 7.2))):
        for r, v in zip(("3e-3", "1e-3"), vals):
            lik(f"val-l2-{lam}-{r}", v)
    protocol.nelbo_l2_sweep("--extend", str(tmp_path), "0.3 1", "3e-3 1e-3")
    assert capsys.readouterr().out.split() == ["lambda", "0.1"]
    protocol.nelbo_l2_sweep(str(tmp_path), "0.3 1", "3e-3 1e-3")
    assert capsys.readouterr().out.split() == ["0.3", "1e-3"]


def test_l2_grid_ends_at_lambda_0_with_lambda_0s_own_runs(tmp_path, capsys):
    """L2's λ grid holds λ = 0, read from the λ = 0 arm's runs (the L2 term vanishes there): a choice at 0, or at the
    least λ above it, is inside the grid (λ ≥ 0), so no sweep goes on below; the upper edge still goes on up. The
    protocol tables then name λ = 0's runs as L2's."""
    def lik(name, v, seqs=None):
        write(tmp_path / f"eval/{name}.json", dict(results=dict(nelbo_bits_per_token=v, per_sequence=seqs or [v],
                                                                n_draws=4)))
    for r in ("3e-3", "1e-3"):
        lik(f"val-lam0-{r}", 6.7 if r == "1e-3" else 6.9)
        write(tmp_path / f"lam0-{r}-s1/results.json", dict(step_seconds_median=0.4))
        for lam, v in (("0.01", 6.8), ("0.1", 6.85)):
            lik(f"val-l2-{lam}-{r}", v)
            write(tmp_path / f"l2-{lam}-{r}-s1/results.json", dict(step_seconds_median=0.6))
    protocol.nelbo_l2_sweep("--extend", str(tmp_path), "0 0.01 0.1", "3e-3 1e-3")
    assert capsys.readouterr().out.split() == ["rate", "3e-4"]  # λ = 0 chosen: not an edge; its rate, the lowest, is
    protocol.nelbo_l2_sweep(str(tmp_path), "0 0.01 0.1", "3e-3 1e-3")
    assert capsys.readouterr().out.split() == ["0", "1e-3"]
    lik("val-lam0-1e-3", 6.9)
    lik("val-l2-0.01-3e-3", 6.5)
    protocol.nelbo_l2_sweep("--extend", str(tmp_path), "0 0.01 0.1", "3e-3 1e-3")
    assert capsys.readouterr().out.split() == ["rate", "1e-2"]  # (0.01, 3e-3): λ inside (the least above 0)
    protocol.nelbo_l2_sweep("--extend", str(tmp_path), "0.01 0.1", "3e-3 1e-3")
    assert capsys.readouterr().out.split() == ["lambda", "0.003"]  # without 0 in the grid, 0.01 is its edge
    lik("val-l2-0.1-3e-3", 6.0)
    protocol.nelbo_l2_sweep("--extend", str(tmp_path), "0 0.01 0.1", "3e-3 1e-3")
    assert capsys.readouterr().out.split() == ["lambda", "0.3"]  # the upper edge goes on up
    lik("val-l2-0.1-3e-3", 6.85)
    lik("val-lam0-1e-3", 6.2)
    for s in ("1", "2"):
        lik(f"lam0-1e-3-s{s}", 6.95, [6.9, 7.0])
        lik(f"lam10-3e-3-s{s}", 7.05, [7.0, 7.1])
    protocol.stdlib_l2_protocol(str(tmp_path), "3e-3", "0", "1e-3", "0 0.01 0.1", "3e-3 1e-3", "1", "2")
    out = capsys.readouterr().out
    assert "| L2, λ = 0 (λ = 0's runs) | 6.900, 0.400 s | 6.200, 0.400 s * |" in out
    assert "| L2, λ = 0 (λ = 0's runs), lr 1e-3, 100 steps | 6.950 | 6.950 / 6.950 |" in out
    assert "| cosine against L2 | 6.950 | 7.050 | +0.100 | 0 ahead, 0 tied of 2 |" in out
    for lam, acc in (("0", 0.3), ("0.01", 0.5), ("0.1", 0.4)):
        write(tmp_path / f"p-{'lam0' if lam == '0' else 'l2-' + lam}-1e-3-s1/results.json", {"task_acc": acc})
    protocol.l2_sweep("--extend", str(tmp_path), "0 0.01 0.1", "1e-3")
    assert capsys.readouterr().out == ""  # the task world's grid: the same bound
    protocol.l2_sweep(str(tmp_path), "0 0.01 0.1", "1e-3")
    assert capsys.readouterr().out.split() == ["0.01", "1e-3"]
    protocol.l2_sweep("--extend", str(tmp_path), "0 0.1", "1e-3")
    assert capsys.readouterr().out.split() == ["lambda", "0.3"]  # one λ above 0, chosen: the top goes on
    protocol.l2_sweep("--extend", str(tmp_path), "0 0.01", "1e-3")
    assert capsys.readouterr().out.split() == ["lambda", "0.03"]


def test_sweep_helper_goes_on_past_a_chosen_edge_three_rates_at_most(tmp_path):
    """scripts/stage.sh's sweep: every rate trained, then the chooser asked; a rate it names is added and trained;
    at most three more; the grid variable ends holding every rate run. sweep2: the same over a λ × rate grid."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    script = f"""source {root}/scripts/stage.sh
train() {{ echo "train $1"; }}
edge_once() {{ [ $# = 2 ] && echo 1e-5 || true; }}   # the first grid (two rates) chose its edge; then inside
always() {{ echo "x$#"; }}                          # always at the edge
g="1e-3 1e-4"; sweep g train edge_once; echo "grid: $g"
h="1e-3"; sweep h train always; echo "grid: $h"
"""
    script += """lam_edge() { [ "$1" = "0.3 1" ] && echo lambda 0.1 || true; }   # λ's edge once, then inside
train2() { echo "train $1 $2"; }
L="0.3 1" R="1e-3"; sweep2 L R train2 lam_edge; echo "grid: $L x $R"
"""
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()
    first = out[:out.index("grid: 1e-3 1e-4 1e-5") + 1]
    last = out[out.index("grid: 1e-3 x1 x2 x3") + 1:]
    assert [x for x in last if x.startswith("train")] == ["train 0.3 1e-3", "train 1 1e-3", "train 0.3 1e-3",
                                                          "train 1 1e-3", "train 0.1 1e-3"]
    assert last[-1] == "grid: 0.3 1 0.1 x 1e-3"
    out = out[:out.index("grid: 1e-3 x1 x2 x3") + 1]
    assert [x for x in first if x.startswith("train")] == ["train 1e-3", "train 1e-4", "train 1e-3", "train 1e-4",
                                                           "train 1e-5"]
    assert out[-1] == "grid: 1e-3 x1 x2 x3"  # three more, then it stops
