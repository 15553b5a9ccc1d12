"""
AR checkpoint -> DLM checkpoint. No weight changes and no new parameters: a diffusion LM converted
from an AR model is the same network read differently, and all of that difference is metadata in
config.json, which every other script honours:

    attn           "bidirectional" (masked diffusion: REPR-ALIGN) or "block" (block diffusion: OPDLM)
    block_size     the block length for attn="block"
    mask_token_id  an embedding row no token uses (Qwen3: 151669, the first padding row; the tiny
                   model's learnt BPE: 1024; the byte tokenizer: 259), so no resize is needed
    shift          True: the logits that denoise position i are read at position i-1, so the AR head
                   keeps its meaning (Dream, REPR-ALIGN). False: read at i itself (OPDLM's block
                   student, whose position i-1 may sit in an earlier block that cannot see block i)

    python convert.py --ar out/ar-tiny --out_dir out/dlm-tiny --attn bidirectional
    python convert.py --ar out/ar-tiny --out_dir out/dlm-block --attn block --block_size 4

Before anything is written it refuses an --out_dir that is, or is inside, the AR checkpoint (or holds it), and
weights whose safetensors header does not match the file (a truncated copy; every shard of a sharded checkpoint).
config.json keeps the AR model's tokenizer fingerprint (tokenizer_sha256), which training checks data against.
Everything else a checkpoint comes with is carried through unchanged: generation_config.json (Qwen3's end-of-turn
<|im_end|> among its eos_token_id), tokenizer_config.json (the chat template, the tokenizer class) and
chat_template.jinja, so every DLM made from it, and every run trained from that, stops and chats as the AR model does.
"""
import json
import shutil
from pathlib import Path

import cli
from checkpoint import weight_files
from model import Qwen3Config
from tokenizer import Tokenizer, atomic_write

p = cli.parser(__doc__)
p.add_argument("--ar", required=True, help="the AR (causal) Qwen3 checkpoint directory")
p.add_argument("--out_dir", required=True, help="the DLM checkpoint directory to write (not inside --ar)")
p.add_argument("--attn", required=True, choices=["bidirectional", "block"],
               help="bidirectional: masked diffusion (REPR-ALIGN); block: block diffusion (OPDLM)")
p.add_argument("--block_size", type=int, default=None, help="block length, required for --attn block")
p.add_argument("--mask_token_id", type=int, default=None, help="default: the first id past the tokenizer's tokens")
p.add_argument("--shift", choices=["true", "false"], default=None,
               help="default: true for bidirectional (Dream/REPR-ALIGN), false for block (OPDLM)")
p.add_argument("--overwrite", action="store_true", help="replace the contents of a non-empty --out_dir")


def convert(ar, out_dir, attn, block_size=None, mask_token_id=None, shift=None, overwrite=False):
    ar, out_dir = Path(ar), Path(out_dir)
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
    if mask >= config.vocab_size:
        raise SystemExit(f"convert: mask_token_id {mask} is outside the {config.vocab_size} embedding rows")
    if out_dir.exists() and any(out_dir.iterdir()):
        if not overwrite:
            raise SystemExit(f"convert: {out_dir} is not empty; pass --overwrite to replace it")
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    for f in files + [ar / "model.safetensors.index.json"]:  # the weights, byte for byte
        if f.exists():
            atomic_write(out_dir / f.name, lambda tmp: shutil.copyfile(f, tmp))
    tok.save_pretrained(out_dir)
    config.attn, config.block_size, config.mask_token_id = attn, block_size, mask
    config.shift = (attn == "bidirectional") if shift is None else shift
    config.converted_from = str(ar.resolve())
    config.save(out_dir)  # written last: a directory with config.json is complete
    return config


if __name__ == "__main__":
    args = p.parse_args()
    shift = None if args.shift is None else args.shift == "true"
    c = convert(args.ar, args.out_dir, args.attn, args.block_size, args.mask_token_id, shift, args.overwrite)
    print(f"wrote {args.out_dir}: " + json.dumps(dict(attn=c.attn, block_size=c.block_size,
                                                       mask_token_id=c.mask_token_id, shift=c.shift)))
