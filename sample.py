"""
The samplers: ar_generate (the AR teacher), diffusion_generate (LLaDA, with Fast-dLLM's threshold and caches) and
block_generate (block diffusion), each one function returning a Generation (tokens, forwards and tokens counted per
row); `generate` picks one by the checkpoint's config.attn. What each computes: docs/methods.md §5.

    python sample.py --ckpt out/ar-tiny --prompt "def fib(n):" --max_new_tokens 64
    python sample.py --ckpt out/dlm-block --prompt "def fib(n):" --show_rounds   # which round committed what
    python sample.py --ckpt DIR --chat          # a multi-turn session in the checkpoint's chat template (lib/chat.py)
"""
import os
import time
from dataclasses import dataclass

import torch
from model import Qwen3, attend, canvas
from lib import chat
from lib import cli
from lib import compiling

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


def end_list(eos_id):
    """eos_id as the samplers take it (None, an id, or several) -> a list of ids, [] for None."""
    return [] if eos_id is None else [eos_id] if isinstance(eos_id, int) else list(eos_id)


def until_end(ids, eos_id):
    """ids (a list) up to, not including, its first end token (eos_id: an id or several, as the samplers take it;
    None: no end, all of ids): the text of a completion."""
    ends = set(end_list(eos_id))
    return next((ids[:i] for i, t in enumerate(ids) if t in ends), ids)


def penalize(logits, seen, penalty):
    """transformers' repetition penalty: logits (B, V) or (B, T, V), seen (B, V) (> 0 where row b has the id in its
    prompt or its text so far) -> the logits with each seen id's divided by `penalty` where positive, multiplied
    where negative (so penalty > 1 makes a repeat less likely either way)."""
    hit = (seen > 0).view(seen.shape[0], *[1] * (logits.dim() - 2), seen.shape[-1])  # (B, 1.., V)
    return torch.where(hit, torch.where(logits < 0, logits * penalty, logits / penalty), logits)


def seen_ids(x, keep, vocab_size):
    """x (B, T) ids, keep (B, T) bool -> (B, V) float: how often row b holds each id at a kept slot."""
    return x.new_zeros(x.shape[0], vocab_size, dtype=torch.float).scatter_add_(1, x, keep.float())


def filtered(logits, temperature, top_k=None, top_p=None, min_p=None):
    """The sampling distribution's logits (..., V): divided by temperature (> 0), then -inf outside the top_k,
    outside the smallest set of mass >= top_p, and where the probability is below min_p times the top one, in
    transformers' order (temperature, top-k, top-p, min-p); the top token always stays."""
    z = logits / temperature
    if top_k is not None:
        kth = z.topk(min(top_k, z.shape[-1]), dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, NEG_INF)
    if top_p is not None:
        srt, idx = z.sort(-1, descending=True)
        p = srt.softmax(-1)
        drop = p.cumsum(-1) - p > top_p  # outside the smallest set with mass >= top_p (never the top token)
        z = z.masked_fill(drop.scatter(-1, idx, drop), NEG_INF)
    if min_p is not None:
        p = z.softmax(-1)
        z = z.masked_fill(p < min_p * p.amax(-1, keepdim=True), NEG_INF)  # min-p: relative to the top token's
    return z


def sample(logits, temperature=0.0, top_k=None, top_p=None, generator=None, ban=None, *, min_p=None,
           repetition_penalty=1.0, seen=None):
    """logits (..., V) -> tokens (...) drawn after the repetition penalty (with seen (B, V): `penalize`),
    temperature, top-k, top-p and min-p (`filtered`; argmax when greedy), and their confidence: the softmax
    probability after `ban` (V,) (-inf at ids never emitted) and the penalty, before the rest."""
    cli.check_sampling(temperature, top_k, top_p, min_p, repetition_penalty)
    logits = logits.float() if ban is None else logits.float() + ban
    if repetition_penalty != 1.0:
        logits = penalize(logits, seen, repetition_penalty)
    if temperature == 0:
        tok = logits.argmax(-1)
    else:
        z = filtered(logits, temperature, top_k, top_p, min_p)
        race = torch.empty_like(z).exponential_(generator=generator)
        tok = (z.softmax(-1) / race).argmax(-1)  # distributed as multinomial(softmax(z)), without its host sync
    return tok, logits.softmax(-1).gather(-1, tok[..., None])[..., 0]  # p(tok) = softmax(penalized logits)[tok]


