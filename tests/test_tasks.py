"""worlds/tasks.py: the answers against slow schoolbook re-implementations written here; the checkers accept the right
answer and reject near misses; the held-out split is disjoint by construction and deterministic; the text format
tokenizes the same with and without its answer; exact_match scores an oracle stand-in checkpoint (its logits put
the right next token first) at 1.0 and a wrong one at 0 under all three samplers, summarises each family over its
own rows, counts each row's forwards as the sampler spends them on that row decoded alone, and stops and cuts each
row at either of two declared end ids (eval.py tasks, its command line, is tested in test_eval.py)."""
import collections
import json
import random

import pytest
import torch

import sample
from conftest import run_script
from model import Qwen3Config
from lib import corpus
from lib import data
from lib import runner
from lib.corpus import train_bpe
from lib.tokenizer import EOS, Tokenizer
from worlds import tasks

SIZES = dict(min_len=2, max_len=6, max_digits=3)


# ---- slow references -------------------------------------------------------------------------------

def schoolbook_add(a, b):
    """Digit lists, most significant first -> their sum's digits: column by column from the right, with a carry."""
    a, b, out, carry = a[::-1], b[::-1], [], 0
    for i in range(max(len(a), len(b))):
        s = (a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) + carry
        out.append(s % 10)
        carry = s // 10
    if carry:
        out.append(carry)
    while len(out) > 1 and out[-1] == 0:
        out.pop()
    return out[::-1]


def slow_answer(prompt):
    """The answer digits of a prompt, read word by word: counting sort, an index loop, schoolbook addition."""
    words = prompt.split()
    family, body = words[0], [w for w in words[1:-1]]
    if family == "sort":
        counts = [0] * 10
        for w in body:
            counts[int(w)] += 1
        return [d for d in range(10) for _ in range(counts[d])]
    if family == "rev":
        return [int(body[len(body) - 1 - i]) for i in range(len(body))]
    plus = body.index("+")
    return schoolbook_add([int(w) for w in body[:plus]], [int(w) for w in body[plus + 1:]])


def prompts(n, seed=0, **sizes):
    rng = random.Random(seed)
    return [(f, tasks.make_prompt(f, rng, **(sizes or SIZES))) for f in tasks.FAMILIES for _ in range(n)]


# ---- the tasks -------------------------------------------------------------------------------------

def test_solve_matches_slow_reference():
    for family, p in prompts(300) + prompts(50, seed=1, min_len=1, max_len=12, max_digits=6):
        assert tasks.solve(family, p).split() == [str(d) for d in slow_answer(p)], p
    rng = random.Random(2)
    carries = [tasks.make_prompt("add", rng, max_digits=4) for _ in range(500)]
    assert any(len(tasks.solve("add", p).split()) > 4 for p in carries)  # carries out of the top digit happen
    assert tasks.make_prompt("sort", rng, min_len=3, max_len=3).count(" ") == 4  # "sort d d d ="


def test_make_prompt_sizes():
    sizes = {f: set() for f in tasks.FAMILIES}
    for family, p in prompts(400):
        body = p.split()[1:-1]
        if family == "add":
            a, b = " ".join(body).split(" + ")
            sizes[family] |= {len(a.split()), len(b.split())}
            assert all(n == "0" or not n.startswith("0") for n in (a, b))
        else:
            sizes[family].add(len(body))
    assert sizes == dict(sort={2, 3, 4, 5, 6}, rev={2, 3, 4, 5, 6}, add={1, 2, 3})  # SIZES, every one drawn


def near_misses(answer):
    """Wrong completions one edit from the answer digits: one digit off, two swapped, truncated, one extra."""
    ds = answer.split()
    wrong = [" ".join(ds[:i] + [str((int(ds[i]) + 1) % 10)] + ds[i + 1:]) for i in range(len(ds))]
    wrong += [" ".join(ds[:i] + [ds[i + 1], ds[i]] + ds[i + 2:]) for i in range(len(ds) - 1) if ds[i] != ds[i + 1]]
    wrong += [" ".join(ds[:-1]), " ".join(ds + ["0"]), " ".join(ds + ds), "", "".join(ds) + " 0"]
    return wrong


