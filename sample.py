"""
Samplers for the AR teacher and both kinds of diffusion student, and a CLI that picks one from the
checkpoint's config (attn: causal -> AR, bidirectional -> masked diffusion, block -> block diffusion).

    python sample.py --ckpt out/ar-tiny --prompt "def fib(n):" --max_new_tokens 64
    python sample.py --ckpt out/dlm-tiny --prompt "def fib(n):" --max_new_tokens 64 --block_length 32 --steps 64
    python sample.py --ckpt out/dlm-block --prompt "def fib(n):" --max_new_tokens 64 --threshold 0.9
    python sample.py --ckpt out/dlm-block --prompt "def fib(n):" --show_rounds   # which round committed what
    python sample.py --ckpt out/dlm-tiny --prompt "def fib(n):" --max_new_tokens 256 --cache dual  # Fast-dLLM
    python sample.py --ckpt out/ar-tiny --prompt "def fib(n):" --max_new_tokens 256 --compile
    python sample.py --ckpt DIR --chat          # a multi-turn session in the checkpoint's chat template (chat.py)

Each sampler is one function returning a Generation (tokens, forwards and tokens counted per row); `generate` picks
one by config.attn. What each computes, the caches, the end-token rules, the counts: docs/methods.md §5.
"""
import sys
import time
from dataclasses import dataclass

import torch
import cli
import compiling
from model import Qwen3, attend, left_padded

STOP_EVERY = 32  # AR: how many tokens between the (host-syncing) "every row has produced eos" checks
NEG_INF = float("-inf")


@dataclass
class Generation:
    tokens: torch.Tensor  # (B, P + N): the left-padded prompts, then the generated tokens
    prompt_lens: torch.Tensor  # (B,) real prompt tokens per row: row b's prompt is tokens[b, P - len_b : P]
    start: int  # P, the slot of the first generated token
    nfe: int  # model forwards the batch used (a block ends when its slowest row is done)
    row_nfe: torch.Tensor  # (B,) forwards row b needed, until it was done (see close_answered)
    row_tokens: torch.Tensor  # (B,) tokens row b generated up to and including its first eos (N if none)
    rounds: torch.Tensor | None = None  # (B, N) record=True: the round (0: its block's first) of each commit, or -1

    @property
    def generated(self):  # (B, N)
        return self.tokens[:, self.start:]

    @property
    def tokens_per_forward(self):  # (B,) each row's parallelism, as if it had been decoded alone
        return self.row_tokens / self.row_nfe.clamp(min=1)

    def sequence(self, b):  # row b without its left padding: (len_b + N,)
        return self.tokens[b, self.start - int(self.prompt_lens[b]):]


def throughput(gens, seconds):
    """One run's speed from its Generations (the batches) and the seconds they took in all -> dict:
    tokens_per_forward, the mean over rows of row_tokens / row_nfe (the per-sequence figure papers report),
    with its std, min and max over rows; forwards_per_row, the mean row_nfe; nfe, the batched forwards;
    tokens_per_s, counting each row's tokens up to its first eos; raw_tokens_per_s, every generated slot."""
    tpf = torch.cat([g.tokens_per_forward.double().cpu() for g in gens])  # (rows,)
    return dict(tokens_per_forward=tpf.mean().item(), tokens_per_forward_std=tpf.std(correction=0).item(),
                tokens_per_forward_min=tpf.min().item(), tokens_per_forward_max=tpf.max().item(),
                forwards_per_row=torch.cat([g.row_nfe.double().cpu() for g in gens]).mean().item(),
                nfe=sum(g.nfe for g in gens),
                tokens_per_s=sum(int(g.row_tokens.sum()) for g in gens) / seconds,
                raw_tokens_per_s=sum(g.generated.numel() for g in gens) / seconds)


def forwards_split(gen, block):
    """-> (answer, after), each (B,): a DLM row's forwards split into those that committed a slot of its answer (up to
    and including its first end token: row_tokens) and those that committed only slots after it. gen: a DLM sampler's
    Generation with rounds (record=True); block: its block (block_size, or the masked sampler's block_length). A
    forward is (block, round); every forward a row is charged commits at least one of its slots, so the two add up
    to row_nfe."""
    B, N = gen.rounds.shape
    slot = torch.arange(N, device=gen.rounds.device)
    key = slot // block * block + gen.rounds  # (B, N): the forward that committed each slot
    answer = slot < gen.row_tokens[:, None]

    def forwards(where):  # distinct keys where `where` holds
        hit = torch.zeros(B, N + 1, dtype=torch.bool, device=key.device)
        return hit.scatter_(1, torch.where(where & (gen.rounds >= 0), key, N), True)[:, :N]

    a = forwards(answer)
    return a.sum(1), (forwards(~answer) & ~a).sum(1)