def choose(conf, masked, n=None, threshold=None):
    """conf, masked (B, T) -> (B, T) bool, the masked positions to commit: the n most confident (n a 0-d tensor), or
    every one with confidence >= threshold plus the most confident (Fast-dLLM: at least one)."""
    conf = conf.masked_fill(~masked, NEG_INF)
    rank = conf.argsort(dim=-1, descending=True, stable=True).argsort(-1)  # 0 = the most confident masked position
    return masked & ((rank < n) if threshold is None else (conf >= threshold) | (rank == 0))


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


def repeats(prompt, real, model, repetition_penalty):
    """The repetition penalty's memory: (B, V) counts of each row's real prompt tokens (prompt, real (B, P)), which
    the sampler adds each committed token to; None when repetition_penalty == 1 (no penalty, nothing kept)."""
    return None if repetition_penalty == 1.0 else seen_ids(prompt, real, model.config.vocab_size)


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


def ends_held_back(masked, tok, eos, eos_rule):
    """masked (B, bl), the block's open slots -> those that may commit tok (B, bl) this round: all of them, or under
    eos_rule "last" none whose token is an end token while a slot before it is still masked."""
    if eos_rule != "last" or eos is None:
        return masked
    return masked & ~(torch.isin(tok, eos) & (masked.cumsum(1) > masked.long()))


def write_block(x, s, e, P, tok, chosen, r, rounds, seen, mask_id, eos, finish_block):
    """Commit the chosen (B, e-s) predictions tok into x's slots s..e-1 (in place), note round r in rounds, count them
    in seen (the repetition penalty's), close each row whose answer ended (unless finish_block) -> whether every row's
    block is done (a host sync per forward)."""
    x[:, s:e] = torch.where(chosen, tok, x[:, s:e])
    rounds[:, s - P:e - P].masked_fill_(chosen, r)
    if seen is not None:
        seen.scatter_add_(1, tok, chosen.float())
    if eos is not None and not finish_block:
        x[:, s:] = close_answered(x[:, s:], mask_id, eos)
    return not (x[:, s:e] == mask_id).any()


def all_answered(x, s, e, mask_id, eos):
    """After the block s..e-1: close each row whose answer ended (in place) -> whether every row is done (no masked
    slot after the block; a host sync per block). No end ids: never before the canvas's end."""
    if eos is None:
        return False
    x[:, s:] = close_answered(x[:, s:], mask_id, eos)
    return not (x[:, e:] == mask_id).any()


def forward(model, x, q, pos, real, rule, cache=None, block_size=None, last=False):
    """One model call: x (B, T) at slots q (T,), RoPE positions pos, attending under `rule` to key slots 0..S-1
    (the cache's, written at q first; or x itself), pads (real (B, S) False) hidden -> logits (B, T, V); last: the
    head on the last slot only -> (B, 1, V)."""
    mask = attend(rule, q, real, block_size)  # (B, 1, T, S)
    B, T = x.shape
    rows = (torch.arange(B, device=x.device), torch.full((B,), T - 1, device=x.device)) if last else None
    logits = model(x, attn=mask, pos=pos, cache=cache, slots=None if cache is None else q, rows=rows)
    return logits[:, None] if last else logits