def test_check_accepts_answer_rejects_near_misses():
    n_wrong = 0
    for family, p in prompts(60):
        ans = tasks.solve(family, p)
        for right in (ans, ans.strip(), " " + "  ".join(ans.split()) + "\n", ans + EOS + " 7 7", ans + EOS):
            assert tasks.check(family, p, right), (p, right)
        for wrong in near_misses(ans):
            assert not tasks.check(family, p, wrong), (p, wrong)
            n_wrong += 1
        assert not tasks.check(family, p, "".join(ans.split())) or len(ans.split()) == 1  # "123" is not "1 2 3"
        assert not tasks.check(family, p, EOS + ans)  # nothing before eos
    assert n_wrong > 1000
    assert not tasks.check("sort", "sort 3 1 2 =", " 3 2 1") and tasks.check("rev", "rev 3 1 2 =", " 2 1 3")


def test_preferred_is_the_answer_with_a_full_stop():
    assert tasks.preferred("sort", "sort 3 1 2 =", " 1 2 3.")
    assert tasks.preferred("sort", "sort 3 1 2 =", "1 2 3." + EOS)
    assert tasks.preferred("add", "add 9 + 3 =", " 1 2.") and not tasks.check("add", "add 9 + 3 =", " 1 2.")
    for near in (" 1 2 3", " 1 2 3 .", " 1 2 3..", " 1 3 2.", " 1 2.", ".", " 1 2 3.4"):
        assert not tasks.preferred("sort", "sort 3 1 2 =", near), near


@pytest.mark.parametrize("family, prompt", [
    ("sort", "sort 3 1 2"), ("sort", "sort 12 3 ="), ("sort", "sort ="), ("sort", "rev 3 1 ="), ("sort", "sort 3  1 ="),
    ("rev", "rev 3 x ="), ("add", "add 0 1 + 2 ="), ("add", "add 1 + ="), ("add", "add + 2 ="), ("add", "add 1 2 ="),
    ("add", "add 1 + 2 + 3 ="), ("mul", "mul 2 + 3 =")])
def test_solve_rejects_malformed_prompts(family, prompt):
    with pytest.raises(ValueError):
        tasks.solve(family, prompt)


def test_split_is_disjoint_and_deterministic():
    train, items = tasks.build(seed=3, n_train=3000, n_heldout=40, heldout_fraction=0.1, **SIZES)
    assert (train, items) == tasks.build(seed=3, n_train=3000, n_heldout=40, heldout_fraction=0.1, **SIZES)
    assert train != tasks.build(seed=4, n_train=3000, n_heldout=40, heldout_fraction=0.1, **SIZES)[0]
    # the train stream does not depend on the held-out size, nor the held-out prompts on the training size
    assert train[:1000] == tasks.build(seed=3, n_train=1000, n_heldout=5, heldout_fraction=0.1, **SIZES)[0]
    assert items[:40] == tasks.build(seed=3, n_train=10, n_heldout=40, heldout_fraction=0.1, **SIZES)[1][:40]
    train_prompts = {t[:t.index("=") + 1] for t in train}
    held = [it["prompt"] for it in items]
    assert len(held) == len(set(held)) == 3 * 40 and not train_prompts & set(held)
    assert all(data.is_val(p, 0.1) for p in held) and not any(data.is_val(p, 0.1) for p in train_prompts)
    for it in items:
        assert it["answer"] == tasks.solve(it["family"], it["prompt"]) and it["prompt"].startswith(it["family"])
    for t in train:
        family, prompt = t.split()[0], t[:t.index("=") + 1]
        assert t == prompt + tasks.solve(family, prompt)
    assert {t.split()[0] for t in train} == set(tasks.FAMILIES)
    # a prompt space smaller than asked for gives what it has: 100 two-digit lists, about a tenth held out
    _, few = tasks.build(seed=3, n_train=0, n_heldout=50, families=("sort",), min_len=2, max_len=2)
    assert 0 < len(few) < 25 and all(data.is_val(it["prompt"], 0.05) for it in few)
    # the validation split: the test's mix of lengths, from the training side less the excluded prompts
    exclude = sorted(train_prompts)[::3]
    val = tasks.validation_items(items, 30, train, exclude, seed=3)
    vp = [it["prompt"] for it in val]
    assert len(vp) == len(set(vp)) == 3 * 30 and not set(vp) & set(held) and not set(vp) & set(exclude)
    assert set(vp) <= train_prompts and all(it["answer"] == tasks.solve(it["family"], p) for p, it in zip(vp, val))
    assert [it["family"] for it in val] == [f for f in tasks.FAMILIES for _ in range(30)]
    for f in tasks.FAMILIES:  # each length's share within one prompt of the test's
        test_n = collections.Counter(len(it["prompt"].split()) for it in items if it["family"] == f)
        val_n = collections.Counter(len(it["prompt"].split()) for it in val if it["family"] == f)
        assert set(val_n) <= set(test_n) and all(abs(val_n[n] - 30 * c / 40) < 1 for n, c in test_n.items())
    assert tasks.largest_remainder({2: 1, 3: 1, 4: 1}, 10) == {2: 4, 3: 3, 4: 3}  # 3.33 each: one more to the first
    with pytest.raises(ValueError, match="training side has"):
        tasks.validation_items(items, 30, train, sorted(train_prompts), seed=3)


