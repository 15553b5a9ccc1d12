"""
Data: a text corpus in, flat token files out, and the readers the training scripts use.

    python -m lib.data --out_dir data/stdlib                        # this Python's standard library
    python -m lib.data --out_dir data/mine --source notes/ --tokenizer path/to/Qwen3-0.6B
    python -m lib.data --out_dir data/chat --source chats.jsonl --tokenizer path/to/Qwen3-0.6B   # {"messages": [...]}

Notes on the design: docs/methods.md, "lib/data.py" under §8.
"""
import json
import os
import platform
import random
import sys
import sysconfig
import zlib
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from lib import cli
from lib.cli import atomic_write
from lib.tokenizer import (EOS, Tokenizer, described, fingerprint_of, prepare_with, same_tokenizer, train_bpe,
                           trained_with)

STDLIB_SKIP = {"site-packages", "test", "tests", "idlelib", "__pycache__"}  # dirs left out of the default corpus


# -----------------------------------------------------------------------------
# reading sources

def iter_jsonl(path, required_keys=()):
    """Yield (line_number, record) for every non-blank line, checking each one."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                rec = json.loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ValueError(f"{where}: malformed JSON line ({e})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
            for k in required_keys:
                if k not in rec:
                    raise ValueError(f"{where}: missing key {k!r} (required: {', '.join(required_keys)})")
                if not isinstance(rec[k], str):
                    raise ValueError(f"{where}: key {k!r} must be a string, got {type(rec[k]).__name__}")
            yield lineno, rec


def read_text(path):
    """The file as a str, or None when it looks binary (a NUL byte) or is not UTF-8."""
    with open(path, "rb") as f:
        head = f.read(8192)
        if b"\0" in head:
            return None
        raw = head + f.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def iter_documents(source, stats):
    """Yield (name, text, n_bytes) for a source: None (the stdlib), a folder of text files, or a .jsonl
    file. The name is the document's stable identity, which decides its split."""
    if source is not None and os.path.isfile(source):  # JSONL: one {"text": ...} or {"messages": [...]} per line
        for lineno, rec in iter_jsonl(source):
            if "messages" in rec:  # a conversation: prepare renders it through the chat template
                yield f"line {lineno}", rec["messages"], len(json.dumps(rec["messages"]).encode("utf-8"))
            elif isinstance(rec.get("text"), str):
                yield f"line {lineno}", rec["text"], len(rec["text"].encode("utf-8"))
            else:
                raise ValueError(f"{source}:{lineno}: expected a string 'text' or a list 'messages'")
        return
    root = source or sysconfig.get_paths()["stdlib"]
    skip, exts = (STDLIB_SKIP, (".py",)) if source is None else ({"__pycache__"}, None)
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip and not d.startswith(".")]
        files += [os.path.relpath(os.path.join(dirpath, f), root) for f in filenames
                  if not f.startswith(".") and (exts is None or f.endswith(exts))]
    for rel in sorted(p.replace(os.sep, "/") for p in files):  # sorted posix paths: same on every machine
        path = os.path.join(root, rel)
        text = read_text(path)
        if text is None:
            stats["skipped_binary"] += 1
            continue
        yield rel, text, os.path.getsize(path)


def is_val(name, val_fraction):
    """The split rule: a stable hash of the document's name, independent of order and machine."""
    return zlib.crc32(name.encode("utf-8")) % 10000 < val_fraction * 10000


ROLES = ("system", "user", "assistant", "tool")


