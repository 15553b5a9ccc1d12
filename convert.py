"""
AR checkpoint -> DLM checkpoint: the same weights, no new parameters, read differently; the whole difference is
metadata in config.json, which every other script honours (docs/methods.md §8, "convert.py"):

    attn           "bidirectional" (masked diffusion: REPR-ALIGN) or "block" (block diffusion: OPDLM)
    block_size     the block length for attn="block"
    mask_token_id  an embedding row no token uses (Qwen3: 151669; the learnt BPE: 1024; the byte tokenizer: 259);
                   a vocabulary that uses every row (SmolLM2) gets 64-row-aligned rows appended, the mean embedding
    shift          True: position i is denoised by the logits at i-1, as the AR head reads (Dream, REPR-ALIGN);
                   False: at i itself (OPDLM's block student, whose i-1 may sit in a block that cannot see i's)

    python convert.py --ar out/ar-tiny --out_dir out/dlm-tiny --attn bidirectional
    python convert.py --ar out/ar-tiny --out_dir out/dlm-block --attn block --block_size 4
    python convert.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out_dir out/smollm2   # GGUF -> HF AR checkpoint
"""
import json
import shutil
from pathlib import Path

from model import Qwen3, Qwen3Config
from lib import cli
from lib.checkpoint import trained_with
from lib.cli import atomic_write
from lib.hf import resolve, rows_with_mask, weight_files
from lib.tokenizer import Tokenizer

p = cli.parser(__doc__)
p.add_argument("--ar", help="the AR (causal) Qwen3 or Llama checkpoint: a directory, or a "
               "Hugging Face model id (org/name[@revision], through huggingface_hub's cache)")
p.add_argument("--gguf", help="instead of --ar: import this llama or qwen3 GGUF file as an AR checkpoint (the gguf "
                              "package dequantizes it); --attn and the DLM flags do not apply")
p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="--gguf: the dtype the weights are stored in")
p.add_argument("--out_dir", required=True, help="the checkpoint directory to write (not inside --ar)")
p.add_argument("--attn", choices=["bidirectional", "block"],
               help="required with --ar. bidirectional: masked diffusion (REPR-ALIGN); block: block diffusion (OPDLM)")
p.add_argument("--block_size", type=int, default=None, help="block length, required for --attn block")
p.add_argument("--mask_token_id", type=int, default=None, help="default: the first id past the tokenizer's tokens")
p.add_argument("--shift", choices=["true", "false"], default=None,
               help="default: true for bidirectional (Dream/REPR-ALIGN), false for block (OPDLM)")
p.add_argument("--overwrite", action="store_true", help="replace the contents of a non-empty --out_dir")


def empty_out_dir(out_dir, overwrite):
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        if not overwrite:
            raise SystemExit(f"convert: {out_dir} is not empty; pass --overwrite to replace it")
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)


def from_gguf(path, out_dir, dtype="fp32", overwrite=False):
    """The GGUF file -> a Hugging Face AR checkpoint in out_dir (lib/gguf_import.py) -> the model."""
    from lib import gguf_import
    try:
        reader = gguf_import.read(path)  # every check that needs no tensor data: nothing written on a refusal
    except ValueError as e:
        raise SystemExit(f"convert: {e}")
    empty_out_dir(out_dir, overwrite)
    return gguf_import.write(reader, out_dir, {"fp32": "float32", "bf16": "bfloat16"}[dtype])


def convert(ar, out_dir, attn, block_size=None, mask_token_id=None, shift=None, overwrite=False):
    try:
        ar, out_dir = resolve(ar), Path(out_dir)  # a directory, or a Hugging Face model id
    except FileNotFoundError as e:
        raise SystemExit(f"convert: {e}")
    a, o = ar.resolve(), out_dir.resolve()
    if a == o or a in o.parents or o in a.parents:  # --overwrite would delete the AR checkpoint itself
        raise SystemExit(f"convert: --out_dir {out_dir} and --ar {ar} overlap (one is, or is inside, the other); "
                         f"choose an --out_dir outside the AR checkpoint")
    try:
        config = Qwen3Config.load(ar)
        files = weight_files(ar)  # every file's header checked against its size: no truncated copy is made
        tok = Tokenizer.from_pretrained(ar)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"convert: {e}")
    if config.attn != "causal":
        raise SystemExit(f"convert: {ar} is already a DLM (attn={config.attn!r}); convert from the AR checkpoint")
    if attn == "block" and not (block_size and block_size > 0):
        raise SystemExit("convert: --attn block needs a positive --block_size")
    if attn != "block" and block_size is not None:
        raise SystemExit("convert: --block_size only applies to --attn block")
    mask = tok.mask_id if mask_token_id is None else mask_token_id
    if mask < tok.vocab_size:
        raise SystemExit(f"convert: mask_token_id {mask} collides with a token the tokenizer uses "
                         f"(ids 0..{tok.vocab_size - 1}); pick an unused embedding row")
    grow = mask_token_id is None and mask >= config.vocab_size  # no free row: append some (with_rows)
    if mask >= config.vocab_size and not grow:
        raise SystemExit(f"convert: mask_token_id {mask} is outside the {config.vocab_size} embedding rows")
    empty_out_dir(out_dir, overwrite)

    tok.save_pretrained(out_dir)
    fields = dict(attn=attn, block_size=block_size, mask_token_id=mask, converted_from=str(ar.resolve()),
                  shift=(attn == "bidirectional") if shift is None else shift,
                  tokenizer_sha256=trained_with(config))  # the AR's record, else its tokenizer files' fingerprint
    if grow:
        model = Qwen3.from_pretrained(ar).with_rows(rows_with_mask(mask))
        vars(model.config).update(fields)
        model.save_pretrained(out_dir, dtype=next(iter(model.state_dict().values())).dtype)  # config.json last
        print(f"convert: the tokenizer uses all {config.vocab_size} embedding rows; appended "
              f"{model.config.vocab_size - config.vocab_size} (the mean embedding), the mask token is row {mask}")
        return model.config
    for f in files + [ar / "model.safetensors.index.json"]:  # the weights, byte for byte
        if f.exists():
            atomic_write(out_dir / f.name, lambda tmp: shutil.copyfile(f, tmp))
    vars(config).update(fields)
    config.save(out_dir)  # written last: a directory with config.json is complete
    return config


if __name__ == "__main__":
    args = p.parse_args()
    if (args.ar is None) == (args.gguf is None):
        p.error("give one of --ar (an AR checkpoint to convert) and --gguf (a GGUF file to import)")
    if args.gguf:
        if args.attn or args.block_size or args.mask_token_id is not None or args.shift:
            p.error("--gguf imports an AR checkpoint; convert it with --ar --attn afterwards")
        m = from_gguf(args.gguf, args.out_dir, args.dtype, args.overwrite)
        print(f"wrote {args.out_dir}: {m.config.model_type}, {m.num_params() / 1e6:.1f}M parameters, "
              f"{m.config.torch_dtype}")
        raise SystemExit(0)
    if args.attn is None:
        p.error("--ar needs --attn (bidirectional or block)")
    shift = None if args.shift is None else args.shift == "true"
    c = convert(args.ar, args.out_dir, args.attn, args.block_size, args.mask_token_id, shift, args.overwrite)
    print(f"wrote {args.out_dir}: " + json.dumps(dict(attn=c.attn, block_size=c.block_size,
                                                       mask_token_id=c.mask_token_id, shift=c.shift)))