def test_tokenization_splits_at_the_answer():
    """Each document tokenizes as its prompt's tokens then its answer's, so a model trained on documents is
    asked exactly the prompt; the learnt BPE gives every digit (with its space) one token."""
    train, items = tasks.build(seed=0, n_train=2000, n_heldout=20, **SIZES)
    bpe = train_bpe(train, 1024)
    for tok in (Tokenizer.byte_level(), bpe):
        for it in items:
            assert tok.encode(it["prompt"] + it["answer"]) == tok.encode(it["prompt"]) + tok.encode(it["answer"])
    for it in items:
        assert [bpe.decode([i]) for i in bpe.encode(it["answer"])] == [f" {d}" for d in it["answer"].split()]
    assert bpe.vocab_size < 300  # a small world: the bytes, a few merges, the special tokens


def test_separator_marks_exactly_the_answers():
    """pretrain.py --loss_after: the separator (" =" in the learnt BPE, "=" in the byte tokenizer: one token each)
    marks, in packed documents, exactly each answer's tokens and its eos (data.after_separator)."""
    train, _ = tasks.build(seed=0, n_train=300, n_heldout=1, **SIZES)
    for tok, sep in ((train_bpe(train, 1024), " ="), (Tokenizer.byte_level(), "=")):
        assert len(tok.encode(sep)) == 1
        ids, want = [], []
        for t in train[:60]:
            prompt, answer = tok.encode(t[:t.index("=") + 1]), tok.encode(t[t.index("=") + 1:])
            ids += prompt + answer + [tok.eos_id]
            want += [False] * len(prompt) + [True] * (len(answer) + 1)
        assert data.after_separator(torch.tensor([ids]), tok.encode(sep)[0], tok.eos_id)[0].tolist() == want


