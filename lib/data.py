"""
Data: the readers the training scripts use, of the token files lib/corpus.py prepares (python -m lib.corpus): the
splits, batches of windows or of packed conversations, the answer-only targets, JSONL prompts and preference pairs
(the standard library's own pairs: worlds/stdlib.py).

Notes on the design: docs/methods.md, "lib/data.py" under §8.
"""
import json
import os
import zlib

import numpy as np
import torch

from lib.checkpoint import described, prepare_with, same_tokenizer, trained_with
from lib.tokenizer import EOS, fingerprint_of


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


def is_val(name, val_fraction):
    """The split rule: a stable hash of the document's name, independent of order and machine."""
    return zlib.crc32(name.encode("utf-8")) % 10000 < val_fraction * 10000


# -----------------------------------------------------------------------------
# loading and batching

def load_split(data_dir, split):
    """The split's tokens as a read-only np.memmap (dtype from meta.json)."""
    meta_path, bin_path = os.path.join(data_dir, "meta.json"), os.path.join(data_dir, f"{split}.bin")
    for p in (meta_path, bin_path):
        if not os.path.exists(p):
            raise FileNotFoundError(f"{data_dir} is not a prepared dataset: missing {os.path.basename(p)}. "
                                    f"Make one with: python -m lib.corpus --out_dir {data_dir}")
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
                         "python -m lib.corpus --source CONVERSATIONS.jsonl --tokenizer CHECKPOINT --out_dir DIR")
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


def response_batch(items, device):
    """(prompt ids, answer ids) pairs, right-padded: -> ids (B, T), prompt_lens (B,), resp (B, T) bool (the answer
    positions), real (B, T) bool (not padding)."""
    lens = torch.tensor([len(x) + len(y) for x, y in items])
    plen = torch.tensor([len(x) for x, _ in items])
    ids = torch.zeros(len(items), int(lens.max()), dtype=torch.long)
    for b, (x, y) in enumerate(items):
        ids[b, :lens[b]] = torch.tensor(x + y)
    pos = torch.arange(ids.shape[1])
    real = pos < lens[:, None]
    return ids.to(device), plen.to(device), ((pos >= plen[:, None]) & real).to(device), real.to(device)


def pair_batch(items, device):
    """(prompt, chosen, rejected) triples as response_batch's rows: the B chosen rows, then the B rejected ones."""
    return response_batch([(x, yw) for x, yw, _ in items] + [(x, yl) for x, _, yl in items], device)


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
