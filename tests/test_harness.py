"""lib/harness.py, the lm-evaluation-harness model class: its log-likelihoods against the project's own (eval.py's AR
likelihood, slow loops, the ELBO by hand), its generations against sample.generate, and lm-eval's command line on
small tasks defined here over local JSONL files (nothing downloaded)."""
import json
import math

import pytest
import torch

from conftest import run_script

pytest.importorskip("lm_eval", reason="lm-eval is optional: pip install -r requirements-dev.txt -c constraints.txt")
from lib import harness  # noqa: E402

KINDS = {"causal": "ar", "bidirectional": "dlm", "block": "block"}


class Req:  # lm-eval's Instance, as far as a model class reads it
    def __init__(self, *args):
        self.args = args


@pytest.fixture(scope="module")
def lms(base_world):
    return {k: harness.AR2DLM(pretrained=str(base_world / d), device="cpu", mc_draws=3) for k, d in KINDS.items()}


PAIRS = [("def f1(x):", "\n    return x + 1"), ("def f2(x):\n    return", " x + 2\n"), ("", "def f3(x):"),
         ("def f1(x):", "\n    return x + 2"), ("x ", "+ 1")]


def slow_ar(model, ids, n_ctx):
    """Σ_{i >= n_ctx} log p(ids_i | ids_<i), one forward per position, and whether each is the argmax."""
    lp, greedy = 0.0, True
    for i in range(n_ctx, len(ids)):
        logits = model(torch.tensor([ids[:i]]), "causal")[0, -1].log_softmax(-1)
        lp += logits[ids[i]].item()
        greedy &= int(logits.argmax()) == ids[i]
    return lp, greedy


def test_ar_loglikelihood_is_exact(lms):
    """AR: each (context, continuation) scores as a slow position-by-position loop, in a batch of other lengths;
    the continuation's ids are those of the whole text after the context's; an empty context is <|endoftext|>."""
    lm = lms["causal"]
    got = lm.loglikelihood([Req(*p) for p in PAIRS])
    for (c, x), (lp, greedy) in zip(PAIRS, got):
        ids, n = lm.encode_pair(c, x)
        whole = lm.tok.encode(c.rstrip() + c[len(c.rstrip()):] + x)
        assert ids[n:] == (whole[len(lm.tok.encode(c.rstrip())):] if c else whole)
        assert (ids[0] == lm.tok.eos_id) == (c == "")
        want_lp, want_greedy = slow_ar(lm.model, ids, n)
        assert lp == pytest.approx(want_lp, abs=1e-4) and greedy == want_greedy
    assert got == lm.loglikelihood([Req(*p) for p in PAIRS[::-1]])[::-1]  # order and batching change nothing


def test_ar_rolling_equals_eval_likelihood(lms, base_world):
    """loglikelihood_rolling of a document = minus eval.py likelihood's summed NLL over the same tokens
    (eval.ar_likelihood on [<|endoftext|>] + the document's ids)."""
    import eval as project_eval
    from lib import data
    lm = lms["causal"]
    text = lm.tok.decode(data.load_split(str(base_world / "data"), "val")[:40].tolist())
    got = lm.loglikelihood_rolling([Req(text)])[0]
    x = torch.tensor([[lm.tok.eos_id] + lm.tok.encode(text)])
    ref = project_eval.ar_likelihood(lm.model, [x], lm.ctx)
    assert got == pytest.approx(-ref["nll_nats"] * ref["tokens"], rel=1e-5)


@pytest.mark.parametrize("kind", ["bidirectional", "block"])
def test_dlm_loglikelihood_is_the_seeded_elbo(lms, kind):
    """A DLM's log-likelihood: the mean over mc_draws of -Σ_{i∈M} CE_i / t with M over the continuation only, the
    draws from harness.seeded(seed, ids): recomputed here one request at a time with diffusion.sequence_elbo
    (whose own slow reference is in test_merge.py); the same in any order; below 0; is_greedy as the argmax of the
    fully masked continuation."""
    import diffusion
    lm = lms[kind]
    got = lm.loglikelihood([Req(*p) for p in PAIRS])
    assert got == lm.loglikelihood([Req(*p) for p in PAIRS[::-1]])[::-1]
    for p, (lp, greedy) in zip(PAIRS, got):
        ids, n = lm.encode_pair(*p)
        x0, T, g = torch.tensor([ids]), len(ids), harness.seeded(lm.seed, ids)
        t = lm.eps + (1 - 2 * lm.eps) * torch.rand(lm.mc_draws, generator=g)
        u = torch.rand(lm.mc_draws, T, generator=g)
        ok = (torch.arange(T) >= max(n, int(lm.model.config.shift)))[None]
        with torch.no_grad():
            want = sum(diffusion.sequence_elbo(lm.model, x0, (u[k] < t[k]) & ok, t[k:k + 1]).item()
                       for k in range(lm.mc_draws)) / lm.mc_draws
            _, pred = diffusion.denoiser_ce(lm.model, x0, torch.where(ok, lm.model.config.mask_token_id, x0), ok,
                                            argmax=True)
        assert lp == pytest.approx(want, rel=1e-5, abs=1e-5) and lp < 0
        assert greedy == bool((pred == x0[ok]).all())


