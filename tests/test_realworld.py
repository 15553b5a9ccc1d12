"""realworld.py: each family's checker on replies written here (right and wrong ones: the words alone, in order),
the split by prompt hash, and the prompts' files."""
import json

import data
import realworld as R
from conftest import run_script


def item(family, prompt, answer):
    return dict(family=family, prompt=prompt, answer=answer)


def test_checkers_read_replies_as_a_person_would():
    s = item("sum", "What is 12 + 7? Reply with the number only.", "19")
    assert R.check(s, "19") and R.check(s, "The answer is 19.") and R.check(s, "12 + 7 = 19") and R.check(s, "19\n")
    assert not R.check(s, "9") and not R.check(s, "119") and not R.check(s, "nineteen") and not R.check(s, "")
    assert not R.check(s, "19 + 1 = 20")
    cap = item("capital", "What is the capital of France?", "Paris")
    assert R.check(cap, "The capital of France is Paris.") and R.check(cap, "paris")
    assert not R.check(cap, "The capital of France is Lyon.")
    rev = item("reverse", "Write these words in reverse order: apple, river, stone.", "stone river apple")
    assert R.check(rev, "stone, river, apple") and R.check(rev, "Stone River Apple.")
    assert not R.check(rev, "apple, river, stone") and not R.check(rev, "Here: stone, river, apple")
    n = item("letters", 'How many letters are in the word "river"? Reply with the number only.', "5")
    assert R.check(n, "5") and not R.check(n, "6")


def test_items_answer_their_own_prompts():
    rng = R.random.Random(0)
    for _ in range(200):
        f = rng.choice(R.FAMILIES)
        it = R.make(f, rng)
        words = it["prompt"].split(": ")[-1].rstrip(".").split(", ")
        want = {"sum": lambda: str(sum(int(x) for x in it["prompt"][8:].split("?")[0].split(" + "))),
                "letters": lambda: str(len(it["prompt"].split('"')[1])),
                "capital": lambda: R.CAPITALS[next(c for c in R.CAPITALS if f" {c}?" in it["prompt"]
                                                   or f" {c}." in it["prompt"])],
                "copy": lambda: " ".join(words), "reverse": lambda: " ".join(words[::-1]),
                "sort": lambda: " ".join(sorted(words))}[f]()
        assert it["answer"] == want and R.check(it, it["answer"]), it


def test_split_is_by_prompt_hash_and_the_files_are_written(tmp_path):
    train, held = R.build(seed=1, n_train=300, n_heldout=5)
    assert len(train) == 300 and len(held) == 5 * len(R.FAMILIES)
    assert all(data.is_val(it["prompt"], 0.2) for it in held) and not any(data.is_val(it["prompt"], 0.2)
                                                                          for it in train)
    assert len({it["prompt"] for it in train + held}) == len(train) + len(held)
    assert R.build(seed=1, n_train=300, n_heldout=5) == (train, held)
    r = run_script("realworld.py", "--out_dir", tmp_path, "--per_family", 3)
    assert r.returncode == 0 and "held-out prompts" in r.stdout, r.stderr
    rows = [json.loads(line) for line in (tmp_path / "heldout.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * len(R.FAMILIES) and set(rows[0]) == {"family", "prompt", "answer"}
    assert run_script("realworld.py").returncode == 2  # neither --ckpt nor --out_dir
