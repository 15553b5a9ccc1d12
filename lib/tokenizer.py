"""A byte-level BPE tokenizer on top of tiktoken, giving exactly Hugging Face's ids.

Notes on the design: docs/methods.md, "lib/tokenizer.py" under §8.
"""
import copy
import functools
import hashlib
import json
import operator
import unicodedata
from base64 import b64decode
from pathlib import Path

import tiktoken

from lib.cli import atomic_write

# Qwen's pre-tokenisation regex. Note the single \p{N}: every digit is its own piece.
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
                r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
# GPT-2's regex, which Hugging Face's ByteLevel pre-tokenizer applies when `use_regex` is true.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Hugging Face's Digits(individual_digits) step, then GPT-2's regex within what it leaves (SmolLM2, StarCoder) is this
# one regex: a digit alone (no leading space), and a digit ends a whitespace run as the end of a piece would.
DIGITS_GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+"""
# The pieces BPE is learnt within (train_bpe): GPT-2's rule with ASCII classes, so that Python's
# `re` (training) and tiktoken (encoding) read it alike; `_` joins words, as in Python identifiers.
CODE_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z_]+| ?[0-9]+| ?[^\sA-Za-z0-9_]+|\s+(?!\S)|\s+"""
QWEN_N_RANKS = 151643
# Qwen3's added tokens, ids 151643.... Hugging Face marks those from <tool_call> (151657) on as
# `special: false`, the earlier ones as `special: true`.
QWEN3_ADDED = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]
QWEN3_FIRST_NONSPECIAL = 151657
EOS = "<|endoftext|>"
MASK_TEXT = "<|mask|>"
ABSENT = 1 << 30  # tiktoken's ranks of the single bytes a vocabulary lacks (Tokenizer._lacks): never emitted
# Hugging Face files a checkpoint's tokenizer comes with besides its vocabulary, copied through unchanged
CONFIG_FILES = ("tokenizer_config.json", "chat_template.jinja")
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def bytes_to_unicode():
    """GPT-2's table from each byte to a printable character (used for byte-level vocabularies)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:  # the 68 other bytes go to chr(256), chr(257) ... in order
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


@functools.lru_cache(maxsize=4)
def chat_renderer(template):
    """A compiled chat template, in the environment transformers renders chat templates in."""
    from datetime import datetime
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ValueError("chat templates need jinja2: pip install jinja2") from None

    def raise_exception(message):
        raise jinja2.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"the chat template is not valid Jinja: {e}") from None


def read_file(p, name):
    """Tokenizer._from_tiktoken or _from_hf_json of the file p, parsed once per process per content and copied:
    Qwen's 18 MB tokenizer.json takes seconds to parse, and a script reads it up to four times (in the model, the
    data, the teacher, a fingerprint); hashing it takes a few milliseconds. The last PARSED_KEPT are kept."""
    p = Path(p)
    key = (p.suffix == ".tiktoken", hashlib.sha256(p.read_bytes()).hexdigest())
    if key not in _PARSED:
        tok = Tokenizer._from_tiktoken(p) if key[0] else Tokenizer._from_hf_json(p, p.name)
        tok.fingerprint  # computed once, for every copy
        _PARSED[key] = tok
        while len(_PARSED) > PARSED_KEPT:
            _PARSED.pop(next(iter(_PARSED)))
    tok = copy.copy(_PARSED[key])
    tok.name = name
    return tok


PARSED_KEPT, _PARSED = 4, {}  # read_file's parsed tokenizers, by (kind, sha256 of the file), oldest first


def fingerprint_of(directory):
    """The fingerprint (Tokenizer.fingerprint) of the tokenizer saved in a directory, or None when it holds none
    that can be read; for checkpoints and datasets written before fingerprints were recorded."""
    try:
        return Tokenizer.from_pretrained(directory).fingerprint
    except (FileNotFoundError, ValueError):
        return None


class Tokenizer:
    def __init__(self, name, ranks, pattern, added, nfc, source=None):
        """ranks: token bytes -> id; added: token text -> (id, special?); source: (file name,
        content) that save_pretrained copies, or None to generate a tokenizer.json."""
        self.name, self.nfc, self._pattern, self._source = name, nfc, pattern, source
        self._ranks, self._added = ranks, added
        self._files = {}  # CONFIG_FILES read with it (from_pretrained): name -> bytes, written back unchanged
        self._special = {text: i for text, (i, _) in added.items()}
        self._always = frozenset(text for text, (_, special) in added.items() if not special)
        ids = [*ranks.values(), *self._special.values()]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{name}: two tokens share an id")
        self._vocab_size = max(ids) + 1
        self._holes = set(range(self._vocab_size)) - set(ids)  # ids in range that are no token
        # single bytes the vocabulary lacks (SmolLM2 lacks 21: control and never-valid UTF-8 bytes) get ranks past
        # ABSENT that no merge reaches, and encode drops them, as Hugging Face's BPE drops an unknown character
        self._lacks = {bytes([b]): ABSENT + b for b in range(256) if bytes([b]) not in ranks}
        try:
            self._enc = tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks={**ranks, **self._lacks},
                                          special_tokens=self._special)
        except Exception as e:  # e.g. a regex tiktoken cannot compile
            raise ValueError(f"{name}: tiktoken rejected this tokenizer ({e})") from e

    # ---- loading ----
    @classmethod
    def byte_level(cls):
        """The tiny models' tokenizer: ids 0..255 are the bytes, then three special tokens."""
        added = {EOS: (256, True), "<|im_start|>": (257, True), "<|im_end|>": (258, True)}
        return cls("byte", {bytes([b]): b for b in range(256)}, GPT2_PATTERN, added, nfc=False)

    @classmethod
    def from_pretrained(cls, path):
        """A directory with tokenizer.json (or exactly one *.tiktoken), or either file itself. From a directory,
        its tokenizer_config.json and chat_template.jinja come along (checked to be JSON / text). A Hugging Face
        model id works too (hf.resolve)."""
        from lib.hf import resolve
        p = resolve(path)
        if p.is_dir():
            if (p / "tokenizer.json").is_file():
                tok = read_file(p / "tokenizer.json", p.name)
            else:
                found = sorted(p.glob("*.tiktoken"))
                if len(found) > 1:
                    raise ValueError(f"{p}: several *.tiktoken files and no tokenizer.json: {found}")
                if not found:
                    raise FileNotFoundError(f"{p}: the directory holds no tokenizer.json or *.tiktoken file")
                tok = read_file(found[0], found[0].name)
            tok._files = {f: (p / f).read_bytes() for f in CONFIG_FILES if (p / f).is_file()}
            try:
                tok.config, tok.chat_template
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
                raise ValueError(f"{p}: tokenizer_config.json or chat_template.jinja is unreadable ({e})") from None
            return tok
        if not p.exists():
            raise FileNotFoundError(f"tokenizer path {p} does not exist")
        if p.suffix in (".tiktoken", ".json"):
            return read_file(p, p.name)
        raise ValueError(f"{p}: expected a directory, a tokenizer.json or a .tiktoken file")

    @classmethod
    def _from_tiktoken(cls, p):
        raw, ranks = p.read_bytes(), {}
        for n, line in enumerate(raw.splitlines(), 1):
            if line.strip():
                try:
                    token, rank = line.split()
                    ranks[b64decode(token, validate=True)] = int(rank)
                except ValueError as e:  # also binascii.Error
                    raise ValueError(f"{p}, line {n}: expected '<base64 token> <rank>' ({e})") from e
        if set(ranks.values()) != set(range(QWEN_N_RANKS)) or len(ranks) != QWEN_N_RANKS:
            raise ValueError(f"{p}: a bare .tiktoken file is read as Qwen's, which has {QWEN_N_RANKS} "
                             f"ranks 0..{QWEN_N_RANKS - 1}; this one has {len(ranks)} tokens")
        added = {t: (QWEN_N_RANKS + k, QWEN_N_RANKS + k < QWEN3_FIRST_NONSPECIAL)
                 for k, t in enumerate(QWEN3_ADDED)}
        return cls(p.name, ranks, QWEN_PATTERN, added, nfc=True, source=(p.name, raw))

    @classmethod
    def _from_hf_json(cls, p, name):
        raw = p.read_bytes()
        try:
            spec = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{p}: not a valid JSON file ({e})") from e

        def unsupported(why):
            return ValueError(f"{p}: {why}; only byte-level BPE tokenizer.json files are supported")

        model = spec.get("model") if isinstance(spec, dict) else None
        if not isinstance(model, dict) or model.get("type") != "BPE":
            kind = model.get("type") if isinstance(model, dict) else None
            raise unsupported(f"the model is {kind!r}, not BPE")
        if model.get("byte_fallback") or model.get("dropout") or model.get("continuing_subword_prefix") \
                or model.get("end_of_word_suffix"):
            raise unsupported("BPE options byte_fallback/dropout/subword affixes are set")

        # Pre-tokenisation: a ByteLevel step, with either a Split regex before it, or its own GPT-2 regex
        # (use_regex), alone or after single digits (Digits). Anything else would split text unlike tiktoken.
        pre = spec.get("pre_tokenizer") or {}
        steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
        kinds = [s.get("type") for s in steps]
        level = next((s for s in steps if s.get("type") == "ByteLevel"), None)
        if level is None or kinds[-1] != "ByteLevel" or kinds[:-1] not in ([], ["Split"], ["Digits"]) \
                or level.get("add_prefix_space"):
            raise unsupported(f"unsupported pre_tokenizer {kinds}")
        split = next((s for s in steps if s.get("type") == "Split"), None)
        if kinds[0] == "Digits":
            if not (steps[0].get("individual_digits") and level.get("use_regex", True)):
                raise unsupported(f"unsupported Digits pre_tokenizer {steps[0]} before {level}")
            pattern = DIGITS_GPT2_PATTERN
        elif split is not None:
            pattern = (split.get("pattern") or {}).get("Regex")
            if pattern is None or split.get("behavior") != "Isolated" or split.get("invert") \
                    or level.get("use_regex", True):
                raise unsupported(f"unsupported Split pre_tokenizer {split}")
        elif level.get("use_regex", True):
            pattern = GPT2_PATTERN
        else:
            raise unsupported("the pre_tokenizer has no regex")

        norm = spec.get("normalizer") or {}
        norms = [n.get("type") for n in norm.get("normalizers", [])] if norm.get("type") == "Sequence" \
            else [norm["type"]] if norm else []
        if norms not in ([], ["NFC"]):
            raise unsupported(f"normalizer {norms} (only NFC is supported)")

        added = {}
        for t in spec.get("added_tokens") or []:
            if t.get("lstrip") or t.get("rstrip") or t.get("single_word"):
                raise unsupported(f"added token {t['content']!r} uses lstrip/rstrip/single_word")
            added[t["content"]] = (t["id"], bool(t.get("special")))
        added_ids = {i for i, _ in added.values()}
        byte_of = {c: b for b, c in bytes_to_unicode().items()}
        ranks = {}
        for text, i in model.get("vocab", {}).items():
            if i in added_ids:
                continue  # an added token also listed in the vocabulary (GPT-2 does this)
            try:
                ranks[bytes(byte_of[c] for c in text)] = i
            except KeyError:
                raise unsupported(f"vocabulary entry {text!r} is not a byte-level string") from None
        return cls(name, ranks, pattern, added, nfc=norms == ["NFC"], source=("tokenizer.json", raw))

    # ---- saving ----
    def save_pretrained(self, directory):
        """Write the tokenizer (a copy of its source file, or a generated tokenizer.json) and the tokenizer_config.json
        (and chat_template.jinja) it was read with, byte for byte, or a minimal tokenizer_config.json for a
        tokenizer made here; from_pretrained(directory) reads it back."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        fname, data = self._source or ("tokenizer.json", json.dumps(self._hf_json(), indent=2).encode())
        atomic_write(d / fname, lambda f: Path(f).write_bytes(data))
        files = dict(self._files)
        if "tokenizer_config.json" not in files:
            config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
            if EOS in self._special:
                config["eos_token"] = EOS
            files["tokenizer_config.json"] = json.dumps(config, indent=2).encode()
        for name, raw in files.items():
            atomic_write(d / name, lambda f: Path(f).write_bytes(raw))

    def _hf_json(self):
        """A tokenizer.json for a vocabulary made here (byte-level or trained by `train`). The merges are
        every split of a token into two lower-ranked tokens, in rank order: Hugging Face then merges
        exactly as tiktoken does (the lowest-ranked result first)."""
        u = bytes_to_unicode()

        def text(b):
            return "".join(u[c] for c in b)

        merges = [(text(t[:k]), text(t[k:])) for t, _ in sorted(self._ranks.items(), key=lambda kv: kv[1])
                  for k in sorted(range(1, len(t)),
                                  key=lambda k: (self._ranks.get(t[:k], -1), self._ranks.get(t[k:], -1)))
                  if t[:k] in self._ranks and t[k:] in self._ranks]
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                      "use_regex": self._pattern == GPT2_PATTERN}
        split = {"type": "Split", "pattern": {"Regex": self._pattern}, "behavior": "Isolated", "invert": False}
        return {
            "version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": special}
                             for t, (i, special) in sorted(self._added.items(), key=lambda kv: kv[1])],
            "normalizer": {"type": "NFC"} if self.nfc else None,
            "pre_tokenizer": byte_level if self._pattern == GPT2_PATTERN else
            {"type": "Sequence", "pretokenizers": [split, byte_level]},
            "post_processor": None, "decoder": dict(byte_level, use_regex=True),
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": {text(b): i for b, i in self._ranks.items()},
                      "merges": [list(m) for m in merges]},
        }

    # ---- encoding and decoding ----
    def _allowed(self, allowed_special):
        if allowed_special == "all":
            return set(self._special)
        unknown = set(allowed_special) - self._special.keys()
        if unknown:
            raise ValueError(f"{self.name}: unknown special tokens {sorted(unknown)}")
        return self._always | set(allowed_special)

    def _normalize(self, text):
        return unicodedata.normalize("NFC", text) if self.nfc else text

    def encode(self, text, allowed_special=frozenset()):
        ids = self._enc.encode(self._normalize(text), allowed_special=self._allowed(allowed_special),
                               disallowed_special=())
        return [i for i in ids if i < ABSENT] if self._lacks else ids

    def encode_batch(self, texts, allowed_special=frozenset()):
        batch = self._enc.encode_batch([self._normalize(t) for t in texts],
                                       allowed_special=self._allowed(allowed_special), disallowed_special=())
        return [[i for i in ids if i < ABSENT] for ids in batch] if self._lacks else batch

    def decode(self, ids):
        """ids: a list or 1-D tensor/array. The mask id shows as <|mask|>; bad UTF-8 as U+FFFD."""
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        ids = [ids] if isinstance(ids, int) else ids
        pieces, run = [], []
        for i in ids:
            try:
                i = operator.index(i)
            except TypeError:
                raise ValueError(f"decode expects a 1-D sequence of ids, got an element {i!r}") from None
            if i == self.mask_id:
                pieces += [self._enc.decode_bytes(run), MASK_TEXT.encode()]
                run = []
            elif 0 <= i < self._vocab_size and i not in self._holes:
                run.append(i)
            else:
                raise ValueError(f"id {i} is not in the vocabulary of {self.name} "
                                 f"(ids 0..{self._vocab_size - 1}, mask {self.mask_id})")
        pieces.append(self._enc.decode_bytes(run))
        return b"".join(pieces).decode("utf-8", errors="replace")

    # ---- facts ----
    @property
    def vocab_size(self):
        """Number of ids the tokenizer uses (largest id + 1); the mask id is not counted."""
        return self._vocab_size

    @property
    def mask_id(self):
        return self._vocab_size

    @property
    def eos_id(self):
        """The id of <|endoftext|>: the end of a document (lib/corpus.py separates documents with it)."""
        if EOS not in self._special:
            raise ValueError(f"{self.name} has no {EOS} token")
        return self._special[EOS]

    @functools.cached_property
    def config(self):
        """tokenizer_config.json as read (a dict; empty when there was none)."""
        raw = self._files.get("tokenizer_config.json")
        return json.loads(raw) if raw else {}

    def special_token(self, key):
        """The text of a tokenizer_config.json entry such as eos_token (stored as a string or an AddedToken dict),
        or None."""
        t = self.config.get(key)
        return t.get("content") if isinstance(t, dict) else t

    def end_ids(self, config=None, turn=False):
        """Every id that ends a generation, first those the model declares: generation_config.json's eos_token_id
        (an id or a list: Qwen3's instruct models [151645, 151643], <|im_end|> and <|endoftext|>), then config.json's
        (config: a Qwen3Config), then tokenizer_config.json's eos_token, then <|endoftext|>; turn: then <|im_end|>,
        the end of a chat turn, where the model does not declare it. Ids the tokenizer does not have are left out."""
        ids = []
        if config is not None:
            for e in ((getattr(config, "generation", None) or {}).get("eos_token_id"), config.eos_token_id):
                ids += e if isinstance(e, list) else [e]
        ids += [self._special.get(self.special_token("eos_token")), self._special.get(EOS)]
        ids += [self._special.get("<|im_end|>")] if turn else []
        ids = [i for i in ids if isinstance(i, int) and 0 <= i < self._vocab_size and i not in self._holes]
        return list(dict.fromkeys(ids))  # in order, each once

    @property
    def chat_template(self):
        """The Jinja chat template (chat_template.jinja, else tokenizer_config.json's chat_template; a named list's
        "default"), or None."""
        if "chat_template.jinja" in self._files:
            return self._files["chat_template.jinja"].decode()
        t = self.config.get("chat_template")
        if isinstance(t, list):  # [{"name": ..., "template": ...}, ...]
            t = next((x["template"] for x in t if x.get("name") == "default"), None)
        return t

    def apply_chat_template(self, messages, *, add_generation_prompt=True, tokenize=True, **kwargs):
        """messages [{"role", "content"}, ...] -> the prompt's ids (tokenize=False: its text), rendered from the
        checkpoint's chat template as transformers renders it: jinja2's sandbox with trim_blocks and lstrip_blocks,
        the tojson filter, raise_exception and strftime_now; the special tokens of tokenizer_config.json
        (bos_token, eos_token, ...) and kwargs (e.g. enable_thinking=False for Qwen3) as variables. The text is
        encoded with every special token recognised."""
        template = self.chat_template
        if template is None:
            raise ValueError(f"{self.name}: the checkpoint has no chat template (tokenizer_config.json's "
                             f"chat_template or chat_template.jinja)")
        compiled = chat_renderer(template)  # a one-line ValueError without jinja2 or for a template that is not Jinja
        import jinja2
        special = {k: self.special_token(k) for k in SPECIAL_KEYS if self.special_token(k) is not None}
        try:
            text = compiled.render(messages=messages, add_generation_prompt=add_generation_prompt, **special, **kwargs)
        except jinja2.TemplateError as e:
            raise ValueError(f"{self.name}: the chat template failed: {e}") from None
        return self.encode(text, allowed_special="all") if tokenize else text

    @functools.cached_property
    def fingerprint(self):
        """sha256 (hex) of everything that decides the ids: the pre-tokenisation regex, NFC, every (id, token bytes)
        and every added token (id, text, special?). The same tokenizer read from tokenizer.json or a .tiktoken, or
        saved with other formatting, has the same fingerprint. Datasets (meta.json) and checkpoints (config.json)
        record it, and training refuses a model and data tokenized differently."""
        added = sorted((i, text, special) for text, (i, special) in self._added.items())
        h = hashlib.sha256(json.dumps([self._pattern, self.nfc, added]).encode())
        for token, i in sorted(self._ranks.items(), key=operator.itemgetter(1)):
            h.update(i.to_bytes(4, "little") + len(token).to_bytes(2, "little") + token)  # length-prefixed: unambiguous
        return h.hexdigest()

    @property
    def special_tokens(self):
        """All added tokens (both Hugging Face kinds), text -> id."""
        return dict(self._special)

    def __repr__(self):
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, nfc={self.nfc})"