def chat_tokens(tok, messages):
    """A conversation [{"role", "content"}, ...] -> (ids, assistant): the ids of the whole conversation as the
    checkpoint's chat template renders it, and a 0/1 list marking the assistant turns' tokens: each assistant
    message's content and the token after it (the template's end of turn, e.g. <|im_end|>). The contents are found
    in order in the rendered text (each after its role's name, where the template writes one), so a template that
    rewrites earlier turns (Qwen3 drops their <think> blocks) is read as it renders them. ValueError, with the
    reason: not a list of {role, content} strings, a role outside ROLES, no assistant turn, an assistant content the
    template does not render as given (stripped of surrounding whitespace at most), or cut points that change the
    tokens."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                 and isinstance(m.get("content"), str) for m in messages):
        raise ValueError("messages must be a list of {role, content} strings")
    if unknown := [m["role"] for m in messages if m["role"] not in ROLES]:
        raise ValueError(f"role {unknown[0]!r} is not one of {', '.join(ROLES)}")
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError("no assistant turn")
    text = tok.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    cuts, at = [], 0  # (start, end) character spans of the assistant contents
    for m in messages:
        head = text.find(m["role"], at)  # the turn's header names its role (ChatML, Llama 3): search after it
        at = head + len(m["role"]) if head >= 0 else at
        content = m["content"] if m["content"] in text[at:] else m["content"].strip()
        i = text.find(content, at) if content else -1
        if i < 0:
            if m["role"] == "assistant":
                raise ValueError("the chat template does not render an assistant content as given")
            continue
        at = i + len(content)
        if m["role"] == "assistant":
            cuts.append((i, at))
    ids, assistant, prev = [], [], 0
    def encode(t):
        return tok.encode(t, allowed_special="all")
    for a, b in cuts:
        before, answer = encode(text[prev:a]), encode(text[a:b])
        ids += before + answer
        assistant += [0] * len(before) + [1] * len(answer)
        prev = b
    rest = encode(text[prev:])
    ids, assistant = ids + rest, assistant + [0] * len(rest)
    if ids != encode(text):
        raise ValueError("the tokens at an assistant turn's edges differ from the whole conversation's")
    for k in [k for k in range(1, len(ids)) if assistant[k - 1] and not assistant[k]]:
        assistant[k] = 1  # the token that ends the turn
    return ids, assistant


def is_chat(source):
    """Whether a source is a JSONL of conversations (its first record has "messages")."""
    if source is None or not os.path.isfile(source):
        return False
    return "messages" in next((rec for _, rec in iter_jsonl(source)), {})


# -----------------------------------------------------------------------------
# preparing a dataset

def bpe_texts(source, val_fraction, max_mb):
    """The training documents' texts (streamed, as prepare reads them), for learning a BPE vocabulary."""
    n_bytes = 0
    for name, text, size in tqdm(iter_documents(source, {"skipped_binary": 0}), desc="learning BPE", unit=" docs"):
        if max_mb is not None and n_bytes >= max_mb * 1e6:
            return
        n_bytes += size
        if not is_val(name, val_fraction):
            yield text