def prefill(model, x, P, lens, real, pos, cache, share_opening=False):
    """The prompts (slots 0..P-1 of a left-padded canvas x) into the cache -> the last prompt slot's logits
    (B, 1, V). share_opening: when the rows open with the same k tokens (a chat template's system prompt), those run
    once and their keys and values are copied to each row's slots; the batch's forward then reads only the last
    P - k slots (a shorter row's slots among them are recomputed: the same values)."""
    B, slots, k = x.shape[0], torch.arange(P, device=x.device), 0
    if share_opening and B > 1:
        starts = (P - lens).tolist()  # a host sync, once per call
        k = min(len(os.path.commonprefix([x[b, starts[b]:P].tolist() for b in range(B)])), P - 1)
    if k >= 2:
        pre = model.new_cache(1, k)
        forward(model, x[:1, starts[0]:starts[0] + k], slots[:k], slots[None, :k], real[:1, :0].new_ones(1, k),
                "causal", pre)
        at = (P - lens)[:, None] + slots[:k]  # (B, k): each row's opening slots
        for layer in range(len(pre.k)):
            for dst, src in ((cache.k[layer], pre.k[layer]), (cache.v[layer], pre.v[layer])):
                dst[torch.arange(B, device=x.device)[:, None], :, at] = src[0].transpose(0, 1)  # (k, heads, head_dim)
    else:
        k = 0
    return forward(model, x[:, k:P], slots[k:], pos[:, k:P], real, "causal", cache, last=True)  # (B, 1, V)


@torch.no_grad()
def ar_generate(model, prompt, max_new_tokens, temperature=0.0, top_k=None, top_p=None, eos_id=None, pad_id=None,
                generator=None, mask_token_id=None, vocab_limit=None, use_cache=True, *, min_p=None,
                repetition_penalty=1.0, compile=False, share_opening=False):
    """Causal decoding (greedy when temperature == 0) with a static KV cache; rows that produced an end token
    (eos_id: an id or several) emit pad_id (default the first end id) from then on. use_cache=False recomputes
    the whole sequence per token (reference). min_p, repetition_penalty: `sample` (the penalty over the prompt and
    the tokens so far). compile: the one-token steps through torch.compile (compiling.stepper); the prompt's forward
    stays eager. share_opening: the rows' common opening runs once (`prefill`; for models with a real KV cache)."""
    mask_id = model.config.mask_token_id if mask_token_id is None else mask_token_id
    ban, generator, pad_id, eos = sampling_args(model, mask_id, vocab_limit, generator, eos_id, pad_id)
    x, lens, P, real, pos = canvas(model, prompt, max_new_tokens, pad_id, pad_id)
    B, L = x.shape
    slots = torch.arange(L, device=x.device)
    step = compiling.stepper(forward, model, compile)
    cache = compiling.static_cache(model.new_cache(B, L), compile) if use_cache else None  # keys/values by slot
    seen = repeats(x[:, :P], real[:, :P], model, repetition_penalty)  # (B, V) or None
    done = torch.zeros(B, dtype=torch.bool, device=x.device)
    row_nfe = torch.zeros(B, dtype=torch.long, device=x.device)
    nfe = 0
    for t in range(P, L):  # t: the slot being generated
        if not use_cache:
            logits = step(model, x[:, :t], slots[:t], pos[:, :t], real[:, :t], "causal")  # (B, t, V)
        elif t == P:  # the prompts enter the cache; the head reads the last slot only
            logits = prefill(model, x, P, lens, real, pos, cache, share_opening)  # (B, 1, V)
        else:  # the cache holds slots < t-1: feed the newest token alone, every step the same shapes
            logits = step(model, x[:, t - 1:t], slots[t - 1:t], pos[:, t - 1:t], real, "causal", cache)  # (B, 1, V)
        nfe += 1
        row_nfe += ~done  # a forward counts for the rows still generating
        tok, _ = sample(logits[:, -1], temperature, top_k, top_p, generator, ban, min_p=min_p,
                        repetition_penalty=repetition_penalty, seen=seen)  # (B,)
        x[:, t] = torch.where(done, pad_id, tok)
        if seen is not None:
            seen.scatter_add_(1, tok[:, None], torch.ones_like(seen[:, :1]))
        if eos is not None:
            done |= torch.isin(tok, eos)
            if ((t - P) % STOP_EVERY == STOP_EVERY - 1 or x.device.type == "cpu") and done.all():  # a host sync
                break  # once per STOP_EVERY on a GPU; on a CPU, where it costs nothing, every token
    return finish(x, lens, P, nfe, row_nfe, eos)


