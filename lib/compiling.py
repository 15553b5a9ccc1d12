"""
torch.compile for the samplers and for FlexAttention: the machinery, kept off the sampler's page. sample.py calls
it from one line (`step = compiling.stepper(forward, model, compile)`) and model.py for its FlexAttention call.

What is notable here:
- One graph per kind of sampler step, replayed: sizes are symbolic from the start (dynamic=True), so neither the
  prompt's nor the generation's length recompiles. On CUDA mode="reduce-overhead" (CUDA graphs), with the KV
  cache at a static address (`static_cache`).
- On the CPU every one-row product (a batch-1 decode step's linear layers) becomes inductor's own reduction
  instead of a BLAS call (`one_row_mm`): a one-token step is bound by reading the weights, and this loop streams
  them about twice as fast on our CPU (docs/results.md, "Sampler speed").
"""
import torch
import torch.fx.experimental._config
from torch.nn.attention.flex_attention import flex_attention

COMPILE = dict(dynamic=True)  # sizes symbolic from the start (but 0 and 1): no length ever recompiles
COMPILED = {}  # the compiled step function per mode, made on first use and kept for the process
_compiled_flex = None


def one_row_mm(a, b, out_dtype=None):
    """Inductor's decomposition of aten.mm, except that a CPU product with one row, (1, K) @ (K, N), becomes a
    multiply and a sum over K, which inductor writes as a vectorised loop over each weight row."""
    from torch._inductor.decomposition import mm
    from torch.fx.experimental.symbolic_shapes import statically_known_true
    if out_dtype is None and a.device.type == "cpu" and statically_known_true(a.shape[0] == 1):
        return (a[0][:, None] * b).sum(0, keepdim=True)  # (K, N) products -> (1, N)
    return mm(a, b, out_dtype)


def inductor_cpu(gm, example_inputs):
    """The CPU backend of compiled steps: inductor with `one_row_mm`. The cache key tag keeps inductor's
    on-disk caches, which do not see the decompositions, from serving a graph compiled without it."""
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.decomposition import select_decomp_table
    with torch.compiler.config.patch(cache_key_tag="sample.one_row_mm"):
        return compile_fx(gm, example_inputs, decompositions={**select_decomp_table(),
                                                               torch.ops.aten.mm.default: one_row_mm})


def stepper(forward, model, compile):
    """The function a sampling loop calls for its steps: `forward` itself, or with compile=True
    torch.compile(forward) (CUDA: mode="reduce-overhead"; CPU: inductor with `one_row_mm`), compiled once per
    process. The loops feed each step the same shapes, and the compiled step gets fresh contiguous copies of the
    slices it is fed (x, q, pos), so one graph serves every step; sizes 0 and 1 are specialised (batch 1 and
    the AR step get their own graphs)."""
    if not compile:
        return forward
    mode = "reduce-overhead" if model.model.embed_tokens.weight.is_cuda else None
    if mode not in COMPILED:
        how = dict(mode=mode) if mode else dict(backend=inductor_cpu)
        COMPILED[mode] = torch.compile(forward, **how, **COMPILE)
    compiled = COMPILED[mode]

    def step(model, x, q, pos, *args):
        fresh = dict(memory_format=torch.contiguous_format)
        with torch.fx.experimental._config.patch(use_duck_shape=False):  # a length that happens to equal another
            # size when first traced (L = head_dim = 32, block 4 = batch 4) gets its own symbol, not that size's
            return compiled(model, x.clone(**fresh), q.clone(**fresh), pos.clone(**fresh), *args)
    return step


def static_cache(cache, compile):
    """A KV cache for compiled CUDA steps: its tensors marked static (written in place at a fixed address, so CUDA
    graphs read and write them where they are instead of copying them in each replay). -> the cache."""
    if compile and cache.k[0].is_cuda:
        for t in cache.k + cache.v:  # one tensor per layer
            torch._dynamo.mark_static_address(t)
    return cache


def flex(q, k, v, block_mask, enable_gqa):
    """flex_attention, compiled once on first use on CUDA (the fused kernel). Eager elsewhere: unfused, it
    materialises the scores (fine for CPU tests); inside a torch.compile'd model the outer compile fuses it."""
    global _compiled_flex
    if not q.is_cuda or torch.compiler.is_compiling():
        return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)