def test_cli_writes_files_data_py_reads(tmp_path):
    small = ("--n_train", 400, "--n_heldout", 7, "--max_len", 5, "--n_prompts", 100, "--n_validation", 10)
    r = run_script("worlds/tasks.py", "--out_dir", tmp_path, *small)
    assert r.returncode == 0, r.stderr
    docs = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert len(docs) == 400 and all(set(d) == {"text"} for d in docs)
    items = data.read_prompts(tmp_path / "heldout.jsonl")
    assert len(items) == 21 and all(set(it) == {"prompt", "answer", "family"} for it in items)
    val = data.read_prompts(tmp_path / "validation.jsonl")
    assert len(val) == 3 * 10 and not {it["prompt"] for it in val} & {it["prompt"] for it in items}
    meta = corpus.prepare(str(tmp_path), source=str(tmp_path / "train.jsonl"), tokenizer="byte")
    assert sum(s["documents"] for s in meta["splits"].values()) == 400
    pool = data.read_prompts(tmp_path / "prompts.jsonl")  # distill.py's --prompts: whole training prompts
    texts = {d["text"] for d in docs}
    assert pool and all(any(t.startswith(r["prompt"]) for t in texts) and r["prompt"].endswith(" =") for r in pool)
    assert not {it["prompt"] for it in val} & {r["prompt"] for r in pool}  # no arm trains on a validation prompt
    tok = Tokenizer.byte_level()
    for name, split in (("pairs_train.jsonl", texts), ("pairs_heldout.jsonl", None)):
        pairs = data.read_pairs(tmp_path / name)
        assert pairs
        for r in pairs:  # rejected: the taught answer, then eos; chosen: the same with a full stop; eos one token
            family = r["prompt"].split()[0]
            w, l = (tok.encode(r[k], allowed_special={EOS}) for k in ("chosen", "rejected"))
            assert w[-1] == l[-1] == tok.eos_id and w.count(tok.eos_id) == l.count(tok.eos_id) == 1
            assert tasks.check(family, r["prompt"], r["rejected"]) and not tasks.check(family, r["prompt"], r["chosen"])
            assert tasks.preferred(family, r["prompt"], r["chosen"]) and not tasks.preferred(family, r["prompt"],
                                                                                             r["rejected"])
            assert split is None or r["prompt"] + r["rejected"].removesuffix(EOS) in split
    held = {it["prompt"] for it in items}
    assert {r["prompt"] for r in data.read_pairs(tmp_path / "pairs_heldout.jsonl")} == held
    assert not held & {r["prompt"] for r in data.read_pairs(tmp_path / "pairs_train.jsonl")}
    assert [it["family"] for it in tasks.load_items(tmp_path / "heldout.jsonl", 2)] == [
        f for f in tasks.FAMILIES for _ in range(2)]
    again = tmp_path / "again"
    assert run_script("worlds/tasks.py", "--out_dir", again, *small).returncode == 0
    assert (again / "train.jsonl").read_text() == (tmp_path / "train.jsonl").read_text()
    assert run_script("worlds/tasks.py", "--out_dir", again, "--families", "sort,mul").returncode == 2


# ---- exact_match -----------------------------------------------------------------------------------

SHIFT = {"causal": None, "bidirectional": True, "block": False}


class Oracle(torch.nn.Module):
    """A stand-in checkpoint. At every fed position its logits put first the token that position has to
    predict in prompt + answers[prompt] + end (default eos; the next token for AR and a shifted DLM, this one for
    an unshifted DLM), read off the RoPE position; that logit is sharp(index), every other 0, so confidence (and
    with it the rounds of parallel decoding) can vary by position. The KV cache is a (B, L) buffer of the tokens by
    slot. The left padding it skips: eos, end or 0 (the samplers pad with the first end id, 0 without one)."""

    def __init__(self, tok, answers, attn, block_size=None, sharp=lambda j: 12.0, end=None):
        super().__init__()
        self.config = Qwen3Config(vocab_size=tasks.round_up(tok.mask_id + 1, 64), attn=attn, block_size=block_size,
                                  mask_token_id=None if attn == "causal" else tok.mask_id, shift=SHIFT[attn],
                                  bos_token_id=tok.eos_id, eos_token_id=tok.eos_id)
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(1, 1)  # the samplers read the device from it
        end = tok.eos_id if end is None else end
        self.targets = {tuple(tok.encode(p)): tok.encode(a) + [end] for p, a in answers.items()}
        self.pads, self.sharp = {tok.eos_id, end, 0}, sharp

    def new_cache(self, batch_size, max_len):
        return torch.full((batch_size, max_len), -1)

    def forward(self, idx, attn=None, pos=None, cache=None, slots=None, rows=None):
        seq = idx
        if cache is not None:
            cache[:, slots] = idx
            seq = cache
        B, T = idx.shape
        logits = torch.zeros(B, T, self.config.vocab_size)
        ahead = int(self.config.shift is not False)
        for b in range(B):
            row = seq[b].tolist()
            while row[0] in self.pads:  # the left padding
                row.pop(0)
            prompt = next(p for p in self.targets if tuple(row[:len(p)]) == p)
            target = [*prompt, *self.targets[prompt]]
            for k in range(T):
                j = int(pos[b, k]) + ahead
                logits[b, k, target[min(j, len(target) - 1)]] = self.sharp(j)
        return logits if rows is None else logits[rows]  # rows: the head on some slots only -> (n, V)


