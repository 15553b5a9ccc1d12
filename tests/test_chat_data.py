"""Instruction data: lib.corpus on a JSONL of conversations ({"messages": [...]}, Hugging Face's shape), rendered by the
checkpoint's chat template with the assistant turns' tokens marked (against the template applied by hand here);
the counted skips; align.py --assistant_only training on those tokens only; distill.py's prompts from the turns
before each answer."""
import json
import shutil

import numpy as np
import pytest
import torch

from conftest import run_script, world_copy
from lib import corpus
from lib import data
from lib.tokenizer import Tokenizer

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def with_template(src, dst, template=CHATML):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg | {"chat_template": template}))
    return dst


@pytest.fixture(scope="module")
def world(base_world, tmp_path_factory):
    root = world_copy(base_world, tmp_path_factory, "chat")
    for name in ("ar", "dlm", "block_shift"):
        with_template(root / name, root / f"{name}_chat")
    return root


def by_hand(messages):
    """The ChatML rendering written out, as (text, trained?) pieces: each assistant content and its <|im_end|>."""
    pieces = []
    for m in messages:
        pieces.append((f"<|im_start|>{m['role']}\n", False))
        pieces += [(m["content"], m["role"] == "assistant"), ("<|im_end|>", m["role"] == "assistant"), ("\n", False)]
    return pieces


CONV = [dict(role="system", content="Be brief."), dict(role="user", content="add 2 3"),
        dict(role="assistant", content="5"), dict(role="user", content="and 4 4?"),
        dict(role="assistant", content="It is 8.")]


def test_chat_tokens_against_the_template_by_hand(world):
    tok = Tokenizer.from_pretrained(world / "ar_chat")
    ids, assistant = corpus.chat_tokens(tok, CONV)
    want_ids, want_mask = [], []
    for text, trained in by_hand(CONV):
        t = tok.encode(text, allowed_special="all")
        want_ids, want_mask = want_ids + t, want_mask + [int(trained)] * len(t)
    assert ids == want_ids and assistant == want_mask
    assert tok.decode([i for i, a in zip(ids, assistant) if a]) == "5<|im_end|>It is 8.<|im_end|>"


def test_chat_tokens_refusals(world, tmp_path):
    tok = Tokenizer.from_pretrained(world / "ar_chat")
    for messages, why in [([dict(role="user", content="hi")], "no assistant turn"),
                          ([dict(role="robot", content="x"), dict(role="assistant", content="y")], "'robot'"),
                          ([dict(role="user")], "list of {role, content}"), ("hi", "list of {role, content}")]:
        with pytest.raises(ValueError, match=why):
            corpus.chat_tokens(tok, messages)
    # a template that does not render an earlier answer as given: its tokens cannot be found
    hides = with_template(world / "ar", tmp_path / "hides", CHATML.replace("{{ m['content'] }}", "{% if loop.last %}"
                                                                          "{{ m['content'] }}{% endif %}"))
    with pytest.raises(ValueError, match="does not render an assistant content"):
        corpus.chat_tokens(Tokenizer.from_pretrained(hides), CONV)
    # a template that strips the content: found without its surrounding whitespace
    strip = with_template(world / "ar", tmp_path / "strip", CHATML.replace("m['content']", "m['content'] | trim"))
    ids, assistant = corpus.chat_tokens(Tokenizer.from_pretrained(strip), [dict(role="user", content="q"),
                                                                         dict(role="assistant", content=" a \n")])
    assert Tokenizer.from_pretrained(strip).decode([i for i, a in zip(ids, assistant) if a]) == "a<|im_end|>"


def conversations(n, long_every=None):
    out = []
    for k in range(n):
        a, b = k % 10, (3 * k) % 10
        answer = f"{a + b}" + (" and so on" * 12 if long_every and k % long_every == 0 else "")
        out.append(dict(messages=[dict(role="user", content=f"add {a} {b}"), dict(role="assistant", content=answer)]))
    return out


