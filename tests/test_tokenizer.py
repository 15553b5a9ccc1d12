"""lib/tokenizer.py against an independent reference: Hugging Face's tokenizer.

The reference Qwen tokenizer is built offline from Qwen's real BPE ranks (shipped inside the
`dashscope` package) with transformers' TikTokenConverter, given Qwen's regex, NFC and Qwen3's
added tokens as published (ids 151643-151656 `special: true`, 151657-151668 `special: false`), and
saved as a tokenizer.json with Qwen3's tokenizer_config.json settings (tests/qwen_shape.py, which also builds
test_scale.py's checkpoint). Everything here is written out independently of lib/tokenizer.py. Chat templates are
checked against transformers' own rendering (AutoTokenizer.apply_chat_template).
"""
import json
import random
import sysconfig
import unicodedata
from pathlib import Path

import pytest
import torch

from qwen_shape import QWEN3_ADDED, QWEN_TIKTOKEN, write_tokenizer
from lib import corpus
from lib.corpus import train_bpe
from lib.tokenizer import Tokenizer

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SOURCES = ["json/decoder.py", "textwrap.py", "difflib.py", "email/_header_value_parser.py", "tokenize.py"]
OPTIONAL_SOURCES = ["test/test_unicode.py", "pydoc_data/topics.py"]  # these hold non-ASCII text

SAMPLES = [
    "你好，世界！这是一个测试。机器学习与扩散语言模型",
    "emoji 🙂👍🏽 family 👨‍👩‍👧 flag 🇯🇵 keycap 1️⃣",
    "café naïve résumé Ångström",                        # precomposed
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301 A\u030angstro\u0308m",  # decomposed: NFC changes it
    "\u212b angstrom sign, \u2126 ohm sign, \ufb01 ligature",
    "12345 3.14159 1,000,000 ٣٤٥ ①② ½ 2² fullwidth １０ ２０",  # "１０" is a token, yet split
    "don't I'LL we'Re they'VE she'S it'd",
    "tabs\tand\nnewlines\r\n  trailing spaces   \n\n\n   x\t\t\n",
    "nbsp\u00a0x ideographic\u3000x vt\x0bff\x0c line\u2028sep nel\x85 zwsp\u200bx",
    "Ελληνικά, русский, العربية, हिन्दी, 한국어, ไทย, עִבְרִית",
    "mixed <think>thought</think> <tool_call>{\"a\": 1}</tool_call> <|fim_prefix|>x",
    "\x00 control \x1b[31mred\x1b[0m \x7f",
    "", " ", "\n", "    ", "a",
]


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    """Qwen3's tokenizer.json, made offline from Qwen's ranks, and its tokenizer_config.json (qwen_shape.py)."""
    d = tmp_path_factory.mktemp("qwen3")
    write_tokenizer(d)
    return d


@pytest.fixture(scope="module")
def hf(qwen_dir):
    from tokenizers import Tokenizer as HFTokenizer
    return HFTokenizer.from_file(str(qwen_dir / "tokenizer.json"))


def hf_ids(hf, texts, split_special=False):
    hf.encode_special_tokens = split_special
    try:
        return [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    finally:
        hf.encode_special_tokens = False


@pytest.fixture(scope="module", params=["tokenizer.json", "qwen.tiktoken"])
def qwen(request, qwen_dir):
    return Tokenizer.from_pretrained(qwen_dir if request.param == "tokenizer.json" else QWEN_TIKTOKEN)


@pytest.fixture(scope="module")
def sources():
    texts = [(STDLIB / f).read_text(encoding="utf-8")[:20000] for f in SOURCES]
    texts += [(STDLIB / f).read_text(encoding="utf-8")[:20000] for f in OPTIONAL_SOURCES if (STDLIB / f).exists()]
    return texts


def random_texts(n=200, seed=0):
    """Strings drawn from ASCII, Latin/Greek/CJK/emoji and any non-surrogate code point."""
    rng = random.Random(seed)
    pools = [(32, 127), (0, 32), (0xA0, 0x3FF), (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF), (0, 0x10FFFF)]
    texts = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randint(1, 80)):
            lo, hi = rng.choice(pools)
            c = rng.randint(lo, hi)
            chars.append(chr(c) if not 0xD800 <= c < 0xE000 else "x")
        texts.append("".join(chars))
    return texts


# ---- the reference itself ----

def test_reference_has_qwen3_added_tokens(hf):
    assert hf.get_vocab_size() == 151669
    for i, (text, special) in QWEN3_ADDED.items():
        assert hf.token_to_id(text) == i
    assert hf.encode("hello world", add_special_tokens=False).ids == [14990, 1879]


