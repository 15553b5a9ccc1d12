"""worlds/conversion.py: the split by subject (no held-out country, sum or table entry in a training prompt), the
families' shares, and the teacher's reply cache: a rerun resumes after the last finished batch (a partial last line
dropped) and gives the file a single run gives; another teacher's cache, or one for other prompts, is refused in one
line and left as it was."""
import json
import re

import pytest

from worlds import conversion as C


def test_split_holds_out_whole_countries_and_subjects():
    train, held = C.split(n_train=3000, n_heldout=100)
    fams = {f: [it for it in held if it["family"] == f] for f in ("sum", "capital", "open")}
    assert len(train) == 3000 and all(len(v) == 100 for v in fams.values())
    held_countries = {c for it in fams["capital"] for c in C.countries_in(it["prompt"])}
    assert len(held_countries) >= 15
    assert not any(C.countries_in(it["prompt"]) & held_countries for it in train)  # by name, in any training prompt
    assert {it["subject"] for it in train}.isdisjoint(it["subject"] for it in held)
    sums = {tuple(sorted(map(int, re.findall(r"\d+", it["prompt"])))) for it in train if it["family"] == "sum"}
    assert not any(tuple(sorted(map(int, re.findall(r"\d+", it["prompt"])))) in sums for it in fams["sum"])
    assert len({it["prompt"] for it in train + held}) == 3300  # distinct
    assert [it["family"] for it in train].count("capital") == 300  # the mix: 0.4 / 0.1 / 0.5
    for it in fams["capital"]:
        assert C.CAPITALS[C.countries_in(it["prompt"]).pop()] == it["answer"]
    for it in fams["sum"]:
        a, b = map(int, re.findall(r"\d+", it["prompt"]))
        assert it["answer"] == str(a + b)
    assert C.split(n_train=50, n_heldout=5, seed=3) == C.split(n_train=50, n_heldout=5, seed=3)
    assert C.countries_in("Nigeria and Niger") == {"Nigeria", "Niger"} and C.countries_in("Nigerian") == set()
    with pytest.raises(ValueError, match="fewer distinct prompts"):
        C.split(n_train=100, n_heldout=1000)


def test_validation_is_held_out_by_subject_and_outside_the_test():
    """validation(): n more prompts per family, each with a held-out subject (none in training), none a test prompt,
    and no sum adding a pair the test adds; the same draw every time."""
    train, held = C.split(n_train=3000, n_heldout=100)
    val = C.validation(held, 50)
    assert [it["family"] for it in val] == ["sum"] * 50 + ["capital"] * 50 + ["open"] * 50
    prompts = {it["prompt"] for it in val}
    assert len(prompts) == 150 and prompts.isdisjoint(it["prompt"] for it in held)
    assert {it["subject"] for it in train}.isdisjoint(it["subject"] for it in val)
    test_pairs = {it["subject"] for it in held if it["family"] == "sum"}
    assert not any(it["subject"] in test_pairs for it in val if it["family"] == "sum")
    countries = {c for it in train for c in C.countries_in(it["prompt"])}
    assert not any(C.countries_in(it["prompt"]) & countries for it in val)
    assert C.validation(held, 50) == val
    with pytest.raises(ValueError, match="fewer held-out prompts outside the test"):
        C.validation(held, 200)  # 32 held-out countries in 6 phrasings, 100 of them the test's


def fake_teacher(calls, stop_after=None):
    def reply(batch):
        calls.append([it["prompt"] for it in batch])
        if stop_after is not None and len(calls) > stop_after:
            raise KeyboardInterrupt  # the run is stopped between batches
        return [(f"reply to {it['prompt']}", i % 3 != 0) for i, it in enumerate(batch)]
    return reply


