"""
lm-evaluation-harness for every checkpoint of this project: the model class `ar2dlm`, registered with lm-eval,
and lm-eval's own command line run with it (eval.py harness passes every flag through). lm-eval is optional:
`pip install -r requirements-dev.txt -c constraints.txt` installs the pinned version.

    python eval.py harness --model_args pretrained=out/ar-tiny --tasks arc_easy --limit 100
    python eval.py harness --model_args pretrained=out/align,mc_draws=32 --tasks my_task --include_path my_tasks/
    python eval.py harness --model_args pretrained=out/distill,threshold=0.9 --tasks gsm8k --batch_size 8

Notes on the design: docs/methods.md, "lib/harness.py" under §8.
"""
import json
import sys
import zlib

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm import tqdm

import diffusion
import sample
from lib import cli
from lib import training
from lib.training import load_tokenizer


def seeded(seed, ids):
    """A generator seeded by seed and the token ids: the same draws for the same request, wherever it runs."""
    return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(torch.tensor(ids).numpy().tobytes()))


def by_length(items, batch_size):
    """[(ids, n_context)] -> lists of indices whose ids have one length (longest first, at most batch_size each):
    batches that need no padding."""
    groups = {}
    for j, (ids, _) in enumerate(items):
        groups.setdefault(len(ids), []).append(j)
    for T in sorted(groups, reverse=True):
        for s in range(0, len(groups[T]), batch_size):
            yield groups[T][s:s + batch_size]