def prepare(out_dir, source=None, tokenizer="bpe", val_fraction=0.05, max_mb=None, batch_docs=256, vocab_size=1024,
            *, overwrite=False):
    """Tokenize a source into out_dir/{train,val}.bin + tokenizer + meta.json; returns meta.
    tokenizer: "bpe" (learn a byte-level BPE of vocab_size ids on the training documents, a first pass
    over the source), "byte" (259 ids), or a path to a tokenizer (a dir with tokenizer.json, a .tiktoken).
    A dataset already in out_dir made with another tokenizer is replaced only with overwrite=True (checkpoints
    trained on it would no longer match it). A failed run leaves out_dir as it found it (not created)."""
    if source is not None and not os.path.exists(source):
        raise FileNotFoundError(f"source not found: {source}")
    if source is not None and os.path.isfile(source) and not source.endswith(".jsonl"):
        raise ValueError(f"source {source} is a file: expected a folder of text files or a .jsonl file")
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    chat = is_chat(source)
    if chat and tokenizer in ("bpe", "byte"):
        raise ValueError(f"{source} holds conversations: they are rendered through a checkpoint's chat template, so "
                         "pass --tokenizer DIR (the checkpoint you will train)")
    if tokenizer == "bpe":
        tok = train_bpe(bpe_texts(source, val_fraction, max_mb), vocab_size)
    else:
        tok = Tokenizer.byte_level() if tokenizer == "byte" else Tokenizer.from_pretrained(tokenizer)
    if chat and tok.chat_template is None:
        raise ValueError(f"{source} holds conversations, but the tokenizer {tokenizer} has no chat template "
                         "(tokenizer_config.json's chat_template or chat_template.jinja)")
    old = fingerprint_of(out_dir)  # the tokenizer of a dataset already there, or None
    if old not in (None, tok.fingerprint) and not overwrite:
        raise ValueError(f"{out_dir} holds a dataset made with another tokenizer (sha256 {old[:12]}; this one "
                         f"{tok.fingerprint[:12]}), which checkpoints trained on it expect: pass --overwrite to "
                         f"replace it, or choose another --out_dir")
    dtype = np.uint16 if tok.vocab_size <= 65536 else np.uint32
    created = [d for d in (Path(out_dir), *Path(out_dir).parents) if not d.exists()]  # removed again on failure
    os.makedirs(out_dir, exist_ok=True)
    paths = {s: os.path.join(out_dir, f"{s}.bin") for s in ("train", "val")}
    if chat:  # per token 1 if it belongs to an assistant turn (chat_tokens), as uint8
        paths |= {f"{s}.roles": os.path.join(out_dir, f"{s}.roles.bin") for s in ("train", "val")}
    counts = {s: {"tokens": 0, "documents": 0} for s in ("train", "val")}
    stats = {"skipped_binary": 0, "skipped_empty": 0}
    skipped = {}  # chat: reason -> conversations left out
    # A small corpus might hash every document to one side, so the first document (in sorted order)
    # is held back and written last: to the split that would otherwise be empty, else its own.
    held = None  # (split, ids)

    def write(split, ids, roles=None):
        np.asarray(ids + [tok.eos_id], dtype=dtype).tofile(files[split])
        if chat:
            np.asarray(roles + [0], dtype=np.uint8).tofile(files[f"{split}.roles"])
        counts[split]["tokens"] += len(ids) + 1
        counts[split]["documents"] += 1

    def encoded(batch):  # -> [(name, ids, roles or None)]
        if not chat:
            return [(n, ids, None) for n, ids in zip(batch, tok.encode_batch(list(batch.values())))]
        out = []
        for name, messages in batch.items():
            try:
                out.append((name, *chat_tokens(tok, messages)))
            except ValueError as e:  # counted and reported, never half-trained
                skipped[str(e)] = skipped.get(str(e), 0) + 1
        return out

    def route(batch):
        nonlocal held
        for name, ids, roles in encoded(batch):
            split = "val" if is_val(name, val_fraction) else "train"
            if held is None:
                held = (split, ids, roles)
            else:
                write(split, ids, roles)

    files, done = {}, False
    try:
        files = {s: open(p + ".tmp", "wb") for s, p in paths.items()}
        batch, n_bytes = {}, 0
        with tqdm(unit="B", unit_scale=True, desc="tokenizing") as bar:
            for name, text, size in iter_documents(source, stats):
                if max_mb is not None and n_bytes >= max_mb * 1e6:
                    break
                n_bytes += size
                bar.update(size)
                if not chat and not text.strip():
                    stats["skipped_empty"] += 1
                    continue
                batch[name] = text
                if len(batch) >= batch_docs:
                    route(batch)
                    batch = {}
            route(batch)
        n_docs = counts["train"]["documents"] + counts["val"]["documents"] + (held is not None)
        if n_docs < 2:
            raise ValueError(f"found {n_docs} {'usable conversations' if chat else 'text documents'} in "
                             f"{source or 'the standard library'}; need at least 2 (one for train, one for val)"
                             + "".join(f"; skipped {k}: {v}" for k, v in skipped.items()))
        split = next((s for s in ("train", "val") if counts[s]["documents"] == 0), held[0])
        write(split, *held[1:])
        for f in files.values():
            f.close()
        # finish: the old meta.json goes first, the new one last, so meta.json <=> complete dataset
        meta_path = os.path.join(out_dir, "meta.json")
        if os.path.exists(meta_path):
            os.remove(meta_path)
        for split, p in paths.items():
            os.replace(p + ".tmp", p)
        tok.save_pretrained(out_dir)
        meta = dict(tokenizer=tok.name, tokenizer_sha256=tok.fingerprint, vocab_size=tok.vocab_size,
                    eos_id=tok.eos_id, dtype=np.dtype(dtype).name, splits=counts, source=source or "stdlib",
                    source_mb=round(n_bytes / 1e6, 3), **stats, max_mb=max_mb, val_fraction=val_fraction,
                    python=platform.python_version(), chat=chat, skipped_conversations=skipped)
        atomic_write(meta_path, lambda f: Path(f).write_text(json.dumps(meta, indent=2)))
        done = True
        return meta
    finally:  # on any failure: no half-written files left behind, and no directory this call created
        for split, f in files.items():
            f.close()
            if os.path.exists(paths[split] + ".tmp"):
                os.remove(paths[split] + ".tmp")
        if not done:
            for d in created:  # nearest first
                if d.is_dir() and not any(d.iterdir()):
                    d.rmdir()


# -----------------------------------------------------------------------------
# loading and batching

def load_split(data_dir, split):
    """The split's tokens as a read-only np.memmap (dtype from meta.json)."""
    meta_path, bin_path = os.path.join(data_dir, "meta.json"), os.path.join(data_dir, f"{split}.bin")
    for p in (meta_path, bin_path):
        if not os.path.exists(p):
            raise FileNotFoundError(f"{data_dir} is not a prepared dataset: missing {os.path.basename(p)}. "
                                    f"Make one with: python -m lib.data --out_dir {data_dir}")
    with open(meta_path) as f:
        meta = json.load(f)
    data = np.memmap(bin_path, dtype=meta["dtype"], mode="r")
    if len(data) != meta["splits"][split]["tokens"]:
        raise ValueError(f"{bin_path} has {len(data)} tokens but meta.json says "
                         f"{meta['splits'][split]['tokens']}; prepare it again")
    return data