def test_cache_resumes_and_refuses_another_teacher(tmp_path):
    items = C.split(n_train=23, n_heldout=2)[0]
    full, calls = tmp_path / "full.jsonl", []
    rows = C.teacher_replies(None, None, items, full, "teacher-a", batch_size=5, reply=fake_teacher(calls))
    assert len(calls) == 5 and [r["prompt"] for r in rows] == [it["prompt"] for it in items]

    part, calls = tmp_path / "part.jsonl", []
    with pytest.raises(KeyboardInterrupt):
        C.teacher_replies(None, None, items, part, "teacher-a", batch_size=5, reply=fake_teacher(calls, stop_after=2))
    with open(part, "a") as f:
        f.write('{"prompt": "half a li')  # killed while writing a line
    calls = []
    again = C.teacher_replies(None, None, items, part, "teacher-a", batch_size=5, reply=fake_teacher(calls))
    assert calls == [[it["prompt"] for it in items[s:s + 5]] for s in range(10, 23, 5)]  # only what was missing
    assert again == rows and part.read_text() == full.read_text()
    calls = []
    assert C.teacher_replies(None, None, items, part, "teacher-a", batch_size=5, reply=fake_teacher(calls)) == rows
    assert calls == []  # all reused

    before = part.read_text()
    with pytest.raises(SystemExit, match="another teacher"):
        C.teacher_replies(None, None, items, part, "teacher-b", batch_size=5, reply=fake_teacher([]))
    with pytest.raises(SystemExit, match="other prompts"):
        C.teacher_replies(None, None, items[::-1], part, "teacher-a", batch_size=5, reply=fake_teacher([]))
    assert part.read_text() == before

    n = C.write_chats(tmp_path / "chats.jsonl", items, rows)
    chats = [json.loads(line) for line in (tmp_path / "chats.jsonl").read_text().splitlines()]
    assert n == len(chats) == sum(r["ended"] for r in rows)  # the cut replies are left out
    assert chats[0]["messages"][1]["content"] == rows[[r["ended"] for r in rows].index(True)]["reply"]


def test_fingerprint_names_weights_and_settings(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"abc")
    a = C.fingerprint(tmp_path, max_new_tokens=32)
    assert a == C.fingerprint(tmp_path, max_new_tokens=32) != C.fingerprint(tmp_path, max_new_tokens=16)
    (tmp_path / "model.safetensors").write_bytes(b"abd")
    assert C.fingerprint(tmp_path, max_new_tokens=32) != a


def test_bad_input_is_refused_in_one_line(tmp_path):
    from conftest import run_script
    for flags, says in ((["--chats", "0"], "must be positive"), (["--per_family", "-1"], "must be positive")):
        r = run_script("worlds/conversion.py", "--ckpt", tmp_path, "--out_dir", tmp_path / "o", *flags)
        assert r.returncode == 2 and says in r.stderr and not (tmp_path / "o").exists()
    r = run_script("worlds/conversion.py", "--ckpt", tmp_path / "none", "--out_dir", tmp_path / "o")
    assert r.returncode == 1 and "conversion: --ckpt" in r.stderr and not (tmp_path / "o").exists()


def test_chat_prompts_feed_distill_in_the_chat_template(tmp_path):
    """data.prompt_pool (distill.py --prompts): a record with "chat": true is one user turn in the tokenizer's chat
    template (how prompts.jsonl's training prompts reach OPDLM); a plain record is its text."""
    from lib import data
    from lib.tokenizer import Tokenizer
    Tokenizer.byte_level().save_pretrained(tmp_path / "tok")
    cfg = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]"
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps(cfg | {"chat_template": template}))
    tok = Tokenizer.from_pretrained(tmp_path / "tok")
    (tmp_path / "p.jsonl").write_text(json.dumps(dict(prompt="What is 2 + 3?", chat=True)) + "\n" +
                                      json.dumps(dict(prompt="def f")) + "\n")
    pool = data.prompt_pool(tok, 8, prompts=tmp_path / "p.jsonl", seq_len=64, n=10)
    assert pool == [(tok.encode("[user] What is 2 + 3?\n[assistant]"), []), (tok.encode("def f"), [])]
    assert data.prompt_pool(tok, 8, prompts=tmp_path / "p.jsonl", seq_len=5, n=10)[0][0] == tok.encode("tant]")