@register_model("ar2dlm")
class AR2DLM(LM):
    def __init__(self, pretrained, mc_draws=16, seed=1337, device="auto", dtype=None, batch_size=8,
                 max_length=None, threshold=None, block_length=None, steps=None, remasking="low_confidence",
                 block_size=None, cache="none", eos_rule="free", eos_penalty=3.0, eps=1e-3, max_batch_size=None,
                 **unused):
        super().__init__()
        if unused:
            raise ValueError(f"ar2dlm: unknown model arguments {sorted(unused)}; see python eval.py harness --help")
        self._device, self.ctx = cli.setup(str(device), int(seed))
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(dtype) or (
            torch.bfloat16 if self._device.type == "cuda" else torch.float32)
        self.model = training.load_model(pretrained, self._device, "ar2dlm: pretrained", dtype=dtype).eval()
        self.tok = load_tokenizer(pretrained, self.model.config)
        c = self.model.config
        self.kind, self.mc_draws, self.seed, self.eps = c.attn, int(mc_draws), int(seed), float(eps)
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8  # "auto" -> 8
        self.max_length = int(max_length or c.max_position_embeddings)
        self.prefix = self.tok.eos_id  # an empty context, and the rolling likelihood's first token
        def num(v, f):
            return None if v is None else f(v)
        self.sampler = dict(threshold=num(threshold, float), block_length=num(block_length, int),
                            steps=num(steps, int), remasking=remasking, block_size=num(block_size, int), cache=cache,
                            eos_rule=eos_rule, eos_penalty=float(eos_penalty) if eos_rule == "penalty" else None)
        self.sampler = {k: v for k, v in self.sampler.items() if v not in (None, "none", "low_confidence", "free")}

    # ---- scoring ----------------------------------------------------------------------------------------------

    def encode_pair(self, context, continuation):
        """-> (ids, n_context): a context's trailing spaces move to the continuation, and the continuation's ids
        are those of the whole text after the context's (lm-eval's rule for causal models)."""
        n = len(context) - len(context.rstrip())
        context, continuation = context[:len(context) - n], context[len(context) - n:] + continuation
        whole = self.tok.encode(context + continuation)
        ctx = self.tok.encode(context) if context else []
        if not ctx or whole[:len(ctx)] != ctx:
            ctx, whole = [self.prefix] + ctx, [self.prefix] + whole
        if len(whole) > self.max_length:  # keep the continuation; cut the context from the left
            cut = len(whole) - self.max_length
            if cut >= len(ctx):
                raise ValueError(f"ar2dlm: a continuation of {len(whole) - len(ctx)} tokens does not fit max_length "
                                 f"{self.max_length}")
            whole, ctx = whole[cut:], ctx[cut:]
        return whole, len(ctx)

    @torch.no_grad()
    def score(self, items):
        """[(ids, n_context)] -> [(log p(continuation | context) or its ELBO, is_greedy)], in order."""
        out, dev = [None] * len(items), self._device
        for js in tqdm(list(by_length(items, self.batch_size)), desc="ar2dlm loglikelihood", leave=False):
            ids = torch.tensor([items[j][0] for j in js], device=dev)  # (B, T), one length
            B, T = ids.shape
            cont = torch.arange(T, device=dev) >= torch.tensor([items[j][1] for j in js], device=dev)[:, None]
            with self.ctx:
                lp, greedy = self.ar_logps(ids, cont) if self.kind == "causal" else self.elbo(ids, cont, js, items)
            for b, j in enumerate(js):
                out[j] = (float(lp[b]), bool(greedy[b]))
        return out

    def ar_logps(self, ids, cont):
        """(B,) Σ_{i∈cont} log p(ids_i | ids_<i), exact, and whether each row's continuation is the argmax."""
        ce, pred = self.model(ids, "causal", rows=diffusion.denoiser_rows(cont, True), targets=ids[cont], argmax=True)
        rows = cont.nonzero()[:, 0]
        wrong = torch.zeros(len(ids), device=ids.device).index_add(0, rows, (pred != ids[cont]).float())
        return torch.zeros(len(ids), device=ids.device).index_add(0, rows, -ce), wrong == 0

    def elbo(self, ids, cont, js, items):
        """(B,) the mean over mc_draws draws of -Σ_{i∈M} CE_i / t (each row's draws seeded by its ids), and whether
        the continuation is the argmax with all of it masked."""
        B, T = ids.shape
        t, u = zip(*(diffusion.draw_masks(1, self.mc_draws, T, seeded(self.seed, items[j][0]), self.eps) for j in js))
        t, u = torch.cat(t, 1).to(ids.device), torch.cat(u, 1).to(ids.device)  # (draws, B), (draws, B, T)
        ok = cont & diffusion.maskable(B, T, self.model.config.shift, device=ids.device)
        total = sum(diffusion.sequence_elbo(self.model, ids, (u[k] < t[k][:, None]) & ok, t[k])
                    for k in range(self.mc_draws))  # E_{t,M}[-Σ_{i∈M} CE_i / t]
        xt = torch.where(ok, self.model.config.mask_token_id, ids)
        _, pred = diffusion.denoiser_ce(self.model, ids, xt, ok, argmax=True)
        rows = ok.nonzero()[:, 0]
        wrong = torch.zeros(B, device=ids.device).index_add(0, rows, (pred != ids[ok]).float())
        return total / self.mc_draws, wrong == 0

    def loglikelihood(self, requests, disable_tqdm=False):
        return self.score([self.encode_pair(*r.args) for r in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        items = []
        for r in requests:
            ids = [self.prefix] + self.tok.encode(r.args[0])
            if len(ids) > self.max_length:
                raise ValueError(f"ar2dlm: a document of {len(ids)} tokens exceeds max_length {self.max_length} "
                                 "(rolling windows are not implemented)")
            items.append((ids, 1))
        return [lp for lp, _ in self.score(items)]

    # ---- generation -------------------------------------------------------------------------------------------

    def canvas(self, n):
        """A DLM's generation length for max_gen_toks n: rounded up to its sampler's block (block DLMs: block_size;
        masked diffusion: block_length, default min(32, n)), which must divide it."""
        c, m = self.model.config, 1
        if self.kind == "block":
            m = self.sampler.get("block_size") or c.block_size
        elif self.kind == "bidirectional":
            m = self.sampler.get("block_length") or min(32, n)
        return -(-n // m) * m

    def generate_until(self, requests, disable_tqdm=False):
        """One sampler call per batch of requests with the same generation settings; greedy unless they set a
        temperature (do_sample false: greedy)."""
        ends, out, groups = self.tok.end_ids(self.model.config), [None] * len(requests), {}
        for j, r in enumerate(requests):
            groups.setdefault(json.dumps(r.args[1], sort_keys=True, default=str), []).append(j)
        for js in tqdm(list(groups.values()), desc="ar2dlm generate", leave=False, disable=disable_tqdm):
            kw = dict(requests[js[0]].args[1])
            until = kw.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            n, sampled = self.canvas(int(kw.pop("max_gen_toks", 256))), kw.pop("do_sample", True)
            opts = dict(temperature=float(kw.pop("temperature", 0.0)) if sampled else 0.0,
                        top_k=kw.pop("top_k", None), top_p=kw.pop("top_p", None))
            if kw:
                raise ValueError(f"ar2dlm: generation settings not supported: {sorted(kw)}")
            g = torch.Generator(self._device).manual_seed(self.seed)
            for s in range(0, len(js), self.batch_size):
                chunk = js[s:s + self.batch_size]
                prompts = [(self.tok.encode(requests[j].args[0]) or [self.prefix])[-(self.max_length - n):]
                           for j in chunk]
                with self.ctx:
                    gen = sample.generate(self.model, prompts, n, eos_id=ends, generator=g,
                                          vocab_limit=self.tok.vocab_size, **opts, **self.sampler)
                for b, j in enumerate(chunk):
                    text = self.tok.decode(sample.until_end(gen.generated[b].tolist(), ends))
                    out[j] = min((text.split(u)[0] for u in until if u), key=len, default=text)  # at the first
        return out


def main(argv):
    """lm-eval's command line with ar2dlm registered: `python eval.py harness ARGS` is `lm_eval run --model
    ar2dlm ARGS` (every lm-eval flag passes through)."""
    from lm_eval.__main__ import cli_evaluate
    if any(a == "--model" or a.startswith("--model=") for a in argv):
        raise SystemExit("eval.py harness: the model is ar2dlm; give the checkpoint as --model_args pretrained=DIR")
    given = {{"-b": "--batch_size"}.get(a, a.split("=")[0]) for a in argv}
    defaults = [f for flag, v in (("--device", "auto"), ("--batch_size", "8")) if flag not in given for f in (flag, v)]
    sys.argv = ["lm_eval", "run", "--model", "ar2dlm", *defaults, *argv]
    cli_evaluate()
