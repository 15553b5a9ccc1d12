"""lib/plot.py: the log reading and panel choice (pure, no matplotlib), and a PNG written from synthetic logs."""
import json
import sys

import pytest

from lib import plot


def write_log(run_dir, records):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def pretrain_log(n=40):
    return [dict(step=s, loss=7 - s / 10, lr=1e-3, tokens_per_s=5000.0, time=0.1 * s,
                 **({"val_loss": 7.1 - s / 10} if s % 10 == 0 else {})) for s in range(n)]


def align_log(n=40, layers=12):
    return [dict(step=s, loss=6 - s / 20, diff_loss=5 - s / 20, align_loss=0.3 - s / 400,
                 align_per_layer=[0.5 + 0.04 * i for i in range(layers)], lr=1e-3, grad_norm=1.0, mfu=None,
                 **({"val_loss@0.15": 5.0, "val_loss@0.5": 5.1, "val_loss@0.9": 5.2, "val_acc@0.15": 0.2,
                     "val_acc@0.5": 0.1, "val_acc@0.9": 0.05, "val_nelbo": 5.3} if s % 10 == 0 else {}))
            for s in range(n)]


def distill_log(n=40):
    return [dict(step=s, loss=1.0, kl=1 - s / 100, masked=30.0, rollout_len=16.0 + s, tokens_per_forward=1.0,
                 nfe=16, max_len=16 + s, rollout_share=0.7, **({"val_kl": 0.9} if s % 10 == 0 else {}))
            for s in range(n)]


def titles(panels):
    return [t for t, _ in panels]


def test_series_flattens_lists_skips_non_numbers_and_keeps_the_last_value_of_a_repeated_step():
    recs = [dict(step=0, loss=3.0, per=[1.0, 2.0], note="x", flag=True, mfu=None, time=1.0),
            dict(step=1, loss=2.0, per=[1.5, 2.5]),
            dict(step=2, loss=1.0),
            dict(step=1, loss=2.2, per=[1.6, 2.6]),  # a resumed run repeats step 1 and 2
            dict(step=2, loss=1.2),
            dict(loss=9.0)]  # no step: ignored
    s = plot.series(recs)
    assert set(s) == {"loss", "per[0]", "per[1]"}  # time, strings, bools and None are not series
    assert s["loss"] == ([0, 1, 2], [3.0, 2.2, 1.2])
    assert s["per[0]"] == ([0, 1], [1.0, 1.6]) and s["per[1]"] == ([0, 1], [2.0, 2.6])


def test_default_panels_follow_the_keys_each_script_logs():
    pre = plot.choose_panels(set(plot.series(pretrain_log())))
    assert pre == [(plot.DEFAULT_PANELS[0][0], ["loss", "val_loss"])]  # lr, tokens_per_s: not by default

    ali = dict(plot.choose_panels(set(plot.series(align_log()))))
    assert len(ali) == 5
    per_layer = next(v for t, v in ali.items() if "per layer" in t)
    assert per_layer == [f"align_per_layer[{i}]" for i in range(12)]  # numeric order: [10] after [9]
    acc = next(v for t, v in ali.items() if "accuracy" in t)
    assert acc == ["val_acc@0.15", "val_acc@0.5", "val_acc@0.9"]
    ce = next(v for t, v in ali.items() if "CE of masked" in t)
    assert ce == ["val_loss@0.15", "val_loss@0.5", "val_loss@0.9", "val_nelbo"]

    dis = dict(plot.choose_panels(set(plot.series(distill_log()))))
    assert ["kl", "val_kl"] in dis.values() and ["max_len", "rollout_len"] in dis.values()
    assert ["tokens_per_forward"] in dis.values()
    assert not any("REPR-ALIGN" in t or "DPO" in t for t in dis)


def test_per_layer_keys_under_other_names_land_in_the_same_panel():
    keys = {"loss", "cos_layer_0", "cos_layer_2", "cos_layer_10"}
    panels = dict(plot.choose_panels(keys))
    assert ["cos_layer_0", "cos_layer_2", "cos_layer_10"] in panels.values()
    val = plot.series([dict(step=0, val_cos=[0.1, 0.2, 0.3]), dict(step=5, val_cos=[0.2, 0.3, 0.4])])
    title = next(t for t, patterns in plot.DEFAULT_PANELS if "val_cos*" in patterns)
    assert plot.choose_panels(set(val)) == [(title, ["val_cos[0]", "val_cos[1]", "val_cos[2]"])]


def test_chosen_keys_one_panel_per_pattern_and_missing_ones_dropped():
    keys = set(plot.series(align_log())) | set(plot.series(distill_log()))
    panels = plot.choose_panels(keys, ["kl", "val_acc@*", "no_such_key", "tokens_per_s"])
    assert panels == [("kl", ["kl"]), ("val_acc@*", ["val_acc@0.15", "val_acc@0.5", "val_acc@0.9"])]
    assert plot.choose_panels(set(), None) == []


def test_labels_drop_the_folder_all_runs_share():
    assert plot.labels(["out/align", "out/align0"]) == ["align", "align0"]
    assert plot.labels(["out/a/log.jsonl", "runs/b"]) == ["out/a", "runs/b"]  # a log file stands for its folder
    assert plot.labels(["out/align"]) == ["out/align"]
    assert plot.labels(["out", "out/align"]) == ["out", "out/align"]  # nothing to drop without an empty label


def test_bad_logs_fail_with_one_line(tmp_path):
    with pytest.raises(SystemExit, match="not found"):
        plot.read_log(tmp_path / "nowhere")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "log.jsonl").write_text('{"step": 0, "loss": 1}\n{"step": 1, "lo\n')
    with pytest.raises(SystemExit, match=r"log.jsonl:2 is not JSON"):
        plot.read_log(tmp_path / "bad")


def test_writes_a_png_for_several_runs(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    a = write_log(tmp_path / "align", align_log())
    b = write_log(tmp_path / "align0", [{k: v for k, v in r.items() if k not in ("align_loss", "align_per_layer")}
                                        for r in align_log()])
    d = write_log(tmp_path / "distill", distill_log())
    out = tmp_path / "figs" / "fig.png"
    plot.main([str(a), str(b), str(d / "log.jsonl"), "--out", str(out)])
    png = out.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(png) > 20_000  # eight panels of curves, not an empty canvas
    assert "8 panels" in capsys.readouterr().out


def test_nothing_to_plot_names_the_keys(tmp_path):
    pytest.importorskip("matplotlib")
    a = write_log(tmp_path / "run", pretrain_log())
    with pytest.raises(SystemExit, match="tokens_per_s"):
        plot.main([str(a), "--keys", "no_such_key", "--out", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()


def test_without_matplotlib_a_one_line_error_says_how_to_install_it(tmp_path, monkeypatch):
    a = write_log(tmp_path / "run", pretrain_log())
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    with pytest.raises(SystemExit, match="pip install matplotlib"):
        plot.main([str(a), "--out", str(tmp_path / "x.png")])