def write_jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_prepare_marks_assistant_tokens_and_counts_skips(world, tmp_path):
    bad = [dict(messages=[dict(role="user", content="no answer")]),
           dict(messages=[dict(role="robot", content="x"), dict(role="assistant", content="y")]),
           dict(messages=[dict(role="user", content="x"), dict(role="assistant", content="y")])]
    src = write_jsonl(tmp_path / "chats.jsonl", conversations(30) + bad)
    meta = corpus.prepare(str(tmp_path / "d"), source=str(src), tokenizer=str(world / "ar_chat"))
    assert meta["chat"] and meta["skipped_conversations"] == {"no assistant turn": 1, "role 'robot' is not one of "
                                                              "system, user, assistant, tool": 1}
    assert sum(s["documents"] for s in meta["splits"].values()) == 31
    tok = Tokenizer.from_pretrained(tmp_path / "d")
    assert tok.chat_template == CHATML  # the template travels with the dataset
    for split in ("train", "val"):  # the marks line up with the tokens: every conversation re-derived
        ids, roles = data.load_split(tmp_path / "d", split), data.load_roles(tmp_path / "d", split)
        assert len(ids) == len(roles) and roles.max() == 1
        docs = np.split(np.arange(len(ids)), np.flatnonzero(np.asarray(ids) == tok.eos_id) + 1)[:-1]
        for d in docs:
            text = tok.decode(ids[d[:-1]].tolist())
            user = text.split("\n")[1].split("<|im_end|>")[0]
            msgs = next(r["messages"] for r in conversations(30) + bad[2:] if r["messages"][0]["content"] == user)
            want = corpus.chat_tokens(tok, msgs)
            assert ids[d[:-1]].tolist() == want[0] and roles[d].tolist() == want[1] + [0]
    assert data.load_roles(world / "data", "train") is None  # plain documents have none
    r = run_script("lib/corpus.py", "--source", src, "--out_dir", tmp_path / "e", "--tokenizer", "byte")
    assert r.returncode == 1 and "--tokenizer DIR" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_script("lib/corpus.py", "--source", src, "--out_dir", tmp_path / "e", "--tokenizer", world / "ar")
    assert r.returncode == 1 and "no chat template" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_align_assistant_only(world, tmp_path, monkeypatch):
    """Every corruption may mask only assistant tokens (the marks of its conversations), each training row packs
    whole conversations at their own positions, and a conversation longer than --seq_len is left out (not cut) and
    counted. Refused on plain data and with --loss_after."""
    import diffusion
    src = write_jsonl(tmp_path / "chats.jsonl", conversations(60, long_every=7))
    d = tmp_path / "d"
    corpus.prepare(str(d), source=str(src), tokenizer=str(world / "dlm_chat"))
    ids, roles = np.asarray(data.load_split(d, "train")), np.asarray(data.load_roles(d, "train"))
    tok = Tokenizer.from_pretrained(d)
    seen, corrupt = [], diffusion.corrupt
    monkeypatch.setattr(diffusion, "corrupt", lambda x0, *a, where=None, **kw: seen.append((x0, where, kw)) or corrupt(
        x0, *a, where=where, **kw))
    common = ["--init", world / "dlm_chat", "--data", d, "--seq_len", 48, "--batch_size", 4, "--eval_batches", 1,
              "--eval_interval", 2, "--samples", 0, "--device", "cpu", "--lambda_align", 0]
    r = run_script("align.py", *common, "--assistant_only", "--max_iters", 2, "--out_dir", tmp_path / "run")
    assert r.returncode == 0, r.stderr[-2000:]
    n_long = sum(len(tok.encode(r["messages"][1]["content"])) > 20 for r in conversations(60, 7))
    assert "longer than --seq_len 48: left out (not cut)" in r.stdout and n_long > 0
    starts = np.concatenate([[0], np.flatnonzero(ids == tok.eos_id) + 1])
    whole = {tuple(ids[s:e].tolist()): roles[s:e].astype(bool).tolist() for s, e in zip(starts, starts[1:])}
    seen = [(x0, w, kw) for x0, w, kw in seen if w is not None]  # training's draws (evaluation masks every position)
    assert len(seen) == 2
    for x0, where, kw in seen:
        doc, pos = kw["doc"], kw["pos"]
        for b in range(x0.shape[0]):
            for k in range(int(doc[b].max()) + 1):
                slots = (doc[b] == k).nonzero()[:, 0]
                conv = tuple(x0[b, slots].tolist())
                assert conv in whole and where[b, slots].tolist() == whole[conv] and any(whole[conv])
                assert pos[b, slots].tolist() == list(range(len(slots))) and len(slots) <= 48  # it fits whole
            assert not where[b, doc[b] < 0].any()
    seen.clear()  # --end_pad 12: each conversation then end tokens until 12 of its tokens are trained (as room allows)
    r = run_script("align.py", *common, "--assistant_only", "--end_pad", 12, "--max_iters", 1, "--out_dir",
                   tmp_path / "pad")
    assert r.returncode == 0, r.stderr[-2000:]
    padded = 0
    for x0, where, kw in [(x0, w, kw) for x0, w, kw in seen if w is not None]:
        for b in range(x0.shape[0]):
            for k in range(int(kw["doc"][b].max()) + 1):
                slots = (kw["doc"][b] == k).nonzero()[:, 0]
                n = int((x0[b, slots] == tok.eos_id).nonzero()[0]) + 1  # its own eos, then the pads
                conv, trained = tuple(x0[b, slots[:n]].tolist()), int(where[b, slots].sum())
                assert conv in whole and where[b, slots[:n]].tolist() == whole[conv]
                assert (x0[b, slots[n:]] == tok.eos_id).all() and where[b, slots[n:]].all()
                assert trained == max(sum(whole[conv]), min(12, sum(whole[conv]) + 48 - n))
                padded += len(slots) - n
    assert padded > 0
    r = run_script("align.py", *common, "--end_pad", 12, "--max_iters", 1, "--out_dir", tmp_path / "nopack")
    assert r.returncode == 2 and "pass --assistant_only with it" in r.stderr
    r = run_script("align.py", *common, "--assistant_only", "--data", world / "data", "--init", world / "dlm",
                   "--max_iters", 1, "--out_dir", tmp_path / "plain")
    assert r.returncode == 1 and "needs a chat dataset" in r.stderr
    r = run_script("align.py", *common, "--assistant_only", "--loss_after", " =", "--max_iters", 1, "--out_dir",
                   tmp_path / "both")
    assert r.returncode == 1 and "pass one" in r.stderr