def load_roles(data_dir, split):
    """A chat dataset's assistant marks for the split (uint8 np.memmap, 1: an assistant turn's token), or None for
    a dataset of plain documents."""
    with open(os.path.join(data_dir, "meta.json")) as f:
        if not json.load(f).get("chat"):
            return None
    return np.memmap(os.path.join(data_dir, f"{split}.roles.bin"), dtype=np.uint8, mode="r")


def _check_len(data, seq_len):
    if len(data) < seq_len:
        raise ValueError(f"the split has {len(data)} tokens, fewer than seq_len={seq_len}")


def _stack(data, ix, seq_len, device):
    x = torch.from_numpy(np.stack([np.asarray(data[i:i + seq_len], dtype=np.int64) for i in ix]))
    if torch.device(device).type == "cuda":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def document_starts(data, eos_id, seq_len):
    """The offsets of the documents' first tokens (0 and each token after an eos) at which a window of seq_len
    tokens fits: for windows that begin with a whole document (get_batch's and eval_batches' starts)."""
    starts = np.concatenate([[0], np.flatnonzero(np.asarray(data) == eos_id) + 1])
    return starts[starts <= len(data) - seq_len]


def offsets(n, batch_size, seq_len, generator=None, starts=None):
    """batch_size window offsets into n tokens: uniform over every window of seq_len, or over starts."""
    if starts is None:
        return torch.randint(n - seq_len + 1, (batch_size,), generator=generator).tolist()
    return torch.from_numpy(starts)[torch.randint(len(starts), (batch_size,), generator=generator)].tolist()


def get_batch(data, batch_size, seq_len, device="cpu", generator=None, *, starts=None):
    """(batch_size, seq_len) LongTensor of random contiguous windows; seed the generator to repeat.
    starts: the offsets a window may begin at (document_starts), drawn uniformly; default any."""
    _check_len(data, seq_len)
    return _stack(data, offsets(len(data), batch_size, seq_len, generator, starts), seq_len, device)


def answer_batch(data, answers, batch_size, seq_len, device="cpu", generator=None, *, starts=None):
    """get_batch's windows x (the same draws) and, where `answers` is given (a 0/1 array along data: the tokens to
    train on), the same windows of it as (B, T) bool -> (x, answers or None)."""
    _check_len(data, seq_len)
    ix = offsets(len(data), batch_size, seq_len, generator, starts)
    return _stack(data, ix, seq_len, device), None if answers is None else _stack(answers, ix, seq_len, device).bool()


def eval_batches(data, batch_size, seq_len, n_batches, device="cpu", *, starts=None):
    """A list of n_batches batches at fixed, evenly spaced offsets (among starts, when given): the same tokens on
    every call (no RNG). A list, not a generator, so a training loop can make it once and evaluate with it often."""
    _check_len(data, seq_len)
    n = n_batches * batch_size
    if starts is None:
        offsets = np.linspace(0, len(data) - seq_len, n).astype(np.int64).tolist()
    else:
        offsets = starts[np.linspace(0, len(starts) - 1, n).astype(np.int64)].tolist()
    return [_stack(data, offsets[b * batch_size:(b + 1) * batch_size], seq_len, device) for b in range(n_batches)]


def code_prompts(data, tok, n, length):
    """n prompts of `length` tokens for showing samples: each validation document from the start of its first
    function (`def ` at the start of a line), or from its beginning when it has none."""
    prompts = []
    for text in [tok.decode(d.tolist()) for d in documents(data, tok.eos_id)][:n]:
        start = max(0, text.find("\ndef ") + 1)
        prompts.append(tok.encode(text[start:])[:length])
    return prompts

def documents(data, eos_id):
    """Split a token array at eos into documents (eos removed, empty ones dropped)."""
    data = np.asarray(data)
    docs = np.split(data, np.flatnonzero(data == eos_id) + 1)
    docs = [d[:-1] if len(d) and d[-1] == eos_id else d for d in docs]
    return [d for d in docs if len(d)]


def after_separator(x, sep_id, eos_id):
    """(B, T) bool of token windows x: True where a sep_id token comes earlier in the token's own document (a
    document ends at its eos, which belongs to it). With prompt + sep + answer documents this marks the answer
    and its eos: the targets of an answer-only loss. A window that starts inside a document sees only the part
    of it in the window (an answer whose sep lies before the window is not marked)."""
    is_sep = (x == sep_id).long()
    seps = is_sep.cumsum(1)  # (B, T) seps up to and including each token
    at_eos = torch.where(x == eos_id, seps, 0).cummax(1).values  # seps up to the latest eos at or before each token
    before_doc = torch.nn.functional.pad(at_eos, (1, 0))[:, :-1]  # ... strictly before: the seps of earlier documents
    return seps - is_sep > before_doc  # a sep of this document strictly before the token