# ---- same ids as Hugging Face ----

def test_matches_hf_on_python_source(qwen, hf, sources):
    ours = qwen.encode_batch(sources)
    assert ours == hf_ids(hf, sources)
    assert qwen.encode(sources[0]) == ours[0]
    assert sum(map(len, ours)) > 20000  # the files really were read


def test_matches_hf_on_unicode_samples(qwen, hf):
    texts = SAMPLES + ["\n".join(SAMPLES)]
    for text, expected in zip(texts, hf_ids(hf, texts)):
        assert qwen.encode(text) == expected, text
    # the single-digit rule: each digit is its own piece, so even the vocabulary's only
    # multi-digit tokens ("１０" = 77150, "２０" = 80091) are never produced
    assert len(qwen.encode("12345")) == 5
    assert not {77150, 80091} & set(qwen.encode("１０ ２０ x２０"))


def test_matches_hf_on_random_text(qwen, hf):
    texts = random_texts()
    assert qwen.encode_batch(texts) == hf_ids(hf, texts)


def test_nfc_is_applied(qwen):
    decomposed, composed = "cafe\u0301", "caf\u00e9"
    assert decomposed != composed
    assert qwen.encode(decomposed) == qwen.encode(composed)
    assert qwen.decode(qwen.encode(decomposed)) == composed


# ---- round trips ----

def test_qwen_roundtrip_is_nfc(qwen, sources):
    for text in SAMPLES + sources + random_texts(50, seed=1):
        assert qwen.decode(qwen.encode(text)) == unicodedata.normalize("NFC", text)


def test_byte_level_roundtrip_is_exact():
    tok = Tokenizer.byte_level()
    for text in SAMPLES + random_texts(100, seed=2) + ["cafe\u0301 <|endoftext|> <think>"]:
        ids = tok.encode(text)
        assert ids == list(text.encode("utf-8"))  # the ids are the UTF-8 bytes, nothing merged
        assert tok.decode(ids) == text  # no normalisation: decomposed text stays decomposed


# ---- special tokens ----

def test_special_tokens_only_when_allowed(qwen, hf):
    text = "a<|endoftext|>b<|im_start|>user\nhi<|im_end|>"
    plain = qwen.encode(text)
    assert not {151643, 151644, 151645} & set(plain)
    assert plain == hf_ids(hf, [text], split_special=True)[0]  # HF with specials split as text
    assert qwen.decode(plain) == text
    allowed = qwen.encode(text, allowed_special={"<|endoftext|>", "<|im_start|>", "<|im_end|>"})
    assert allowed == hf_ids(hf, [text])[0]
    assert {151643, 151644, 151645} <= set(allowed)
    assert qwen.encode(text, allowed_special={"<|endoftext|>"}).count(151643) == 1
    assert 151644 not in qwen.encode(text, allowed_special={"<|endoftext|>"})
    assert qwen.encode(text, allowed_special="all") == allowed
    with pytest.raises(ValueError, match="unknown special"):
        qwen.encode(text, allowed_special={"<|nope|>"})


def test_non_special_added_tokens_match_like_hf(qwen, hf):
    text = "<think>\nplan</think><tool_call>x</tool_call><|fim_prefix|>a<|fim_suffix|>"
    ids = qwen.encode(text)
    assert ids[0] == 151667 and {151668, 151657, 151658, 151659, 151661} <= set(ids)
    assert ids == hf_ids(hf, [text])[0] == hf_ids(hf, [text], split_special=True)[0]


def test_qwen_facts(qwen):
    assert (qwen.eos_id, qwen.mask_id, qwen.vocab_size) == (151643, 151669, 151669)
    assert qwen.special_tokens == {text: i for i, (text, _) in QWEN3_ADDED.items()}
    assert qwen.name in ("qwen3", "qwen.tiktoken") or qwen.name.startswith("qwen3")
    assert qwen.decode([151667]) == "<think>"


def test_byte_level_facts():
    tok = Tokenizer.byte_level()
    assert (tok.eos_id, tok.mask_id, tok.vocab_size, tok.name) == (256, 259, 259, "byte")
    assert tok.special_tokens == {"<|endoftext|>": 256, "<|im_start|>": 257, "<|im_end|>": 258}
    assert tok.encode("a<|endoftext|>", allowed_special={"<|endoftext|>"}) == [97, 256]
    assert tok.encode_batch(["ab", "é"]) == [[97, 98], [0xC3, 0xA9]]


