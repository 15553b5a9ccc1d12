"""
Corpus preparation: a text source in (this Python's standard library, a folder of text files, or a JSONL of
{"text"} or {"messages"} records), flat token files out (train.bin, val.bin, meta.json, the tokenizer; a chat
source also the assistant marks), split by a stable hash of each document's name; a BPE learnt on the corpus when
no tokenizer is given (train_bpe). The readers the training scripts use are lib/data.py. Notes on the design:
docs/methods.md, "lib/corpus.py" under §8.

    python -m lib.corpus --out_dir data/stdlib                        # this Python's standard library
    python -m lib.corpus --out_dir data/mine --source notes/ --tokenizer path/to/Qwen3-0.6B
    python -m lib.corpus --out_dir data/chat --source chats.jsonl --tokenizer path/to/Qwen3-0.6B   # {"messages"}
"""
import collections
import json
import os
import platform
import re
import sys
import sysconfig
from pathlib import Path

import numpy as np
from tqdm import tqdm

from lib import cli
from lib.cli import atomic_write
from lib.data import is_val, iter_jsonl
from lib.tokenizer import CODE_PATTERN, EOS, Tokenizer, fingerprint_of

STDLIB_SKIP = {"site-packages", "test", "tests", "idlelib", "__pycache__"}  # dirs left out of the default corpus


# -----------------------------------------------------------------------------
# reading sources

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
# a BPE learnt on the corpus

def train_bpe(texts, vocab_size, name="bpe"):
    """Byte-level BPE learnt from texts: the 256 bytes, then the most frequent adjacent pair merged
    into a new token, again and again, within the pieces CODE_PATTERN cuts, until vocab_size ids
    (with the three special tokens of Tokenizer.byte_level() last). Pair counts are updated only for the
    words a merge touches, so the standard library trains in well under a minute."""
    words = collections.Counter(p for t in texts for p in re.findall(CODE_PATTERN, t))
    seqs = [[bytes([b]) for b in w.encode("utf-8")] for w in words]  # each distinct piece as tokens
    freq = list(words.values())
    pairs, where = collections.Counter(), collections.defaultdict(set)  # pair -> count, -> word indices
    for i, s in enumerate(seqs):
        for pair in zip(s, s[1:]):
            pairs[pair] += freq[i]
            where[pair].add(i)
    ranks = {bytes([b]): b for b in range(256)}
    while len(ranks) < vocab_size - 3 and pairs:
        (a, b), n = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))  # most frequent; ties by bytes
        if n < 2:
            break
        ranks.setdefault(a + b, len(ranks))
        for i in where.pop((a, b)):
            s, f = seqs[i], freq[i]
            for pair in zip(s, s[1:]):
                pairs[pair] -= f
            j, new = 0, []
            while j < len(s):
                if s[j] == a and j + 1 < len(s) and s[j + 1] == b:
                    new.append(a + b)
                    j += 2
                else:
                    new.append(s[j])
                    j += 1
            seqs[i] = new
            for pair in zip(new, new[1:]):
                pairs[pair] += f
                where[pair].add(i)
        del pairs[(a, b)]
    n = len(ranks)
    added = {EOS: (n, True), "<|im_start|>": (n + 1, True), "<|im_end|>": (n + 2, True)}
    return Tokenizer(name, ranks, CODE_PATTERN, added, nfc=False)


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
        sys.exit(f"lib.corpus: error: {e}")
    s = meta["splits"]
    print(f"{meta['source']}: {meta['source_mb']} MB, skipped {meta['skipped_binary']} binary "
          f"and {meta['skipped_empty']} empty files")
    for split in s:
        print(f"{split}: {s[split]['documents']:,} documents, {s[split]['tokens']:,} tokens ({meta['dtype']})")
    for why, n in meta["skipped_conversations"].items():
        print(f"skipped {n} conversation(s): {why}")
    print(f"wrote {args.out_dir}/{{train.bin,val.bin,meta.json}}{' + roles' * meta['chat']} + tokenizer")