def answers_only(text, tok, train_data, val_data, window, who):
    """--loss_after TEXT -> (sep_id, starts): the separator's id and, per split, the offsets at which a window of
    `window` tokens begins a document (document_starts). TEXT None -> (None, no starts: any offset)."""
    if text is None:
        return None, dict(train=None, val=None)
    sep = tok.encode(text)
    if len(sep) != 1 or not (train_data == sep[0]).any():
        raise SystemExit(f"{who}: --loss_after {text!r} is {len(sep)} tokens of the data's tokenizer and must be "
                         f"one that occurs in the training data; pass one such token's text")
    return sep[0], dict(train=document_starts(train_data, tok.eos_id, window),
                        val=document_starts(val_data, tok.eos_id, window))


def loss_targets(args, tok, train_data, val_data, window, who):
    """--loss_after TEXT or --assistant_only -> (answers, starts): the training split's tokens to train on (a 0/1
    array along it, for data.answer_batch; None: every token; evaluation masks every position) and, per split, the
    offsets at which a window of `window` tokens may begin (None: any). --loss_after: answers_only's rule, applied
    to the whole split at once (a window begins at a document, so it sees each answer's document from its start).
    --assistant_only: a chat dataset's assistant marks (load_roles); training packs whole conversations (packed_batch),
    the evaluation's windows begin at a validation conversation that fits whole in one (the others are left out and
    counted)."""
    if not getattr(args, "assistant_only", False):
        sep_id, starts = answers_only(args.loss_after, tok, train_data, val_data, window, who)
        if sep_id is None:
            return None, starts
        x = torch.from_numpy(np.asarray(train_data, dtype=np.int64))[None]  # the split as one row
        return after_separator(x, sep_id, tok.eos_id)[0].numpy(), starts
    if args.loss_after is not None:
        raise SystemExit(f"{who}: --assistant_only and --loss_after choose the trained tokens two ways: pass one")
    answers, starts = load_roles(args.data, "train"), dict(train=None)
    if answers is None:
        raise SystemExit(f"{who}: --assistant_only needs a chat dataset ({args.data} holds plain documents): "
                         "python -m lib.data --source CONVERSATIONS.jsonl --tokenizer CHECKPOINT --out_dir DIR")
    first = conversation_spans(val_data, tok.eos_id, window, f"{who}: --assistant_only", "val")[:, 0]
    starts["val"] = first[first <= len(val_data) - window]  # an evaluation window starts at one of them
    if not len(starts["val"]):
        raise SystemExit(f"{who}: --assistant_only: no val conversation starts a window of --seq_len {window}")
    return answers, starts


def conversation_spans(data, eos_id, seq_len, who="", split="train"):
    """(n, 2) int64 array: the first offset and length of each conversation of a chat split (its tokens up to and
    including its eos) that fits seq_len; longer ones are left out (not cut), and counted in one line."""
    ends = np.flatnonzero(np.asarray(data) == eos_id) + 1  # one past each conversation's eos
    first = np.concatenate([[0], ends[:-1]])
    spans = np.stack([first, ends - first], 1)
    fits = spans[:, 1] <= seq_len
    if not fits.all():
        print(f"{who}: {int((~fits).sum())} of {len(spans)} {split} conversations are longer than --seq_len "
              f"{seq_len}: left out (not cut)")
    if not fits.any():
        raise SystemExit(f"{who}: no {split} conversation fits --seq_len {seq_len}")
    return spans[fits]