def test_decode_mask_tensors_and_bad_ids(qwen):
    ids = qwen.encode("hello world")
    assert qwen.decode(ids + [qwen.mask_id] + ids) == "hello world<|mask|>hello world"
    assert qwen.decode(torch.tensor(ids + [qwen.mask_id])) == "hello world<|mask|>"
    tok = Tokenizer.byte_level()
    assert tok.decode(torch.tensor([104, 259, 105])) == "h<|mask|>i"
    assert tok.decode([0xC3]) == "\ufffd"  # a lone UTF-8 lead byte is replaced, not raised on
    for bad in ([qwen.mask_id + 1], [-1], [10**9]):
        with pytest.raises(ValueError, match="not in the vocabulary"):
            qwen.decode(bad)
    with pytest.raises(ValueError):
        tok.decode([260])
    with pytest.raises(ValueError, match="1-D"):
        tok.decode(torch.tensor([[1, 2], [3, 4]]))


# ---- saving ----

def test_byte_level_save_and_load(tmp_path):
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.byte_level()
    tok.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    back = Tokenizer.from_pretrained(tmp_path)
    assert Tokenizer.from_pretrained(tmp_path / "tokenizer.json").encode("x y") == [120, 32, 121]
    assert (back.vocab_size, back.eos_id, back.mask_id, back.special_tokens) == \
        (tok.vocab_size, tok.eos_id, tok.mask_id, tok.special_tokens)
    texts = SAMPLES + random_texts(50, seed=3) + ["x<|endoftext|>y<|im_start|>z<|im_end|>"]
    assert back.encode_batch(texts) == tok.encode_batch(texts)

    hf = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    for text in texts:
        ids = tok.encode(text, allowed_special="all")  # HF matches special tokens by default
        assert hf.encode(text, add_special_tokens=False) == ids, text
        assert hf.decode(ids) == text
    assert 256 in hf.encode("<|endoftext|>", add_special_tokens=False)
    assert PreTrainedTokenizerFast.from_pretrained(tmp_path).eos_token_id == 256


def test_qwen_save_copies_the_source(qwen, qwen_dir, tmp_path):
    qwen.save_pretrained(tmp_path)
    back = Tokenizer.from_pretrained(tmp_path)
    text = SAMPLES[0] + SAMPLES[10]
    assert back.encode(text) == qwen.encode(text)
    assert back.special_tokens == qwen.special_tokens
    if (tmp_path / "tokenizer.json").exists():  # read from the directory: its tokenizer_config.json comes along
        for f in ("tokenizer.json", "tokenizer_config.json"):
            assert (tmp_path / f).read_bytes() == (qwen_dir / f).read_bytes()
    else:  # a bare .tiktoken file: a minimal tokenizer_config.json
        assert (tmp_path / "qwen.tiktoken").read_bytes() == QWEN_TIKTOKEN.read_bytes()
        assert json.loads((tmp_path / "tokenizer_config.json").read_text())["eos_token"] == "<|endoftext|>"
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


# ---- chat templates and end ids ----

# A harder template than Qwen3's common case: a namespace, loop controls, tojson, string methods, raise_exception,
# the special-token variables, and whitespace control both by trim/lstrip_blocks and by '-'.
RICH_TEMPLATE = """{% set ns = namespace(n=0) %}
{% if messages[0].role != 'system' %}{{ raise_exception('the first message must be the system one') }}{% endif %}
{%- for m in messages %}
    {% if m.role == 'skip' %}{% continue %}{% endif %}
    {% set ns.n = ns.n + 1 %}
<|im_start|>{{ m.role }}
{{ m.content | trim }}{% if m.meta is defined %} {{ m.meta | tojson }}{% endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant [{{ ns.n }} turns, ends with {{ eos_token }}]
{% endif %}"""
CHATS = [
    [{"role": "user", "content": "Write fib(n) in Python."}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "Und 3+3? 你好 <think>"}],
]


def hf_tokenizer(d):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(d))


@pytest.mark.parametrize("thinking", [None, False])
def test_chat_template_as_transformers_renders_it(qwen_dir, thinking):
    ours, ref = Tokenizer.from_pretrained(qwen_dir), hf_tokenizer(qwen_dir)
    kw = {} if thinking is None else dict(enable_thinking=thinking)
    for chat in CHATS:
        for gen in (True, False):
            text = ref.apply_chat_template(chat, add_generation_prompt=gen, tokenize=False, **kw)
            assert ours.apply_chat_template(chat, add_generation_prompt=gen, tokenize=False, **kw) == text
            ids = ref.apply_chat_template(chat, add_generation_prompt=gen, tokenize=True, **kw)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            assert ours.apply_chat_template(chat, add_generation_prompt=gen, **kw) == list(ids)
    last = ours.apply_chat_template(CHATS[0], tokenize=False, **kw)
    assert last.endswith("<think>\n\n</think>\n\n") == (thinking is False) and ids[:1] == [151644]  # <|im_start|>