@pytest.mark.parametrize("kind", list(KINDS))
def test_generate_until_is_the_checkpoints_sampler(lms, kind):
    """generate_until: sample.generate with the same settings (greedy, the end ids), cut at the first `until`."""
    import sample
    lm = lms[kind]
    kw = dict(until=["\n\n", "x"], max_gen_toks=12, do_sample=False)
    ctxs = ["def f1(x):\n", "def f22(x):\n    return"]
    got = lm.generate_until([Req(c, kw) for c in ctxs])
    ends = lm.tok.end_ids(lm.model.config)
    gen = sample.generate(lm.model, [lm.tok.encode(c) for c in ctxs], 12, eos_id=ends,
                          generator=torch.Generator().manual_seed(lm.seed), vocab_limit=lm.tok.vocab_size)
    for b, text in enumerate(got):
        full = lm.tok.decode(sample.until_end(gen.generated[b].tolist(), ends))
        assert text == full.split("\n\n")[0].split("x")[0]
    with pytest.raises(ValueError, match="num_beams"):
        lm.generate_until([Req("def", dict(kw, num_beams=2))])
    assert len(lm.generate_until([Req("def", dict(max_gen_toks=7, do_sample=False))])) == 1  # 7: rounded up to a block
    assert lm.canvas(7) == {"causal": 7, "bidirectional": 7, "block": 8}[kind]


def test_end_token_rule_reaches_the_sampler(base_world):
    """eos_rule / eos_penalty as model arguments: passed to sample.generate as sample.py names them (the penalty only
    with its rule), and the generations are that sampler's."""
    import sample
    lm = harness.AR2DLM(pretrained=str(base_world / "dlm"), device="cpu", eos_rule="penalty", eos_penalty="5")
    assert lm.sampler == dict(eos_rule="penalty", eos_penalty=5.0)
    assert harness.AR2DLM(pretrained=str(base_world / "dlm"), device="cpu", eos_rule="last").sampler == dict(
        eos_rule="last")
    got = lm.generate_until([Req("def f1(x):\n", dict(until=["\n\n"], max_gen_toks=8, do_sample=False))])
    ends = lm.tok.end_ids(lm.model.config)
    gen = sample.generate(lm.model, [lm.tok.encode("def f1(x):\n")], 8, eos_id=ends, eos_rule="penalty",
                          eos_penalty=5.0, generator=torch.Generator().manual_seed(lm.seed),
                          vocab_limit=lm.tok.vocab_size)
    assert got == [lm.tok.decode(sample.until_end(gen.generated[0].tolist(), ends)).split("\n\n")[0]]


def test_unknown_model_argument_is_refused(base_world):
    with pytest.raises(ValueError, match="unknown model arguments.*'thresh'"):
        harness.AR2DLM(pretrained=str(base_world / "ar"), device="cpu", thresh=0.9)


def write_tasks(d):
    """A multiple-choice and a generative task, YAML over local JSONL files."""
    mc = [dict(q="def f1(x):\n    return", choices=[" x + 1", " x + 9", " y"], answer=0),
          dict(q="def f2(x):\n    return x +", choices=[" 2", " 7"], answer=0)]
    gen = [dict(prompt="def f3(x):\n", target="    return x + 3"), dict(prompt="def f4(x):\n", target="    return x")]
    for name, rows in (("mc", mc), ("gen", gen)):
        (d / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "t_mc.yaml").write_text(f"""task: t_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {d / 'mc.jsonl'}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{q}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
""")
    (d / "t_gen.yaml").write_text(f"""task: t_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {d / 'gen.jsonl'}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: ["\\n\\n"]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
""")
    return mc, gen


def test_eval_harness_command_runs_local_tasks(lms, base_world, tmp_path, monkeypatch):
    """python eval.py harness --model_args pretrained=DIR --tasks t_mc,t_gen --include_path P: lm-eval's own
    command line, offline; its multiple-choice accuracy is the argmax of the adapter's log-likelihoods, and its
    generations are generate_until's. On the block DLM only (the command line is the same for every kind; the
    adapter's per-kind answers are tested above, in this process)."""
    kind = "block"
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    mc, gen = write_tasks(tmp_path)
    r = run_script("eval.py", "harness", "--model_args", f"pretrained={base_world / KINDS[kind]},mc_draws=3",
                   "--tasks", "t_mc,t_gen", "--include_path", tmp_path, "--output_path", tmp_path / "out",
                   "--log_samples", "--device", "cpu")
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())["results"]
    lm = lms[kind]
    mc_samples = [json.loads(x) for f in (tmp_path / "out").rglob("samples_t_mc_*.jsonl") for x in f.open()]
    assert len(mc_samples) == len(mc)
    for s in mc_samples:  # each choice's (log-likelihood, is_greedy) is the adapter's for the same strings
        args = [tuple(a.values()) for a in s["arguments"].values()]
        got = [(float(x[0][0]), x[0][1] == "True") for x in s["resps"]]  # the samples file holds strings
        assert got == lm.loglikelihood([Req(*a) for a in args])
        best = max(range(len(got)), key=lambda k: got[k][0])
        assert s["acc"] == float(best == int(s["target"]))
    assert math.isclose(res["t_mc"]["acc,none"], sum(s["acc"] for s in mc_samples) / len(mc))
    samples = [json.loads(x) for f in (tmp_path / "out").rglob("samples_t_gen_*.jsonl") for x in f.open()]
    kw = dict(until=["\n\n"], max_gen_toks=8, do_sample=False)
    want = lm.generate_until([Req(d["prompt"], kw) for d in gen])
    assert sorted(s["resps"][0][0] for s in samples) == sorted(want)


def test_eval_harness_refuses_another_model(script):
    r = script("eval.py", "harness", "--model", "hf", "--tasks", "x")
    assert r.returncode == 1 and "ar2dlm" in r.stderr and len(r.stderr.strip().splitlines()) == 1