@pytest.fixture(scope="module")
def world():
    """A learnt BPE and held-out items whose answers differ in length (rows finish in different blocks)."""
    train, items = tasks.build(seed=0, n_train=2000, n_heldout=5, **SIZES)
    return train_bpe(train, 1024), items


def wrong(answer):
    return "".join(f" {(int(d) + 1) % 10}" for d in answer.split())


KINDS = [("causal", {}), ("bidirectional", {}), ("bidirectional", dict(threshold=0.9, block_length=4)),
         ("block", dict(block_size=4)), ("block", dict(block_size=3, threshold=0.5))]


@pytest.mark.parametrize("attn, kw", KINDS)
def test_exact_match_oracle_right_and_wrong(world, attn, kw):
    tok, items = world
    kw = dict(kw)
    bs = kw.pop("block_size", None)
    right = Oracle(tok, {it["prompt"]: it["answer"] for it in items}, attn, bs)
    res = tasks.exact_match(right, tok, items, batch_size=4, **kw)
    assert res["accuracy"] == 1.0 and set(res["families"]) == set(tasks.FAMILIES)
    assert all(f["accuracy"] == 1.0 and f["n"] == 5 for f in res["families"].values())
    assert [r["prompt"] for r in res["rows"]] == [it["prompt"] for it in items]
    assert all(r["completion"] == it["answer"] for r, it in zip(res["rows"], items))
    assert all(r["tokens"] == len(tok.encode(it["answer"])) + 1 for r, it in zip(res["rows"], items))
    bad = Oracle(tok, {it["prompt"]: wrong(it["answer"]) for it in items}, attn, bs)
    res_bad = tasks.exact_match(bad, tok, items, batch_size=4, **kw)
    assert res_bad["accuracy"] == 0.0 and all(not r["correct"] for r in res_bad["rows"])
    for f, fam in res["families"].items():  # each family's summary is over its own rows
        ratios = [r["tokens"] / r["forwards"] for r in res["rows"] if r["family"] == f]
        assert fam["tokens_per_forward"] == pytest.approx(sum(ratios) / len(ratios))
        extremes = [fam["tokens_per_forward_min"], fam["tokens_per_forward_max"]]
        assert extremes == pytest.approx([min(ratios), max(ratios)])
    assert res["n"] == 15 and res["tokens_per_forward"] == pytest.approx(
        sum(r["tokens"] / r["forwards"] for r in res["rows"]) / 15)
    tpf = [f["tokens_per_forward"] for f in res["families"].values()]
    if attn == "causal":
        assert tpf == [1.0, 1.0, 1.0]
    elif attn == "block" or kw.get("threshold"):  # a confident oracle commits a whole block per forward
        assert min(tpf) > 1.5
    else:  # LLaDA, one token a step
        assert all(r["forwards"] >= r["tokens"] for r in res["rows"])


@pytest.mark.parametrize("attn, kw", [("bidirectional", dict(block_length=4)), *KINDS[2:]])
def test_forwards_per_row_equal_the_row_decoded_alone(world, attn, kw):
    """Rows of one batch finish in different blocks and take different numbers of rounds (the oracle is unsure
    at one position in three): each row's count must be the sampler's nfe on that row's prompt alone. The
    families are interleaved: each is decoded in batches of its own, and the rows come back in the items' order."""
    tok, items = world
    by_family = [[it for it in items if it["family"] == f] for f in tasks.FAMILIES]
    items = [it for trio in zip(*by_family) for it in trio]  # sort, rev, add, sort, rev, add, ...
    kw = dict(kw)
    bs = kw.pop("block_size", None)
    unsure = Oracle(tok, {it["prompt"]: it["answer"] for it in items}, attn, bs, sharp=lambda j: 12 if j % 3 else 1.5)
    res = tasks.exact_match(unsure, tok, items, batch_size=8, max_new_tokens=12, **kw)
    assert res["accuracy"] == 1.0
    common = dict(eos_id=tok.eos_id, vocab_limit=tok.vocab_size)
    alone = []
    for it in items:
        p = [tok.encode(it["prompt"])]
        if attn == "block":
            alone.append(sample.block_generate(unsure, p, 12, bs, kw.get("threshold", 0.9), **common).nfe)
        else:
            bl = kw.get("block_length", 12)
            alone.append(sample.diffusion_generate(unsure, p, 12, bl, 12, threshold=kw.get("threshold"), **common).nfe)
    assert [r["prompt"] for r in res["rows"]] == [it["prompt"] for it in items]
    assert [r["forwards"] for r in res["rows"]] == alone
    assert len(set(alone)) > 1  # the check has teeth: the rows differ