def packed_batch(data, answers, spans, batch_size, seq_len, device="cpu", generator=None, pad_id=0, end_pad=0,
                 end_id=None):
    """batch_size rows of seq_len tokens filled with whole conversations (spans: conversation_spans) drawn at random,
    each put in the first row it fits (first fit: a short one fills an earlier row's gap) until one fits nowhere ->
    x (B, T) (pad_id after a row's last conversation), answers (B, T) bool (the tokens to train on; None: every
    token of a conversation), doc (B, T) long (the conversation's index in its row; -1: a pad) and pos (B, T) (its
    positions, from 0). A fixed number of draws per batch, so the generator advances the same whatever the lengths.
    end_pad N: a conversation whose trained tokens are fewer than N is followed by end_id tokens up to N (as far as
    seq_len allows), trained and read as its own: LLaDA's SFT pads answers with end tokens, so that a masked student
    learns to fill an answer canvas past the answer's end with them."""
    shortest = int(spans[:, 1].min())
    draws = torch.randint(len(spans), (batch_size * (seq_len // shortest) + 1,), generator=generator).tolist()
    x = np.full((batch_size, seq_len), pad_id, dtype=np.int64)
    doc, pos = np.full((batch_size, seq_len), -1, dtype=np.int64), np.zeros((batch_size, seq_len), dtype=np.int64)
    ans = np.zeros((batch_size, seq_len), dtype=bool)
    used, count = [0] * batch_size, [0] * batch_size  # each row's tokens and conversations so far
    for i in draws:
        first, n = spans[i]
        trained = n if answers is None else int(answers[first:first + n].sum())
        m = n + min(max(end_pad - trained, 0), seq_len - n)  # with its end pads
        row = next((r for r in range(batch_size) if used[r] + m <= seq_len), None)
        if row is None:  # the batch is full
            break
        at, k = used[row], count[row]
        x[row, at:at + n] = data[first:first + n]
        ans[row, at:at + n] = True if answers is None else answers[first:first + n]
        if m > n:
            x[row, at + n:at + m], ans[row, at + n:at + m] = end_id, True
        doc[row, at:at + m], pos[row, at:at + m] = k, np.arange(m)
        used[row], count[row] = at + m, k + 1
    return tuple(torch.from_numpy(a).to(device) for a in (x, ans, doc, pos))


# -----------------------------------------------------------------------------
# JSONL inputs of the later scripts

def read_jsonl(path, required_keys=()):
    """All records of a JSONL file as dicts; errors name the file and line. Empty file -> error."""
    records = [rec for _, rec in iter_jsonl(path, tuple(required_keys))]
    if not records:
        raise ValueError(f"{path}: no records")
    return records


def read_prompts(path):
    return read_jsonl(path, ("prompt",))


def tokenized_pairs(path, tok, seq_len, who="dpo"):
    """-> [(prompt ids, chosen ids, rejected ids)]: responses cut to seq_len // 2 tokens, each prompt to its last
    tokens that fit, at least one (it predicts the first response token). A record with "chat": true is a chat turn:
    its prompt one user turn in tok's chat template, each response closed by the turn's end, <|im_end|>."""
    try:
        recs = read_pairs(path)
    except (OSError, ValueError) as e:
        raise SystemExit(f"{who}: {e}")
    out = []
    for k, r in enumerate(recs, 1):
        end = [tok.special_tokens["<|im_end|>"]] if r.get("chat") else []
        yw, yl = ((tok.encode(r[key], allowed_special={EOS}) + end)[:seq_len // 2] for key in ("chosen", "rejected"))
        x = tok.apply_chat_template([dict(role="user", content=r["prompt"])]) if r.get("chat") else tok.encode(
            r["prompt"])
        x = x[-(seq_len - max(len(yw), len(yl))):]
        if not x:
            raise SystemExit(f"{who}: {path}: record {k} has an empty prompt")
        out.append((x, yw, yl))
    return out


def pair_batch(items, device):
    """Chosen rows then rejected rows, right-padded: -> ids (2B, T), prompt_lens (2B,), resp (2B, T) bool (the
    response positions), real (2B, T) bool (not padding)."""
    seqs = [(x, yw) for x, yw, _ in items] + [(x, yl) for x, _, yl in items]
    lens = torch.tensor([len(x) + len(y) for x, y in seqs])
    plen = torch.tensor([len(x) for x, _ in seqs])
    ids = torch.zeros(len(seqs), int(lens.max()), dtype=torch.long)
    for b, (x, y) in enumerate(seqs):
        ids[b, :lens[b]] = torch.tensor(x + y)
    pos = torch.arange(ids.shape[1])
    real = pos < lens[:, None]
    return ids.to(device), plen.to(device), ((pos >= plen[:, None]) & real).to(device), real.to(device)


def rule_score(text):
    """The stdlib world's preference, "prefer single-quoted strings", as a score: (#' − #")/max(1, #' + #"), +1 all
    single quotes, −1 all double, 0 none."""
    s, d = text.count("'"), text.count('"')
    return (s - d) / max(1, s + d)


def make_pairs(texts, n, prompt_chars, response_chars, seed):
    """n {prompt, chosen, rejected} records: windows (prompt = the preceding text, response = the continuation)
    whose response holds >= 2 quotes, drawn with a seeded RNG; chosen: every " made ', rejected: every ' made "."""
    windows = []
    for text in texts:
        for c in range(prompt_chars, len(text) - response_chars + 1, response_chars):
            y = text[c:c + response_chars]
            if y.count("'") + y.count('"') >= 2:
                windows.append((text[c - prompt_chars:c], y))
    picked = random.Random(seed).sample(windows, min(n, len(windows)))
    return [dict(prompt=x, chosen=y.replace('"', "'"), rejected=y.replace("'", '"')) for x, y in picked]


def write_pairs(data_dir, out_dir, *, n_train, n_heldout, prompt_chars, response_chars, seed, who="pairs"):
    """The synthetic preference pairs of a prepared dataset (make_pairs): out_dir/train.jsonl from its train split,
    out_dir/heldout.jsonl from its val split (seed + 1), each written atomically; a one-line exit when none fit."""
    try:
        tok = Tokenizer.from_pretrained(data_dir)
        splits = {s: load_split(data_dir, s) for s in ("train", "val")}
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"{who}: {e}")
    recs = {}
    for split, name, n in (("train", "train.jsonl", n_train), ("val", "heldout.jsonl", n_heldout)):
        texts = [tok.decode(d.tolist()) for d in tqdm(documents(splits[split], tok.eos_id), desc=f"decoding {split}",
                                                       leave=False)]
        recs[name] = make_pairs(texts, n, prompt_chars, response_chars, seed + (split == "val"))
        if not recs[name]:
            raise SystemExit(f"{who}: no window of the {split} split of {data_dir} has >= 2 quotes in its "
                             f"{response_chars}-character continuation; try other --prompt_chars/--response_chars")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)  # only now: a failed run leaves no empty directory behind
    for (name, r), split, n in zip(recs.items(), ("train", "val"), (n_train, n_heldout)):
        atomic_write(out / name, lambda f: Path(f).write_text("".join(json.dumps(x) + "\n" for x in r)))
        print(f"{out / name}: {len(r)} pairs from the {split} split" + f" (asked for {n})" * (len(r) < n))


def add_pairs_command(sub, who):
    """The `pairs` subcommand (write_pairs: the synthetic preference pairs of a dataset) on an argparse subparsers
    object; parse_args() then gives args.fn, which runs it."""
    s = sub.add_parser("pairs", formatter_class=cli.HelpFormatter,
                       help="synthetic preference pairs: prefer single-quoted strings")
    s.add_argument("--data", default="data/stdlib", help="a directory prepared by lib/data.py")
    s.add_argument("--out_dir", default="data/pairs", help="train.jsonl and heldout.jsonl go here")
    for name, default, help in (("n_train", 512, "training pairs"), ("n_heldout", 128, "held-out pairs"),
                                ("prompt_chars", 192, "characters of text before the response"),
                                ("response_chars", 96, "characters of each response"),
                                ("seed", 1337, "which corpus windows are cut")):
        s.add_argument(f"--{name}", type=int, default=default, help=help)

    def run(args):
        if min(args.n_train, args.n_heldout, args.prompt_chars, args.response_chars) <= 0:
            s.error("need --n_train, --n_heldout, --prompt_chars and --response_chars > 0")
        write_pairs(args.data, args.out_dir, n_train=args.n_train, n_heldout=args.n_heldout, who=who,
                    prompt_chars=args.prompt_chars, response_chars=args.response_chars, seed=args.seed)
    s.set_defaults(fn=run)


def prompt_pool(tok, span, *, prompts=None, data_dir=None, seq_len, n, like=None, who="prompts"):
    """[(prompt ids, continuation ids)]: the last seq_len tokens of each record of the JSONL `prompts` (no
    continuation; a record with "chat": true is one user turn in tok's chat template, as in tokenized_pairs), or
    about n windows of seq_len tokens and the span after them, spread over the val documents (whose tokenizer must
    be the model like's); a one-line exit naming `who` for bad input."""
    try:
        if prompts:
            return [((tok.apply_chat_template([{"role": "user", "content": r["prompt"]}]) if r.get("chat") is True
                      else tok.encode(r["prompt"]))[-seq_len:], []) for r in read_prompts(prompts)]
        val, roles = load_splits(data_dir, who, like=like)[1], load_roles(data_dir, "val")
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"{who}: {e}")
    pool = []
    if roles is not None:  # a chat dataset: each assistant turn, with its conversation so far as the prompt
        conv = np.concatenate([[0], np.flatnonzero(np.asarray(val) == tok.eos_id) + 1])  # conversations' starts
        edges = np.flatnonzero(np.diff(np.concatenate([[0], np.asarray(roles, dtype=np.int8), [0]])))
        for a, b in zip(edges[::2].tolist(), edges[1::2].tolist()):  # the turn is val[a:b]
            first = int(conv[np.searchsorted(conv, a, side="right") - 1])
            pool.append((val[max(first, a - seq_len):a].tolist(), val[a:min(b, a + span)].tolist()))
    else:  # windows of plain documents
        for doc in documents(val, tok.eos_id):
            for o in range(0, len(doc) - seq_len, seq_len + span):
                pool.append((doc[o:o + seq_len].tolist(), doc[o + seq_len:o + seq_len + span].tolist()))
    if not pool:
        raise SystemExit(f"{who}: no prompts (the documents are shorter than --seq_len?)")
    return pool[::max(1, len(pool) // n)][:n]  # spread over all documents


def read_pairs(path):
    return read_jsonl(path, ("prompt", "chosen", "rejected"))


# -----------------------------------------------------------------------------

if __name__ == "__main__":
    # run settings (defaults), overridable as --flag value
    out_dir = "data/stdlib"
    source = None        # None: this Python's standard library; or a folder of text files, or a .jsonl
    tokenizer = "bpe"    # "bpe": learnt here on the corpus; "byte"; or a path: a dir with tokenizer.json, a *.tiktoken
    vocab_size = 1024    # ids of the learnt BPE (256 bytes + merges + 3 special tokens)
    val_fraction = 0.05
    max_mb = None        # stop after this many MB of source text
    p = cli.parser(__doc__)
    p.add_argument("--out_dir", default=out_dir, help="train.bin, val.bin, meta.json and the tokenizer go here")
    p.add_argument("--source", default=source,
                   help="folder of text files or .jsonl with a 'text' field (None: the standard library)")
    p.add_argument("--tokenizer", default=tokenizer, help="'bpe', 'byte', or a tokenizer dir / .tiktoken file")
    p.add_argument("--vocab_size", type=int, default=vocab_size, help="with --tokenizer bpe: the number of ids")
    p.add_argument("--val_fraction", type=float, default=val_fraction,
                   help="share of documents in the validation split (by a hash of their name)")
    p.add_argument("--max_mb", type=float, default=max_mb, help="stop after this many MB of source text (None: all)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a dataset in --out_dir that was made with another tokenizer")
    args = p.parse_args()
    if args.source is not None and not os.path.exists(args.source):
        p.error(f"--source {args.source} does not exist")
    if not 259 <= args.vocab_size <= 65536:
        p.error("--vocab_size must be in 259..65536 (the 256 bytes and 3 special tokens at least)")
    try:
        meta = prepare(args.out_dir, args.source, args.tokenizer, args.val_fraction, args.max_mb,
                       vocab_size=args.vocab_size, overwrite=args.overwrite)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"lib/data.py: error: {e}")
    s = meta["splits"]
    print(f"{meta['source']}: {meta['source_mb']} MB, skipped {meta['skipped_binary']} binary "
          f"and {meta['skipped_empty']} empty files")
    for split in s:
        print(f"{split}: {s[split]['documents']:,} documents, {s[split]['tokens']:,} tokens ({meta['dtype']})")
    for why, n in meta["skipped_conversations"].items():
        print(f"skipped {n} conversation(s): {why}")
    print(f"wrote {args.out_dir}/{{train.bin,val.bin,meta.json}}{' + roles' * meta['chat']} + tokenizer")


def unigram_entropy(ids):
    """Entropy (bits) of the token frequencies in ids (a list or an integer array); low for degenerate,
    repetitive text. H = -Σ_v q_v log2 q_v, q_v the frequency of token v."""
    counts = np.bincount(np.asarray(ids, dtype=np.int64).reshape(-1))
    q = counts[counts > 0] / max(1, counts.sum())
    return float(-(q * np.log2(q)).sum())


def load_splits(data_dir, who, *, like=None, seq_len=None):
    """(train, val) token arrays of a prepared dataset, or a one-line exit naming the script and the problem: a
    missing or inconsistent dataset, a split not longer than seq_len (a run's --seq_len), or data tokenized with
    another tokenizer than the model `like` was trained with."""
    try:
        splits = load_split(data_dir, "train"), load_split(data_dir, "val")
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"{who}: {e}")
    for name, split in zip(("train", "val"), splits):
        if seq_len is not None and len(split) <= seq_len:
            raise SystemExit(f"{who}: the {name} split of {data_dir} has {len(split):,} tokens, not more than "
                             f"--seq_len {seq_len}; use a smaller --seq_len (or more data)")
    if like is not None:
        model, model_dir = described(like.config)
        same_tokenizer(fingerprint_of(data_dir), f"{who}: the data {data_dir}", trained_with(like.config), model,
                       prepare_with(model_dir))
    return splits