def test_chat_template_file_and_errors(qwen_dir, tmp_path):
    d = tmp_path / "rich"
    d.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).write_bytes((qwen_dir / f).read_bytes())
    (d / "chat_template.jinja").write_text(RICH_TEMPLATE)  # the file wins over tokenizer_config.json's
    ours, ref = Tokenizer.from_pretrained(d), hf_tokenizer(d)
    chat = [{"role": "system", "content": "  s  "}, {"role": "skip", "content": "x"},
            {"role": "user", "content": "q", "meta": {"k": ["ü", 1]}}]
    text = ours.apply_chat_template(chat, tokenize=False)
    assert text == ref.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert '{"k": ["ü", 1]}' in text and "[2 turns, ends with <|im_end|>]" in text
    out = tmp_path / "saved"
    ours.save_pretrained(out)  # both files carried through, byte for byte
    assert (out / "chat_template.jinja").read_text() == RICH_TEMPLATE
    assert (out / "tokenizer_config.json").read_bytes() == (qwen_dir / "tokenizer_config.json").read_bytes()
    with pytest.raises(ValueError, match="the first message must be the system one"):
        ours.apply_chat_template(CHATS[0])
    (d / "chat_template.jinja").write_text("{% for %}")
    with pytest.raises(ValueError, match="not valid Jinja"):
        Tokenizer.from_pretrained(d).apply_chat_template(CHATS[0])
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer.byte_level().apply_chat_template(CHATS[0])
    (d / "chat_template.jinja").unlink()
    (d / "tokenizer_config.json").write_text("{broken")
    with pytest.raises(ValueError, match="tokenizer_config.json or chat_template.jinja is unreadable"):
        Tokenizer.from_pretrained(d)


def test_end_ids(qwen_dir):
    from types import SimpleNamespace
    qwen = Tokenizer.from_pretrained(qwen_dir)
    assert qwen.end_ids() == [151645, 151643]  # tokenizer_config's eos_token <|im_end|>, then <|endoftext|>
    config = SimpleNamespace(eos_token_id=151643, generation={"eos_token_id": [151645, 151643, 151668]})
    assert qwen.end_ids(config) == [151645, 151643, 151668]  # generation_config.json first, in its order
    config = SimpleNamespace(eos_token_id=151644, generation=None)
    assert qwen.end_ids(config) == [151644, 151645, 151643]
    config = SimpleNamespace(eos_token_id=999_999, generation={"eos_token_id": 151669})  # not tokens: left out
    assert qwen.end_ids(config) == [151645, 151643]
    assert Tokenizer.byte_level().end_ids() == [256]


# ---- bad inputs ----

def test_bad_inputs(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import WordPiece

    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope"):
        Tokenizer.from_pretrained(missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="empty.*no tokenizer.json"):
        Tokenizer.from_pretrained(empty)

    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="garbage.*JSON"):
        Tokenizer.from_pretrained(garbage)

    wordpiece = tmp_path / "wordpiece"
    wordpiece.mkdir()
    HFTokenizer(WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]")).save(str(wordpiece / "tokenizer.json"))
    with pytest.raises(ValueError, match="wordpiece.*WordPiece"):
        Tokenizer.from_pretrained(wordpiece)

    # a BPE that is not byte-level (no ByteLevel pre-tokenizer, vocabulary not in byte form)
    from tokenizers.models import BPE
    from tokenizers.pre_tokenizers import Whitespace
    plain_bpe = tmp_path / "plain_bpe"
    plain_bpe.mkdir()
    bpe = HFTokenizer(BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")]))
    bpe.pre_tokenizer = Whitespace()
    bpe.save(str(plain_bpe / "tokenizer.json"))
    with pytest.raises(ValueError, match="plain_bpe.*byte-level"):
        Tokenizer.from_pretrained(plain_bpe)

    # a byte-level BPE whose normaliser we do not implement
    byte_dir = tmp_path / "byte"
    Tokenizer.byte_level().save_pretrained(byte_dir)
    spec = json.loads((byte_dir / "tokenizer.json").read_text())
    spec["normalizer"] = {"type": "Lowercase"}
    (byte_dir / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="Lowercase"):
        Tokenizer.from_pretrained(byte_dir)

    short = tmp_path / "short.tiktoken"
    short.write_text("IQ== 0\nIg== 1\n")
    with pytest.raises(ValueError, match="short.tiktoken.*151643"):
        Tokenizer.from_pretrained(short)
    bad_line = tmp_path / "bad.tiktoken"
    bad_line.write_text("IQ== 0\nnot-base64!!\n")
    with pytest.raises(ValueError, match="line 2"):
        Tokenizer.from_pretrained(bad_line)


# ---- a BPE learnt here (the embedded default's tokenizer) ----

def slow_bpe(texts, n_merges):
    """Reference trainer: recount every pair from scratch before each merge (no incremental updates)."""
    import collections
    import re
    from lib.tokenizer import CODE_PATTERN
    words = collections.Counter(p for t in texts for p in re.findall(CODE_PATTERN, t))
    seqs = {w: [bytes([b]) for b in w.encode()] for w in words}
    merges = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, s in seqs.items():
            for pair in zip(s, s[1:]):
                pairs[pair] += words[w]
        if not pairs or max(pairs.values()) < 2:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best[0] + best[1])
        for w, s in seqs.items():
            out = []
            for tok in s:
                if out and (out[-1], tok) == best:
                    out[-1] = best[0] + best[1]
                else:
                    out.append(tok)
            seqs[w] = out
    return merges