@torch.no_grad()
def diffusion_generate(model, prompt, gen_length, block_length, steps, temperature=0.0, top_k=None, top_p=None,
                       remasking="low_confidence", threshold=None, eos_id=None, pad_id=None, generator=None,
                       mask_token_id=None, shift=None, vocab_limit=None, *, cache="none", finish_block=False,
                       eos_rule="free", eos_penalty=0.0, record=False, min_p=None, repetition_penalty=1.0,
                       compile=False):
    """LLaDA: the answer starts fully masked and is denoised block by block (block_length), `steps` spread evenly
    over the blocks, each step committing the most confident predictions of the block ("low_confidence") or random
    ones ("random"); with `threshold` (Fast-dLLM) every prediction with confidence >= threshold plus the most
    confident, until the block is done (`steps` unused). Confidence: the raw softmax probability (`sample`).
    cache: "none" (exact), "prefix" or "dual" (Fast-dLLM's approximate KV cache, refreshed once per block). A row is
    done once its first end token is committed with nothing before it masked (finish_block: once that block is).
    eos_rule: "free", "last" (an end token waits until no slot before it is masked: LLaDA) or "penalty" (eos_penalty
    off the end tokens' logits: Dream). min_p, repetition_penalty: `sample` (the penalty over the prompt and the
    tokens committed so far, for every slot). record: Generation.rounds. compile: every forward through
    torch.compile.
    What each choice computes: docs/methods.md §5."""
    mask_id, shift = dlm_fields(model, mask_token_id, shift)
    if remasking not in ("low_confidence", "random"):
        raise ValueError(f"remasking must be 'low_confidence' or 'random', got {remasking!r}")
    if cache not in cli.CACHES:
        raise ValueError(f"cache must be one of {', '.join(cli.CACHES)}, got {cache!r}")
    if gen_length % block_length:
        raise ValueError(f"gen_length {gen_length} is not a multiple of block_length {block_length}")
    n_blocks = gen_length // block_length
    if threshold is None and (steps % n_blocks or steps < n_blocks):
        raise ValueError(f"steps {steps} must be a positive multiple of the number of blocks {n_blocks}")
    if threshold is not None and remasking != "low_confidence":
        raise ValueError("threshold decoding needs remasking='low_confidence'")
    ban, generator, pad_id, eos = sampling_args(model, mask_id, vocab_limit, generator, eos_id, pad_id, eos_rule,
                                                eos_penalty)
    x, lens, P, real, pos = canvas(model, prompt, gen_length, pad_id, mask_id)
    B, L = x.shape
    slots = torch.arange(L, device=x.device)
    step = compiling.stepper(forward, model, compile)
    kv = None if cache == "none" else compiling.static_cache(model.new_cache(B, L), compile)
    rounds = torch.full((B, gen_length), -1, dtype=torch.long, device=x.device)  # returned with record=True
    seen = repeats(x[:, :P], real[:, :P], model, repetition_penalty)  # (B, V) or None
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
            tok, conf = sample(logits, temperature, top_k, top_p, generator, ban, min_p=min_p,
                               repetition_penalty=repetition_penalty, seen=seen)
            if remasking == "random":
                conf = torch.rand(conf.shape, generator=generator, device=x.device)
            masked = ends_held_back(masked, tok, eos, eos_rule)
            chosen = choose(conf, masked, n_commit[min(i, spb - 1)], threshold)  # (B, block_length)
            if write_block(x, s, e, P, tok, chosen, i, rounds, seen, mask_id, eos, finish_block):
                break
        if all_answered(x, s, e, mask_id, eos):
            break
    return finish(x, lens, P, nfe, row_nfe, eos, rounds if record else None)


