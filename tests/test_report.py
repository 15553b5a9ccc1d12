"""scripts/report.py: each table of run.sh and the reproduction scripts, rendered from small JSON files made here
(the shapes eval.py, merge.py, align.py and distill.py write), with the numbers where they belong."""
import json
from pathlib import Path

from scripts import report


def write(path, obj):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))


def task_run(threshold, right, tpf):
    fam = {f: dict(right=right + k / 100, accuracy=right, preferred=0.0) for k, f in enumerate(("sort", "rev", "add"))}
    return dict(threshold=threshold, right=right, accuracy=right, preferred=0.25, tokens_per_forward=tpf, families=fam)


MERGE = dict(best_gamma=0.5, gammas=[0, 0.5], train=dict(n_pairs=8, reward_accuracy=[0.5, 0.875]),
             heldout=dict(reward_accuracy=[0.5, 0.75], n_pairs=4), win_rate=0.625, samples=16)


def test_tasks_world(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write("out/tasks/eval/ar.json", dict(results=dict(runs=[task_run(None, 0.9, 1.0)])))
    write("out/tasks/eval/align.json", dict(results=dict(runs=[task_run(0.5, 0.4, 2.5), task_run(0.9, 0.6, 1.5)])))
    write("out/tasks/merged/merge.json", MERGE)
    report.tasks_world("ar", "align")
    out = capsys.readouterr().out
    assert "| AR teacher (`pretrain.py`, 1200 steps) | 0.90 | 0.91 | 0.92 | 1.00 | — | 0.25 |" in out
    assert "| REPR-ALIGN, λ = 10 (`align.py`, 200 steps) | 0.60 | 0.61 | 0.62 | 1.50 | 0.40 / 2.50 | 0.25 |" in out
    assert "| align | 0.40 / 2.50 | 0.60 / 1.50 |" in out and "| ar |" not in out.split("Accuracy against")[1]
    assert "γ = 0.5 chosen on 8 training pairs (reward accuracy 0.875); held-out reward accuracy 0.750" in out


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
    report.stdlib_world("ar-tiny", "align")
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
    run = lambda masks: dict(MERGE, masks=masks, n_masks=2, train=dict(stats, n_pairs=8), heldout=stats,
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
    for m in ("align0", "align", "distill-off", "distill"):
        for s, acc in (("1", 0.5), ("2", 0.7)):
            runs = [task_run(0.5, acc, 2.0), task_run(0.9, acc, 1.0)]
            write(R / f"eval-{m}-s{s}.json", dict(results=dict(runs=runs)))
    for m in ("ar", "ar-dpo", "ar-dpo-plain"):
        write(R / f"eval-{m}.json", dict(results=dict(runs=[task_run(None, 0.8, 1.0)])))
    write("out/tasks/ar-dpo/results.json", dict(heldout_reward_acc=0.95))
    write(R / "ar-dpo-plain/results.json", dict(heldout_reward_acc=0.99))
    write(R / "eval-merged-g0.5.json", dict(results=dict(runs=[task_run(0.9, 0.55, 1.2)])))
    write(R / "merged-g0.5/merge.json", dict(heldout=dict(reward_accuracy=[0.6])))
    report.repro_tasks("1 2", "0.5")
    out = capsys.readouterr().out
    assert "| REPR-ALIGN, λ = 10 | 0.60 ± 0.14 / 2.00 ± 0.00 | 0.60 ± 0.14 / 1.00 ± 0.00 | 0.60 ± 0.14 |" in out
    assert "| plain DPO (--sft_weight 0) | 0.80 / 0.00 | 0.80 / 0.00 | 0.80 / 0.00 | 0.990 |" in out
    assert "| the teacher | 0.80 / 0.00 | 0.80 / 0.00 | 0.80 / 0.00 | — |" in out
    assert "| 0.5 | 0.600 | 0.55 | 0.55 | 0.25 | 1.20 |" in out


def test_repro_distill(tmp_path, capsys):
    gen = lambda ppl: dict(results=dict(gen_perplexity=ppl, unigram_entropy_bits=3.0, repetition_4gram=0.1,
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