def test_train_learns_the_most_frequent_pairs_first():
    texts = ["def f(self):\n    return self.x\n", "self.self = self  # self", "aaaa"] * 3
    tok = train_bpe(texts, 256 + 12 + 3)
    ranks = tok._ranks
    learnt = [b for b, _ in sorted(ranks.items(), key=lambda kv: kv[1]) if len(b) > 1]
    assert learnt == slow_bpe(texts, 12)
    assert learnt[:3] == [b"se", b"sel", b"self"]  # "se"/"el" tie on count; ties go to the larger pair
    assert (tok.vocab_size, tok.eos_id, tok.mask_id) == (271, 268, 271)
    assert tok.encode(" self") == [ranks[b" self"]] and tok.encode("aaaa") == [ranks[b"aa"]] * 2


def test_trained_tokenizer_matches_hugging_face(tmp_path):
    from transformers import PreTrainedTokenizerFast

    corpus = [(STDLIB / s).read_text() for s in SOURCES]
    tok = train_bpe(corpus[:3], 600)
    tok.save_pretrained(tmp_path)
    back = Tokenizer.from_pretrained(tmp_path)
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    texts = corpus[3:] + SAMPLES + random_texts(30, seed=5) + ["x<|endoftext|>y"]
    for text in texts:
        ids = tok.encode(text, allowed_special="all")
        assert back.encode(text, allowed_special="all") == ids
        assert hf.encode(text, add_special_tokens=False) == ids, text[:80]
        assert tok.decode(ids) == text and hf.decode(ids) == text
    assert len(tok.encode(corpus[4])) < 0.5 * len(corpus[4].encode())  # it compresses unseen code


def test_a_file_is_parsed_once_per_content(qwen_dir, tmp_path):
    a, b = Tokenizer.from_pretrained(qwen_dir), Tokenizer.from_pretrained(qwen_dir / "tokenizer.json")
    assert a is not b and a._enc is b._enc and (a.name, b.name) == (qwen_dir.name, "tokenizer.json")
    d = tmp_path / "t"
    Tokenizer.byte_level().save_pretrained(d)
    x = Tokenizer.from_pretrained(d)
    train_bpe(["def f(x): return x"] * 5, 264).save_pretrained(d)  # another tokenizer at the same path
    y = Tokenizer.from_pretrained(d)
    assert y.fingerprint != x.fingerprint and y.vocab_size == 264 and x.vocab_size == 259


def test_chat_tokens_with_qwen3s_own_template(qwen_dir):
    """corpus.chat_tokens on Qwen3's template (which writes an empty <think> block into the last answer): the ids
    are transformers' for the whole conversation, and the marked tokens are exactly the answers and their
    <|im_end|>."""
    tok, ref = Tokenizer.from_pretrained(qwen_dir), hf_tokenizer(qwen_dir)
    chat = CHATS[1] + [{"role": "assistant", "content": "6, und hallo"}]
    ids, marks = corpus.chat_tokens(tok, chat)
    want = ref.apply_chat_template(chat, tokenize=True)
    assert ids == list(want["input_ids"] if hasattr(want, "keys") else want)
    assert tok.decode([i for i, m in zip(ids, marks) if m]) == "4<|im_end|>6, und hallo<|im_end|>"
    assert "<think>" in tok.decode(ids[-20:])  # the template's scaffold is there, and not trained