@torch.no_grad()
def block_generate(model, prompt, gen_length, block_size=None, threshold=0.9, temperature=0.0, top_k=None,
                   top_p=None, use_cache=True, record=False, eos_id=None, pad_id=None, generator=None,
                   mask_token_id=None, shift=None, vocab_limit=None, *, finish_block=False, eos_rule="free",
                   eos_penalty=0.0, min_p=None, repetition_penalty=1.0, compile=False):
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
    x, lens, P, real, pos = canvas(model, prompt, gen_length, pad_id, mask_id, multiple=bs)  # P: a multiple of bs
    B, L = x.shape
    slots = torch.arange(L, device=x.device)
    step = compiling.stepper(forward, model, compile)
    cache = compiling.static_cache(model.new_cache(B, L), compile) if use_cache else None
    rounds = torch.full((B, gen_length), -1, dtype=torch.long, device=x.device)  # returned with record=True
    seen = repeats(x[:, :P], real[:, :P], model, repetition_penalty)  # (B, V) or None
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
            tok, conf = sample(logits, temperature, top_k, top_p, generator, ban, min_p=min_p,
                               repetition_penalty=repetition_penalty, seen=seen)
            masked = ends_held_back(masked, tok, eos, eos_rule)
            chosen = choose(conf, masked, threshold=threshold)  # (B, bs)
            if write_block(x, s, e, P, tok, chosen, r, rounds, seen, mask_id, eos, finish_block):
                break
        if all_answered(x, s, e, mask_id, eos):
            break
    return finish(x, lens, P, nfe, row_nfe, eos, rounds if record else None)


SAMPLERS = {"causal": "AR", "bidirectional": "masked diffusion", "block": "block diffusion"}


def generate(model, prompt, max_new_tokens, *, temperature=0.0, top_k=None, top_p=None, min_p=None,
             repetition_penalty=1.0, eos_id=None, generator=None, vocab_limit=None, shift=None, block_length=None,
             steps=None, remasking="low_confidence", threshold=None, block_size=None, use_cache=True, cache="none",
             finish_block=False, eos_rule="free", eos_penalty=0.0, record=False, compile=False, share_opening=False):
    """The checkpoint's own sampler, picked by model.config.attn: "causal" -> ar_generate (max_new_tokens at most),
    "bidirectional" -> diffusion_generate (block_length default min(32, N), steps default N: a token a step),
    "block" -> block_generate (threshold default 0.9). ValueError for an argument the sampler would ignore (a
    threshold for an AR model, ...), a threshold outside (0, 1], an unknown eos_rule or a negative eos_penalty.
    Every sampler takes `prompt`, a (B, T) LongTensor or a list of token lists (ragged: left-padded with pad_id,
    default the first end id, else 0); temperature (0: greedy), top_k, top_p, min_p, repetition_penalty (`sample`;
    transformers' meanings); eos_id (an id, or several: a row
    stops at the first of any, its later slots repeating it); generator (on the model's device; default freshly
    seeded); mask_token_id and shift (default the config's); vocab_limit (ids >= it never emitted: the tokenizer's
    size, so unused embedding rows never come out); share_opening (AR: the rows' common opening run once, `prefill`)."""
    kind, N = model.config.attn, max_new_tokens
    if kind not in SAMPLERS:
        raise ValueError(f"config.attn {kind!r} has no sampler (one of {', '.join(SAMPLERS)})")
    given = dict(threshold=threshold is not None, block_length=block_length is not None, steps=steps is not None,
                 remasking=remasking != "low_confidence", block_size=block_size is not None, shift=shift is not None,
                 no_cache=not use_cache, cache=cache != "none", record=record, finish_block=finish_block,
                 eos_rule=eos_rule != "free", share_opening=share_opening)
    dlm = {"shift", "record", "finish_block", "eos_rule"}
    uses = {"causal": {"no_cache", "share_opening"}, "block": {"threshold", "block_size", "no_cache", *dlm},
            "bidirectional": {"threshold", "block_length", "steps", "remasking", "cache", *dlm}}[kind]
    if unused := [k for k, v in given.items() if v and k not in uses]:
        raise ValueError(f"{', '.join(unused)}: not used by the {SAMPLERS[kind]} sampler (config.attn {kind!r}); "
                         "drop it")
    if threshold is not None and not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    common = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                  repetition_penalty=repetition_penalty, eos_id=eos_id, generator=generator, vocab_limit=vocab_limit,
                  compile=compile)
    if kind == "causal":
        return ar_generate(model, prompt, N, use_cache=use_cache, share_opening=share_opening, **common)
    common.update(shift=shift, record=record, finish_block=finish_block, eos_rule=eos_rule, eos_penalty=eos_penalty)
    if kind == "bidirectional":
        return diffusion_generate(model, prompt, N, block_length or min(32, N), steps or N, remasking=remasking,
                                  threshold=threshold, cache=cache, **common)
    return block_generate(model, prompt, N, block_size, 0.9 if threshold is None else threshold, use_cache=use_cache,
                          **common)