def end_list(eos_id):
    """eos_id as the samplers take it (None, an id, or several) -> a list of ids, [] for None."""
    if eos_id is None:
        return []
    return [eos_id] if isinstance(eos_id, int) else list(eos_id)


def until_end(ids, eos_id):
    """ids (a list) up to, not including, its first end token (eos_id: an id or several, as the samplers take it;
    None: no end, all of ids): the text of a completion."""
    ends = set(end_list(eos_id))
    return next((ids[:i] for i, t in enumerate(ids) if t in ends), ids)


def sample(logits, temperature=0.0, top_k=None, top_p=None, generator=None, ban=None):
    """logits (..., V) -> tokens (...) drawn after temperature, top-k, top-p (argmax when greedy), and their
    confidence: the raw softmax probability (after `ban` (V,), -inf at ids never emitted; before the rest)."""
    if temperature < 0 or (top_k is not None and top_k < 1) or (top_p is not None and not 0 < top_p <= 1):
        raise ValueError(f"temperature must be >= 0, top_k >= 1 and top_p in (0, 1]: {temperature}, {top_k}, {top_p}")
    logits = logits.float() if ban is None else logits.float() + ban
    if temperature == 0:
        tok = logits.argmax(-1)
    else:
        z = logits / temperature
        if top_k is not None:
            kth = z.topk(min(top_k, z.shape[-1]), dim=-1).values[..., -1:]
            z = z.masked_fill(z < kth, NEG_INF)
        if top_p is not None:
            srt, idx = z.sort(-1, descending=True)
            p = srt.softmax(-1)
            drop = p.cumsum(-1) - p > top_p  # outside the smallest set with mass >= top_p (never the top token)
            z = z.masked_fill(drop.scatter(-1, idx, drop), NEG_INF)
        race = torch.empty_like(z).exponential_(generator=generator)
        tok = (z.softmax(-1) / race).argmax(-1)  # distributed as multinomial(softmax(z)), without its host sync
    return tok, logits.softmax(-1).gather(-1, tok[..., None])[..., 0]  # p_raw(tok) = softmax(logits)[tok]


def choose(conf, masked, n=None, threshold=None):
    """conf, masked (B, T) -> (B, T) bool, the masked positions to commit: the n most confident (n a 0-d tensor), or
    every one with confidence >= threshold plus the most confident (Fast-dLLM: at least one)."""
    conf = conf.masked_fill(~masked, NEG_INF)
    rank = conf.argsort(dim=-1, descending=True, stable=True).argsort(-1)  # 0 = the most confident masked position
    return masked & ((rank < n) if threshold is None else (conf >= threshold) | (rank == 0))


