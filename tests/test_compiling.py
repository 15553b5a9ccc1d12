"""lib/compiling.py: a one-row matmul compiles to inductor's own reduction (no BLAS call), and torch.compile makes one
graph per kind of sampler step whatever the prompt and generation lengths, counted with a backend that only counts.
(That the compiled samplers give the eager ones' tokens: tests/test_sample_speed.py.)"""
import torch
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

import sample as S
from sample import ar_generate, block_generate, diffusion_generate
from lib import compiling
from test_sample import make


def test_one_row_mm():
    """The CPU backend of compiled steps: a (1, K) @ (K, N) product, as every linear layer of a batch-1 decode
    step makes, is compiled as inductor's own reduction (no BLAS call in the generated code) and agrees with
    torch.mm; with two rows it stays a BLAS call. Inductor's on-disk cache is off, so the code is generated."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(40, 24, generator=g)  # nn.Linear's (out, in): F.linear reads it transposed

    def linear(x):
        return F.linear(x, w)
    for rows, blas in ((1, False), (2, True)):
        x = torch.randn(rows, 24, generator=g)
        torch._dynamo.reset()
        with torch._inductor.config.patch(fx_graph_cache=False), \
                torch._functorch.config.patch(enable_autograd_cache=False):
            out, code = run_and_get_code(torch.compile(linear, backend=compiling.inductor_cpu), x)
        torch.testing.assert_close(out, x @ w.T)
        assert ("extern_kernels.mm" in "".join(code)) == blas, rows
    a, b = torch.randn(1, 24, generator=g), torch.randn(24, 40, generator=g)
    torch.testing.assert_close(compiling.one_row_mm(a, b), torch.mm(a, b))  # the decomposition itself, run eagerly


def test_compiled_graphs_stay_bounded(monkeypatch):
    """Every sampler, compiled: one graph per kind of step (AR, block, masked diffusion with a cache: each
    serving all its steps, round 0 and refreshes included) for batch 1 and one more for batches > 1, whatever
    the prompt and generation lengths; under dynamo's default recompile limit of 8 (beyond it: eager)."""
    graphs = []

    def count(gm, example_inputs):
        graphs.append(gm)
        return gm.forward  # run the captured graph as it is: only counting
    torch._dynamo.reset()
    monkeypatch.setitem(compiling.COMPILED, None, torch.compile(S.forward, backend=count, **compiling.COMPILE))
    ar, blk, dlm = make(), make("block", shift=True, block_size=4), make("bidirectional", shift=True)
    counts = []
    # first a length equal to the head size (16) and a batch equal to the block (4): neither may become a constant
    for P, N, B in ((8, 8, 1), (7, 12, 4), (5, 16, 1), (11, 4, 2), (2, 20, 3), (9, 8, 1)):
        prompts = [list(range(3, 3 + P - b % 2)) for b in range(B)]  # ragged when B > 1
        ar_generate(ar, prompts, N, compile=True)
        block_generate(blk, prompts, N, threshold=0.9, compile=True)
        for cache in ("dual", "prefix"):
            diffusion_generate(dlm, prompts, N, 4, N, cache=cache, compile=True)
        counts.append(len(graphs))
    assert counts == [3] + [6] * 5, counts  # nothing new after the first configuration of each batch kind