def test_distill_prompts_are_the_turns_before_each_answer(world, tmp_path):
    """distill.py --data CHAT: each prompt is the conversation up to an assistant turn (ending with the template's
    generation prompt), its continuation that turn; a short run trains on them."""
    src = write_jsonl(tmp_path / "chats.jsonl", conversations(40))
    d = tmp_path / "d"
    corpus.prepare(str(d), source=str(src), tokenizer=str(world / "block_shift_chat"))
    tok = Tokenizer.from_pretrained(d)
    pool = data.prompt_pool(tok, 4, data_dir=str(d), seq_len=64, n=100)
    val = [r["messages"] for r in conversations(40)]
    assert len(pool) == data.load_split(d, "val").tolist().count(tok.eos_id)
    for prompt, cont in pool:
        user = tok.decode(prompt).split("\n")[1].split("<|im_end|>")[0]
        msgs = next(m for m in val if m[0]["content"] == user)
        assert prompt == tok.apply_chat_template(msgs[:1])  # the turns before, and the generation prompt
        assert cont == (tok.encode(msgs[1]["content"]) + [tok.special_tokens["<|im_end|>"]])[:4]
    r = run_script("distill.py", "--init", world / "block_shift_chat", "--teacher", world / "ar_chat", "--data", d,
                   "--seq_len", 32, "--rollout_min", 4, "--rollout_max", 4, "--curriculum_steps", 0, "--batch_size",
                   2, "--max_iters", 2, "--eval_interval", 2, "--eval_batches", 1, "--num_prompts", 8, "--device",
                   "cpu", "--out_dir", tmp_path / "run")
    assert r.returncode == 0, r.stderr[-2000:]
    assert torch.isfinite(torch.tensor(json.loads((tmp_path / "run" / "results.json").read_text())["val_kl"]))