def prepare(model, prompt, n_new, pad_id, fill, multiple=1):
    """prompt (B, T) or token lists, left-padded with pad_id to P (a multiple of `multiple`) -> x (B, P + n_new),
    `fill` after the prompts, prompt_lens (B,), P, real (B, P + n_new) bool (not a pad), RoPE positions."""
    dev = model.model.embed_tokens.weight.device
    if torch.is_tensor(prompt) and prompt.dim() != 2:
        raise ValueError(f"a prompt tensor must be (B, T), got {tuple(prompt.shape)}")
    rows = [torch.as_tensor(r, dtype=torch.long).reshape(-1) for r in prompt]
    if not rows or min(len(r) for r in rows) == 0:
        raise ValueError("every prompt needs at least one token")
    longest, limit = max(len(r) for r in rows), model.config.max_position_embeddings
    if longest + n_new > limit:
        raise ValueError(f"a prompt of {longest} tokens + {n_new} new tokens exceeds the model's {limit} positions "
                         "(config.max_position_embeddings); shorten the prompt or generate fewer tokens")
    P = -(-longest // multiple) * multiple
    x = torch.full((len(rows), P + n_new), fill, dtype=torch.long, device=dev)
    x[:, :P] = pad_id
    for b, r in enumerate(rows):
        x[b, P - len(r):P] = r.to(dev)
    lens = torch.tensor([len(r) for r in rows], device=dev)
    return x, lens, P, *left_padded(lens, P, P + n_new)


def sampling_args(model, mask_token_id, vocab_limit, generator, eos_id, pad_id, eos_rule="free", eos_penalty=0.0):
    """-> ban (V,) (-inf at the mask token and ids >= vocab_limit; -eos_penalty at the end ids under eos_rule
    "penalty"), the generator (fresh when None), the pad id (default the first end id, else 0) and the end ids (E,)
    of eos_id (an id or several), or None."""
    cli.check_eos_rule(eos_rule, eos_penalty)
    dev = model.model.embed_tokens.weight.device
    ban = torch.zeros(model.config.vocab_size, device=dev)
    if mask_token_id is not None:
        ban[mask_token_id] = NEG_INF
    if vocab_limit is not None:
        ban[vocab_limit:] = NEG_INF
    if generator is None:
        generator = torch.Generator(dev)
        generator.seed()  # fresh randomness, never the global RNG; pass a seeded generator to reproduce
    ids = end_list(eos_id)
    if eos_id is not None and not (ids and all(isinstance(i, int) for i in ids)):
        raise ValueError(f"eos_id must be an int or a non-empty list/tuple of ints, got {eos_id!r}")
    ban[ids] -= eos_penalty * (eos_rule == "penalty")  # Dream's eos_penalty, off the end tokens' logits
    pad_id = (ids[0] if ids else 0) if pad_id is None else pad_id
    return ban, generator, pad_id, torch.tensor(ids, device=dev) if ids else None


def dlm_fields(model, mask_token_id, shift):
    c = model.config
    mask_id, shift = c.mask_token_id if mask_token_id is None else mask_token_id, c.shift if shift is None else shift
    if mask_id is None or shift is None:
        raise ValueError("a diffusion sampler needs mask_token_id and shift (from the checkpoint's config: "
                         "convert.py writes them, or pass them)")
    return mask_id, int(shift)


def finish(x, lens, P, nfe, row_nfe, eos, rounds=None):
    """The Generation: each row's slots after its first end token (of eos (E,)) become it, in place; its tokens
    up to and including it are counted (all N without one)."""
    N = x.shape[1] - P
    row_tokens = torch.full_like(row_nfe, N)
    if eos is not None:
        x[:, P:] = close_answered(x[:, P:], -1, eos)  # nothing is masked (-1) by now
        hit = torch.isin(x[:, P:], eos)  # (B, N)
        row_tokens = torch.where(hit.any(1), hit.int().argmax(1) + 1, N)
    return Generation(x, lens, P, nfe, row_nfe, row_tokens, rounds)


def close_answered(y, mask_id, eos):
    """y (B, T), the slots from the current block's on -> y with each row whose first slot that is masked or an end
    token (of eos (E,)) is an end token closed: its answer is complete, its later slots become that token."""
    end = torch.isin(y, eos)  # (B, T)
    first = (end | (y == mask_id)).int().argmax(1, keepdim=True)  # (B, 1): the first slot not yet a real token
    after = torch.arange(y.shape[1], device=y.device) > first  # (B, T)
    return torch.where(end.gather(1, first) & after, y.gather(1, first), y)


def forward(model, x, q, pos, real, rule, cache=None, block_size=None):
    """One model call: x (B, T) at slots q (T,), RoPE positions pos, attending under `rule` to key slots 0..S-1
    (the cache's, written at q first; or x itself), pads (real (B, S) False) hidden -> logits (B, T, V)."""
    mask = attend(rule, q, real, block_size)  # (B, 1, T, S)
    return model(x, attn=mask, pos=pos, cache=cache, slots=None if cache is None else q)


@torch.no_grad()
def ar_generate(model, prompt, max_new_tokens, temperature=0.0, top_k=None, top_p=None, eos_id=None, pad_id=None,
                generator=None, mask_token_id=None, vocab_limit=None, use_cache=True, *, compile=False):
    """Causal decoding (greedy when temperature == 0) with a static KV cache; rows that produced an end token
    (eos_id: an id or several) emit pad_id (default the first end id) from then on. use_cache=False recomputes
    the whole sequence per token (reference). compile: the one-token steps through torch.compile (compiling.stepper);
    the prompt's forward stays eager."""
    mask_id = model.config.mask_token_id if mask_token_id is None else mask_token_id
    ban, generator, pad_id, eos = sampling_args(model, mask_id, vocab_limit, generator, eos_id, pad_id)
    x, lens, P, real, pos = prepare(model, prompt, max_new_tokens, pad_id, pad_id)
    B, L = x.shape
    slots = torch.arange(L, device=x.device)
    step = compiling.stepper(forward, model, compile)
    cache = compiling.static_cache(model.new_cache(B, L), compile) if use_cache else None  # keys/values by slot
    done = torch.zeros(B, dtype=torch.bool, device=x.device)
    row_nfe = torch.zeros(B, dtype=torch.long, device=x.device)
    nfe = 0
    for t in range(P, L):  # t: the slot being generated
        if not use_cache:
            logits = step(model, x[:, :t], slots[:t], pos[:, :t], real[:, :t], "causal")  # (B, t, V)
        elif t == P:  # the prompt enters the cache
            logits = forward(model, x[:, :t], slots[:t], pos[:, :t], real, "causal", cache)  # (B, P, V)
        else:  # the cache holds slots < t-1: feed the newest token alone, every step the same shapes
            logits = step(model, x[:, t - 1:t], slots[t - 1:t], pos[:, t - 1:t], real, "causal", cache)  # (B, 1, V)
        nfe += 1
        row_nfe += ~done  # a forward counts for the rows still generating
        tok, _ = sample(logits[:, -1], temperature, top_k, top_p, generator, ban)  # (B,)
        x[:, t] = torch.where(done, pad_id, tok)
        if eos is not None:
            done |= torch.isin(tok, eos)
            if (t - P) % STOP_EVERY == STOP_EVERY - 1 and done.all():  # a host sync, once per STOP_EVERY
                break
    return finish(x, lens, P, nfe, row_nfe, eos)


CACHES = ("none", "prefix", "dual")


@torch.no_grad()
def diffusion_generate(model, prompt, gen_length, block_length, steps, temperature=0.0, top_k=None, top_p=None,
                       remasking="low_confidence", threshold=None, eos_id=None, pad_id=None, generator=None,
                       mask_token_id=None, shift=None, vocab_limit=None, *, cache="none", finish_block=False,
                       eos_rule="free", eos_penalty=0.0, record=False, compile=False):
    """LLaDA: the response starts fully masked and is denoised block by block (block_length), `steps` spread
    evenly over the blocks; each step commits the most confident predictions of the current block
    ("low_confidence") or random ones ("random"). With `threshold` (Fast-dLLM), each step instead commits
    every prediction with confidence >= threshold, plus the most confident, until the block is done (`steps`
    unused; threshold <= 0 commits a whole block per forward, > 1 one token per forward). Confidence: the
    raw softmax probability of the chosen token (see `sample`).

    cache: "none" (every step a full forward: exact, LLaDA), "prefix" or "dual" (Fast-dLLM's approximate cache,
    as many forwards: each block's first step writes every slot's keys/values, its later steps feed the block and
    what follows it, or the block alone; approximate because a cached slot's keys would change as the block is
    decided). A row is done, and charged no more forwards, once its first end token is committed with nothing
    before it masked (finish_block: once the block holding it is done, as samplers that finish every block do;
    the same tokens up to the end token, more forwards). eos_rule: "free" (end tokens compete as any other),
    "last" (an end token is committed only where no slot before it is masked: LLaDA's rule, its confidence -inf
    until then), "penalty" (eos_penalty off the end tokens' logits before choosing: Dream's). record:
    Generation.rounds, the step of its block that committed each slot. compile: every forward through
    torch.compile."""
    mask_id, shift = dlm_fields(model, mask_token_id, shift)
    if remasking not in ("low_confidence", "random"):
        raise ValueError(f"remasking must be 'low_confidence' or 'random', got {remasking!r}")
    if cache not in CACHES:
        raise ValueError(f"cache must be one of {', '.join(CACHES)}, got {cache!r}")
    if gen_length % block_length:
        raise ValueError(f"gen_length {gen_length} is not a multiple of block_length {block_length}")
    n_blocks = gen_length // block_length
    if threshold is None and (steps % n_blocks or steps < n_blocks):
        raise ValueError(f"steps {steps} must be a positive multiple of the number of blocks {n_blocks}")
    if threshold is not None and remasking != "low_confidence":
        raise ValueError("threshold decoding needs remasking='low_confidence'")
    ban, generator, pad_id, eos = sampling_args(model, mask_id, vocab_limit, generator, eos_id, pad_id, eos_rule,
                                                eos_penalty)
    x, lens, P, real, pos = prepare(model, prompt, gen_length, pad_id, mask_id)
    B, L = x.shape
    slots = torch.arange(L, device=x.device)
    step = compiling.stepper(forward, model, compile)
    kv = None if cache == "none" else compiling.static_cache(model.new_cache(B, L), compile)
    rounds = torch.full((B, gen_length), -1, dtype=torch.long, device=x.device) if record else None
    # LLaDA's schedule: a block's block_length tokens over its steps, evenly, the remainder first. (spb,)
    spb = block_length if threshold is not None else steps // n_blocks
    n_commit = block_length // spb + (torch.arange(spb, device=x.device) < block_length % spb).long()
    row_nfe = torch.zeros(B, dtype=torch.long, device=x.device)
    nfe = 0
    for b in range(n_blocks):
        s, e = P + b * block_length, P + (b + 1) * block_length  # the block's slots
        a, z = s - shift, e if cache == "dual" else L  # the slots a cached step feeds: its first predicts s
        for i in range(block_length):  # spb steps, unless rule "last" held end tokens back: then until done
            masked = x[:, s:e] == mask_id  # (B, block_length)
            if cache == "none" or i == 0:  # a full forward (with a cache: the refresh, every slot written)
                logits = step(model, x, slots, pos, real, "bidirectional", kv)[:, a:e - shift]  # (B, bl, V)
            else:  # the cached slots before a (and, dual, from e on) are as the block's first step left them
                logits = step(model, x[:, a:z], slots[a:z], pos[:, a:z], real, "bidirectional", kv)[:, :e - s]
            nfe += 1
            row_nfe += masked.any(1)  # a row whose block is done (or which is done) waits uncharged
            tok, conf = sample(logits, temperature, top_k, top_p, generator, ban)
            if remasking == "random":
                conf = torch.rand(conf.shape, generator=generator, device=x.device)
            if eos_rule == "last" and eos is not None:  # no end token where a slot before it is still masked
                masked = masked & ~(torch.isin(tok, eos) & (masked.cumsum(1) > masked.long()))
            commit = choose(conf, masked, n_commit[min(i, spb - 1)], threshold)
            x[:, s:e] = torch.where(commit, tok, x[:, s:e])
            if record:
                rounds[:, s - P:e - P] = torch.where(commit, i, rounds[:, s - P:e - P])
            if eos is not None and not finish_block:
                x[:, s:] = close_answered(x[:, s:], mask_id, eos)
            if not (x[:, s:e] == mask_id).any():  # block done (for every row): a host sync per forward
                break
        if eos is not None:
            x[:, s:] = close_answered(x[:, s:], mask_id, eos)
            if not (x[:, e:] == mask_id).any():  # every row is done: a host sync per block
                break
    return finish(x, lens, P, nfe, row_nfe, eos, rounds)


@torch.no_grad()
def block_generate(model, prompt, gen_length, block_size=None, threshold=0.9, temperature=0.0, top_k=None,
                   top_p=None, use_cache=True, record=False, eos_id=None, pad_id=None, generator=None,
                   mask_token_id=None, shift=None, vocab_limit=None, *, finish_block=False, eos_rule="free",
                   eos_penalty=0.0, compile=False):
    """Block diffusion: blocks of block_size denoised in turn, each round committing every prediction with
    confidence >= threshold plus the most confident (`choose`), finished blocks entering the KV cache once
    (use_cache=False: the slow reference). record: Generation.rounds; the rest as in diffusion_generate."""
    mask_id, shift = dlm_fields(model, mask_token_id, shift)
    bs = block_size or model.config.block_size
    if not bs or gen_length % bs or threshold is None:
        raise ValueError(f"gen_length {gen_length} must be a multiple of the block size {bs} (argument or "
                         f"config.block_size), and a threshold set")
    ban, generator, pad_id, eos = sampling_args(model, mask_id, vocab_limit, generator, eos_id, pad_id, eos_rule,
                                                eos_penalty)
    # the prompt left-padded to P, a multiple of bs: the block rule (slot // bs) holds in slot coordinates
    x, lens, P, real, pos = prepare(model, prompt, gen_length, pad_id, mask_id, multiple=bs)
    B, L = x.shape
    slots = torch.arange(L, device=x.device)
    step = compiling.stepper(forward, model, compile)
    cache = compiling.static_cache(model.new_cache(B, L), compile) if use_cache else None
    rounds = torch.full((B, gen_length), -1, dtype=torch.long, device=x.device) if record else None
    row_nfe, nfe, edge = torch.zeros(B, dtype=torch.long, device=x.device), 0, None  # edge: slot s-1's logits
    for b in range(gen_length // bs):
        s, e = P + b * bs, P + (b + 1) * bs  # the block's slots
        for r in range(bs):  # every round commits at least one token of each row not done
            # the first slot fed: with the cache, round 0 feeds the previous block (b = 0: the prompt), now final,
            # with the masked block, so that it enters the cache once; later rounds the block alone
            a = 0 if not use_cache or (b == 0 and r == 0) else s - bs if r == 0 else s
            keys = real if use_cache else real[:, :e]  # (B, L or e)
            fn = forward if use_cache and a == 0 else step  # the prompt's forward (its length varies) eager
            logits = fn(model, x[:, a:e], slots[a:e], pos[:, a:e], keys, "block", cache, bs)  # (B, e-a, V)
            nfe += 1
            masked = x[:, s:e] == mask_id  # (B, bs)
            row_nfe += masked.any(1)  # a row whose block is done (or which is done) waits uncharged
            if shift and a == s:  # slot s-1 (the previous block's last token) is not in this forward: its
                # logits are round 0's, unchanged since then because slot s-1 cannot see block b
                logits = torch.cat([edge, logits[:, :-1]], 1)
            else:  # slot s-1's logits (B, 1, V), kept (a copy: a compiled step may reuse its output's memory)
                edge = logits[:, s - a - 1:s - a].clone()
                logits = logits[:, s - a - shift:e - a - shift]  # (B, bs, V): the predictions for slots s..e-1
            tok, conf = sample(logits, temperature, top_k, top_p, generator, ban)
            if eos_rule == "last" and eos is not None:  # no end token where a slot before it is still masked
                masked = masked & ~(torch.isin(tok, eos) & (masked.cumsum(1) > masked.long()))
            commit = choose(conf, masked, threshold=threshold)
            x[:, s:e] = torch.where(commit, tok, x[:, s:e])
            if record:
                rounds[:, s - P:e - P] = torch.where(commit, r, rounds[:, s - P:e - P])
            if eos is not None and not finish_block:
                x[:, s:] = close_answered(x[:, s:], mask_id, eos)
            if not (x[:, s:e] == mask_id).any():  # block done: a host sync per forward
                break
        if eos is not None:
            x[:, s:] = close_answered(x[:, s:], mask_id, eos)
            if not (x[:, e:] == mask_id).any():  # every row is done: a host sync per block
                break
    return finish(x, lens, P, nfe, row_nfe, eos, rounds)


SAMPLERS = {"causal": "AR", "bidirectional": "masked diffusion", "block": "block diffusion"}


def generate(model, prompt, max_new_tokens, *, temperature=0.0, top_k=None, top_p=None, eos_id=None, generator=None,
             vocab_limit=None, shift=None, block_length=None, steps=None, remasking="low_confidence", threshold=None,
             block_size=None, use_cache=True, cache="none", finish_block=False, eos_rule="free", eos_penalty=0.0,
             record=False, compile=False):
    """The checkpoint's own sampler, picked by model.config.attn (sample.py's CLI and eval.py both use this):
    "causal" -> ar_generate (max_new_tokens at most); "bidirectional" -> diffusion_generate (block_length
    default min(32, N), steps default N: one token a step; threshold: Fast-dLLM; cache: "none" | "prefix" |
    "dual"); "block" -> block_generate (threshold default 0.9); record (DLMs: Generation.rounds), finish_block,
    eos_rule and eos_penalty (DLMs): see diffusion_generate. compile: every sampler's steps through torch.compile.
    Raises ValueError for an argument that sampler would ignore (a threshold for an AR model, ...), a threshold
    outside (0, 1], an unknown eos_rule or a negative eos_penalty.
    The arguments every sampler shares: `prompt`, a (B, T) LongTensor or a list of token lists (ragged: left-padded
    with pad_id, default the first end id, else 0); temperature (0: greedy), top_k, top_p; eos_id (an id, or several:
    a row stops at the first of any, and its later slots repeat it); generator (a torch.Generator on the model's
    device; default: freshly seeded); mask_token_id and shift (default: the model's config); vocab_limit (ids >= it
    are never emitted: the CLI passes the tokenizer's size, so unused embedding rows never come out)."""
    kind, N = model.config.attn, max_new_tokens
    if kind not in SAMPLERS:
        raise ValueError(f"config.attn {kind!r} has no sampler (one of {', '.join(SAMPLERS)})")
    given = dict(threshold=threshold is not None, block_length=block_length is not None, steps=steps is not None,
                 remasking=remasking != "low_confidence", block_size=block_size is not None, shift=shift is not None,
                 no_cache=not use_cache, cache=cache != "none", record=record, finish_block=finish_block,
                 eos_rule=eos_rule != "free")
    dlm = {"shift", "record", "finish_block", "eos_rule"}
    uses = {"causal": {"no_cache"}, "block": {"threshold", "block_size", "no_cache", *dlm},
            "bidirectional": {"threshold", "block_length", "steps", "remasking", "cache", *dlm}}[kind]
    if unused := [k for k, v in given.items() if v and k not in uses]:
        raise ValueError(f"{', '.join(unused)}: not used by the {SAMPLERS[kind]} sampler (config.attn {kind!r}); "
                         "drop it")
    if threshold is not None and not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    common = dict(temperature=temperature, top_k=top_k, top_p=top_p, eos_id=eos_id, generator=generator,
                  vocab_limit=vocab_limit, compile=compile)
    if kind == "causal":
        return ar_generate(model, prompt, N, use_cache=use_cache, **common)
    common.update(shift=shift, record=record, finish_block=finish_block, eos_rule=eos_rule, eos_penalty=eos_penalty)
    if kind == "bidirectional":
        return diffusion_generate(model, prompt, N, block_length or min(32, N), steps or N, remasking=remasking,
                                  threshold=threshold, cache=cache, **common)
    return block_generate(model, prompt, N, block_size, 0.9 if threshold is None else threshold, use_cache=use_cache,
                          **common)


# ---- CLI -----------------------------------------------------------------------------------------

def main():
    import chat
    from tokenizer import load_tokenizer
    p = cli.parser(__doc__)
    p.add_argument("--ckpt", required=True, help="a Qwen3 checkpoint directory; its config.attn picks the sampler")
    p.add_argument("--prompt", default=None, help="the text to continue (encoded with the checkpoint's tokenizer); "
                   "default 'def ', with --chat: an interactive session")
    p.add_argument("--num_samples", type=int, default=1, help="rows of one batch, all from --prompt")
    p.add_argument("--data", default=None, help="a data.py directory: one prompt per row instead, the first "
                   "--num_samples validation documents from their first def (32 tokens)")
    p.add_argument("--max_new_tokens", type=int, default=64, help="AR: at most; DLMs: the generation length")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top_k", type=int, default=None, help="sample among the k most likely tokens only")
    p.add_argument("--top_p", type=float, default=None, help="sample within the smallest set of mass >= p only")
    p.add_argument("--block_length", type=int, default=None, help="diffusion: semi-AR block (default min(32, N))")
    p.add_argument("--steps", type=int, default=None, help="diffusion: steps in all (default N, one token a step)")
    p.add_argument("--remasking", default="low_confidence", choices=["low_confidence", "random"], help="diffusion")
    p.add_argument("--threshold", type=float, default=None, help="in (0, 1]: commit every token whose raw "
                   "probability reaches it; diffusion: Fast-dLLM parallel decoding (default off); block: default 0.9")
    p.add_argument("--block_size", type=int, default=None, help="block: default the checkpoint's")
    p.add_argument("--no_cache", action="store_true", help="AR, block: recompute everything each step (reference)")
    p.add_argument("--cache", default="none", choices=CACHES, help="diffusion: Fast-dLLM's approximate KV cache, "
                   "refreshed once per block: prefix (the slots before the block), dual (and after it)")
    p.add_argument("--shift", choices=["true", "false"], default=None, help="DLMs: override config.shift")
    p.add_argument("--finish_block", action="store_true", help="DLMs: a row is done once the block holding its end "
                   "token is, not at that token (its forwards counted until then)")
    cli.eos_args(p)
    p.add_argument("--show_rounds", action="store_true",
                   help="block: mark each generated token with the round that committed it (colours on a terminal)")
    p.add_argument("--ignore_eos", action="store_true", help="do not stop at the checkpoint's end ids")
    p.add_argument("--chat", action="store_true", help="the checkpoint's chat template: --prompt as one user turn, or "
                   "without --prompt a multi-turn session (Ctrl-C ends a turn, Ctrl-D the session)")
    p.add_argument("--seed", type=int, default=1337, help="seeds the sampler's generator (runs repeat exactly)")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--compile", action="store_true", help="the sampler's steps through torch.compile (CUDA: with "
                   "CUDA graphs); the first steps of each shape include compiling")
    args = p.parse_args()
    if args.num_samples < 1 or args.max_new_tokens < 1:
        p.error("--num_samples and --max_new_tokens must be positive")
    device, _ = cli.setup(args.device, args.seed)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        model = Qwen3.from_pretrained(args.ckpt, device=device, dtype=dtype).eval()
        tok = load_tokenizer(args.ckpt, model.config)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"sample: {e}")
    eos_id = None if args.ignore_eos else tok.end_ids(model.config)  # every end id the checkpoint declares
    kw = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
              generator=torch.Generator(device).manual_seed(args.seed), vocab_limit=tok.vocab_size,
              shift=None if args.shift is None else args.shift == "true", block_length=args.block_length,
              steps=args.steps, remasking=args.remasking, threshold=args.threshold, block_size=args.block_size,
              use_cache=not args.no_cache, cache=args.cache, finish_block=args.finish_block, compile=args.compile,
              eos_rule=args.eos_rule, eos_penalty=args.eos_penalty)
    if args.chat and args.prompt is None:
        def answer(ids, ends):  # the reply up to its end token, and (block) the round of each token
            gen = generate(model, [ids], args.max_new_tokens, eos_id=ends,
                           **(kw | dict(record=model.config.attn == "block")))
            reply = until_end(gen.generated[0].tolist(), ends)
            return reply, None if gen.rounds is None else gen.rounds[0, :len(reply)].tolist()
        return chat.session(model, tok, args.max_new_tokens, answer, args.block_size)
    prompt = "def " if args.prompt is None else args.prompt
    try:
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}]) if args.chat else tok.encode(prompt)
    except ValueError as e:  # no template, or one that does not render
        raise SystemExit(f"sample: --chat: {e}")
    if not ids:
        raise SystemExit("sample: --prompt encodes to no tokens")
    rows = [ids] * args.num_samples
    if args.data:
        import data
        val = data.load_splits(args.data, "sample: --data", like=model)[1]
        rows = data.code_prompts(val, tok, args.num_samples, 32)
    if args.show_rounds and model.config.attn != "block":
        raise SystemExit(f"sample: --show_rounds needs a block-diffusion checkpoint (config.attn 'block'), "
                         f"{args.ckpt} has {model.config.attn!r}")
    prompt = rows if args.data else torch.tensor(rows, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    try:
        gen = generate(model, prompt, args.max_new_tokens, eos_id=eos_id, record=args.show_rounds, **kw)
    except ValueError as e:
        raise SystemExit(f"sample: {e}")
    sync()
    dt = time.perf_counter() - t0
    for b, ids in enumerate(rows):
        n = int(gen.row_tokens[b])  # the sample up to its first eos
        seq = gen.sequence(b)[:len(ids) + n].tolist()
        print(f"--- prompt: {tok.decode(ids)!r}" if args.data else f"--- sample {b}")
        if args.show_rounds:
            rounds = [-1] * len(ids) + gen.rounds[b, :n].tolist()
            print(chat.show_rounds(chat.token_pieces(tok, seq), rounds, colour=sys.stdout.isatty()))
        else:
            print(tok.decode(seq))
    if args.show_rounds:
        print("(under each generated character: the round of its block that committed it, 0 = the block's first "
              "forward)")
    s = throughput([gen], dt)
    print(f"{SAMPLERS[model.config.attn]}: {len(rows)} x {args.max_new_tokens} tokens in {dt:.2f} s; per row "
          f"{s['tokens_per_forward']:.2f} tokens per forward (min {s['tokens_per_forward_min']:.2f}, max "
          f"{s['tokens_per_forward_max']:.2f}; {s['forwards_per_row']:.1f} forwards a row); "
          f"{s['tokens_per_s']:.1f} tokens/s up to eos, {s['raw_tokens_per_s']:.1f} raw ({gen.nfe} batched forwards)")


if __name__ == "__main__":
    main()