@pytest.mark.parametrize("attn, kw", [KINDS[0], KINDS[2], KINDS[3]])
def test_exact_match_stops_and_cuts_at_every_end_id(world, attn, kw):
    """A checkpoint declaring two end ids (generation_config.json's eos_token_id, as Qwen3's instruct models do)
    whose answers end with the one that is not the tokenizer's eos: each row stops there (its tokens count it, not
    what would follow) and its completion is cut there, in either order of the declared ids. Stopping only at eos,
    the completions would carry the other id's text and every row would count all its slots."""
    tok, items = world
    kw = dict(kw)
    bs = kw.pop("block_size", None)
    (other,) = tok.encode("#")  # a token no answer holds
    for declared in ([other, tok.eos_id], [tok.eos_id, other]):
        model = Oracle(tok, {it["prompt"]: it["answer"] for it in items}, attn, bs, end=other)
        model.config.generation = {"eos_token_id": declared}
        assert tok.end_ids(model.config) == declared
        res = tasks.exact_match(model, tok, items, batch_size=4, max_new_tokens=16, **kw)
        assert res["accuracy"] == 1.0 and all(r["completion"] == it["answer"] for r, it in zip(res["rows"], items))
        assert all(r["tokens"] == len(tok.encode(it["answer"])) + 1 for r, it in zip(res["rows"], items))


def test_task_record_summarises_exact_match(world):
    """The flat record the training scripts log (runner.task_record of eval.py tasks' result): the same numbers as
    exact_match, and the full stop's share."""
    tok, items = world
    marked = {it["prompt"]: it["answer"] + (tasks.MARK if it["family"] == "sort" else "") for it in items}
    model = Oracle(tok, marked, "block", 4)
    res = tasks.exact_match(model, tok, items, batch_size=4, threshold=0.9)
    rec = runner.task_record(res)
    assert rec["task_acc"] == res["accuracy"] and rec["task_tpf"] == pytest.approx(res["tokens_per_forward"])
    assert rec["task_acc_rev"] == rec["task_acc_add"] == 1.0 and rec["task_acc_sort"] == 0.0
    assert rec["task_pref"] == pytest.approx(1 / 3) and res["families"]["sort"]["preferred"] == 1.0
    assert res["right"] == 1.0 and res["families"]["sort"]["right"] == 1.0


def test_mark_share_ends_that_share_of_training_answers_with_the_full_stop():
    """--mark_share s: about s of the training answers end with the full stop (each still the right answer, as
    `preferred` reads it); 0 draws nothing, so the default data is unchanged; held-out items never carry it."""
    plain, items = tasks.build(n_train=4000, n_heldout=20)
    marked, items2 = tasks.build(n_train=4000, n_heldout=20, mark_share=0.25)
    assert tasks.build(n_train=4000, n_heldout=20, mark_share=0.0) == (plain, items) and items2 == items
    ends = [d.endswith(tasks.MARK) for d in marked]
    assert 0.22 < sum(ends) / len(ends) < 0.28 and not any(d.endswith(tasks.MARK) for d in plain)
    for d, end in zip(marked, ends):
        prompt, answer = d[:d.index(" =") + 2], d[d.index(" =") + 2:]
        family = prompt.split(" ")[0]
        assert (tasks.preferred(family, prompt, answer) if end else tasks.check(family, prompt, answer))