# ---- the command line (its terminal side: lib/chat.py) ------------------------------------------------------

def model_defaults(generation):
    """generation_config.json (a dict; None: the checkpoint has none) -> the sampling settings it sets, read as
    transformers reads them: do_sample false (its default) is greedy whatever the temperature; do_sample true
    samples at its temperature (default 1), top_k (default 50; 0 off), top_p (1 off) and min_p;
    repetition_penalty applies either way."""
    g = generation or {}
    out = dict(repetition_penalty=float(g.get("repetition_penalty") or 1.0))
    if g.get("do_sample") and g.get("temperature", 1.0):
        top_p = g.get("top_p")
        out.update(temperature=float(g.get("temperature", 1.0)), top_k=g.get("top_k", 50) or None,
                   top_p=None if top_p in (None, 1, 1.0) else float(top_p), min_p=g.get("min_p"))
    return out


def main():
    from lib.training import load_tokenizer
    p = cli.parser(__doc__)
    chat.add_args(p)
    args = p.parse_args()
    if args.num_samples < 1 or args.max_new_tokens < 1:
        p.error("--num_samples and --max_new_tokens must be positive")
    device, _ = cli.setup(args.device, args.seed)
    try:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        model = Qwen3.from_pretrained(args.ckpt, device=device, dtype=dtype).eval()
        tok = load_tokenizer(args.ckpt, model.config)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"sample: {e}")
    kw = cli.sampler_kwargs(args, model_defaults(model.config.generation)) | dict(
        generator=torch.Generator(device).manual_seed(args.seed), vocab_limit=tok.vocab_size)
    try:
        cli.check_sampling(**{k: kw[k] for k in cli.SAMPLING})
    except ValueError as e:
        raise SystemExit(f"sample: {e}")
    if args.chat and args.prompt is None:
        def answer(ids, ends):  # the reply up to its end token, and (block) the round of each token
            gen = generate(model, [ids], args.max_new_tokens, eos_id=ends, **kw, record=model.config.attn == "block")
            reply = until_end(gen.generated[0].tolist(), ends)
            return reply, None if gen.rounds is None else gen.rounds[0, :len(reply)].tolist()
        return chat.session(model, tok, args.max_new_tokens, answer, kw, args.block_size)
    rows = chat.prompt_rows(tok, args, model.config.attn)
    if args.data:
        from lib import data
        rows = data.code_prompts(data.load_splits(args.data, "sample: --data", like=model)[1], tok, len(rows), 32)
    t0 = time.perf_counter()
    try:
        gen = generate(model, rows if args.data else torch.tensor(rows, device=device), args.max_new_tokens,
                       eos_id=None if args.ignore_eos else tok.end_ids(model.config), record=args.show_rounds, **kw)
    except ValueError as e:
        raise SystemExit(f"sample: {e}")
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    chat.print_samples(tok, rows, gen, SAMPLERS[model.config.attn], dt, titled=bool(args.data))


if __name__ == "__main__":
    main()
