"""
Hugging Face checkpoint directories: config.json (+ generation_config.json) and model.safetensors (or a sharded
index), read and written the way transformers does, so that official Qwen3 weights load with strict names and
our checkpoints load in transformers.

A model id (org/name[@revision]) is read through huggingface_hub's cache. A training run's own checkpoint (its
train state, --resume) is lib/checkpoint.py. Notes on the design: docs/methods.md, "lib/checkpoint.py" under §8.
"""
import contextlib
import copy
import functools
import json
import math
import os
import re
import struct
from dataclasses import asdict, fields
from pathlib import Path

import torch

from lib.cli import atomic_write

COMMON = dict(hidden_act="silu", attention_dropout=0.0, initializer_range=0.02, use_cache=True)
HF_KEYS = {"qwen3": dict(architectures=["Qwen3ForCausalLM"], **COMMON, use_sliding_window=False),  # written only
           "llama": dict(architectures=["LlamaForCausalLM"], **COMMON, mlp_bias=False, pretraining_tp=1)}
NOT_SAVED = ("extra", "path", "generation")  # the config's fields that are not config.json keys


HUB_FILES = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
             "tokenizer.json", "*.tiktoken", "tokenizer_config.json", "chat_template.jinja"]  # what a load reads
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?")  # org/name, optionally @revision


def resolve(path):
    """A checkpoint directory, or a Hugging Face model id ("org/name", optionally "@revision") -> a local path.
    A path that exists, or whose first part is a directory here (out/typo), is a path. An id is fetched through
    huggingface_hub (imported only then): its cache, and a download of the files a load reads unless
    HF_HUB_OFFLINE is set; FileNotFoundError in one line naming the id and what was tried."""
    p = Path(path)
    if p.exists() or not HUB_ID.fullmatch(str(path)) or Path(str(path).split("/")[0]).is_dir():
        return p
    return hub_snapshot(str(path))


@functools.lru_cache(maxsize=None)
def hub_snapshot(path):
    """resolve's model id -> its snapshot directory, asked of huggingface_hub once per process (a load reads the
    config, the weights and the tokenizer through resolve: one lookup, not one each)."""
    repo, _, revision = path.partition("@")
    try:
        import huggingface_hub
        from huggingface_hub import constants
    except ImportError:
        raise FileNotFoundError(f"{path}: no such directory, and reading it as a Hugging Face model id needs "
                                "huggingface_hub (pip install huggingface_hub)") from None
    where = f"the Hugging Face cache ({constants.HF_HUB_CACHE})"
    try:
        return Path(huggingface_hub.snapshot_download(repo, revision=revision or None, allow_patterns=HUB_FILES))
    except Exception as e:  # offline and not cached, not found, no network, gated: each its own class
        tried = f"{where}, offline (HF_HUB_OFFLINE)" if constants.HF_HUB_OFFLINE else f"{where} and the Hub"
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        at = f" at revision {revision!r}" if revision else ""
        raise FileNotFoundError(f"{path}: no such directory, and the model id {repo!r}{at} is not in {tried}: "
                                f"{why}") from None


def rows_with_mask(n_tokens):
    """The embedding rows convert.py gives a vocabulary of n_tokens that uses every row (SmolLM2's 49152): room for
    the mask token (row n_tokens), rounded up to a multiple of 64."""
    return (n_tokens // 64 + 1) * 64


class ConfigFile:
    """config.json <-> the config dataclass (model.Qwen3Config): field names are Hugging Face's."""

    @classmethod
    def from_dict(cls, d, source="config"):
        d = dict(d)
        arch = d.get("architectures") or []
        by_arch = {v["architectures"][0]: k for k, v in HF_KEYS.items()}
        d.setdefault("model_type", next((by_arch[a] for a in arch if a in by_arch), None))
        if d.get("model_type") not in HF_KEYS:
            raise ValueError(f"{source}: not a Qwen3 or Llama checkpoint (model_type={d.get('model_type')!r}, "
                             f"architectures={arch}); only those two are supported")
        if d.get("mlp_bias"):
            raise ValueError(f"{source}: mlp_bias=true is not supported")
        d.setdefault("head_dim", d.get("hidden_size", 0) // max(1, d.get("num_attention_heads", 1)))  # Llama's default
        rope = d.pop("rope_parameters", None) or {}  # transformers 5.x style
        if "rope_theta" in rope:
            d.setdefault("rope_theta", rope["rope_theta"])
        if rope.get("rope_type", "default") != "default" or d.get("rope_scaling"):
            raise ValueError(f"{source}: RoPE scaling is not supported (got {rope or d.get('rope_scaling')})")
        if d.get("use_sliding_window"):
            raise ValueError(f"{source}: sliding-window attention is not supported")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{source}: hidden_act={d['hidden_act']!r}; only 'silu' is supported")
        if "dtype" in d:  # transformers 5.x name
            d["torch_dtype"] = d.pop("dtype")
        names = {f.name for f in fields(cls)} - set(NOT_SAVED)
        cfg = cls(**{k: v for k, v in d.items() if k in names}, extra={k: v for k, v in d.items() if k not in names})
        cfg.validate(source)
        return cfg

    def to_dict(self):
        d = {k: v for k, v in asdict(self).items() if k not in NOT_SAVED}
        d["dtype"] = d["torch_dtype"]  # transformers 5.x reads "dtype", 4.x "torch_dtype"
        d["rope_parameters"] = {"rope_type": "default", "rope_theta": self.rope_theta}  # 5.x; 4.x reads rope_theta
        return {**HF_KEYS[self.model_type], **self.extra, **d}

    @classmethod
    def load(cls, path):
        """config.json of a checkpoint directory, with `path` set and generation_config.json read when present
        (tokenizer_sha256 as recorded: None for a checkpoint that records none; see checkpoint.trained_with)."""
        path = resolve(path)
        f = path / "config.json"
        if not f.is_file():
            raise FileNotFoundError(f"{f} not found: expected a Hugging Face Qwen3 checkpoint directory")
        try:
            d = json.loads(f.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{f}: not valid JSON ({e})") from None
        config = cls.from_dict(d, source=str(f))
        config.path = str(path)
        g = Path(path) / "generation_config.json"
        if g.is_file():
            try:
                config.generation = json.loads(g.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ValueError(f"{g}: not valid JSON ({e})") from None
        return config

    def save(self, path):
        """config.json, and generation_config.json when the config carries one (written first: config.json
        completes a checkpoint)."""
        if self.generation is not None:
            gen = json.dumps(self.generation, indent=2) + "\n"
            atomic_write(Path(path) / "generation_config.json", lambda f: Path(f).write_text(gen))
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        atomic_write(Path(path) / "config.json", lambda f: Path(f).write_text(text))


@contextlib.contextmanager
def no_embedding_init():
    """nn.Embedding built without its random init (the weights are assigned after). On the meta device torch's init
    of an Embedding imports torch._dynamo, about 2 s of every process that loads a model and never compiles."""
    reset = torch.nn.Embedding.reset_parameters
    torch.nn.Embedding.reset_parameters = lambda self: None
    try:
        yield
    finally:
        torch.nn.Embedding.reset_parameters = reset


class WeightsFile:
    """model.safetensors (or shards) <-> the model (model.Qwen3, whose `config_class` is its config dataclass)."""

    @classmethod
    def from_pretrained(cls, path, device=None, dtype=None):
        """Load a Hugging Face Qwen3 directory (config.json + model.safetensors or a sharded index).
        Tensors go straight to `device` in their stored dtype, or are cast to `dtype` there."""
        from safetensors import SafetensorError, safe_open
        path = resolve(path)
        config = cls.config_class.load(path)
        files = weight_files(path)
        device = str(torch.device(device or "cpu"))
        state = {}
        for f in files:
            try:
                with safe_open(f, "pt", device=device) as sf:
                    for k in sf.keys():  # one tensor at a time: a dtype cast never holds two full copies
                        if k == "lm_head.weight" and config.tie_word_embeddings:
                            continue  # the head is the embedding matrix
                        t = sf.get_tensor(k)
                        state[k] = t if dtype is None else t.to(dtype)
            except (SafetensorError, OSError) as e:
                raise ValueError(f"{f}: cannot read safetensors file ({e}); is it truncated or corrupt?") from None
        if not config.tie_word_embeddings and "lm_head.weight" not in state:
            raise ValueError(f"{path}: untied config (tie_word_embeddings=false) but no lm_head.weight")
        return cls.from_state(config, state, source=str(path))

    @classmethod
    def from_state(cls, config, state, source="state"):
        """The model of `config` holding the tensors of `state` (name -> tensor, assigned, not copied; a tied lm_head
        is the embedding), after checking that the names and shapes are the config's: ValueError naming source."""
        with torch.device("meta"), no_embedding_init():
            model = cls(config)
        keys = set(model.state_dict()) - ({"lm_head.weight"} if config.tie_word_embeddings else set())
        missing, unexpected = sorted(keys - set(state)), sorted(set(state) - keys)
        if missing or unexpected:
            raise ValueError(f"{source}: weights do not match the config: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        expected = {k: v.shape for k, v in model.state_dict().items()}
        for k, v in state.items():
            if v.shape != expected[k]:
                raise ValueError(f"{source}: {k} has shape {tuple(v.shape)} but config.json implies "
                                 f"{tuple(expected[k])}")
        model.load_state_dict(state, strict=False, assign=True)
        if config.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        return model

    def with_rows(self, rows):
        """-> a copy with `rows` embedding rows (and lm_head rows when untied), the appended ones the mean of the
        others: convert.py's room for a mask token when the tokenizer uses every row (SmolLM2's 49152), and the same
        rows for that student's AR teacher (training.load_teacher)."""
        config, state = copy.copy(self.config), dict(self.state_dict())
        if config.tie_word_embeddings:
            del state["lm_head.weight"]  # the embedding
        for k in ("model.embed_tokens.weight",) + (() if config.tie_word_embeddings else ("lm_head.weight",)):
            w = state[k]  # (V, C) -> (rows, C)
            state[k] = torch.cat([w, w.mean(0, keepdim=True).expand(rows - w.shape[0], -1)])
        config.vocab_size = rows
        return type(self).from_state(config, state, source="with_rows").train(self.training)

    def save_pretrained(self, path, metadata=None, *, dtype=None, state_dict=None):
        """Write config.json (and generation_config.json) + model.safetensors in Hugging Face's layout, each file
        atomically. `metadata` (str -> str) goes into the safetensors header (training scripts store the step there).
        dtype: the dtype the weights are stored in (default: the parameters'); config.json's torch_dtype names it.
        Each tensor is cast on its own device and moved to the CPU one at a time (no second copy of the model on a
        GPU); a sharded checkpoint already in `path` (index and shards) is replaced. state_dict: the tensors to write
        in place of self.state_dict() (lib/training.py passes a model's whole tensors gathered from FSDP's shards)."""
        from safetensors.torch import save_file
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        dtype = dtype or next(self.parameters()).dtype
        tied = self.config.tie_word_embeddings
        state = {k: v.detach().to(dtype).cpu().contiguous() for k, v in (state_dict or self.state_dict()).items()
                 if not (tied and k == "lm_head.weight")}
        self.config.torch_dtype = str(dtype).removeprefix("torch.")
        meta = {"format": "pt", **(metadata or {})}
        atomic_write(path / "model.safetensors", lambda f: save_file(state, f, metadata=meta))
        index = path / "model.safetensors.index.json"
        if index.exists():  # a stale shard index would shadow the new file; its shards are stale weights
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
                for shard in set(json.loads(index.read_text())["weight_map"].values()) - {"model.safetensors"}:
                    (path / Path(shard).name).unlink(missing_ok=True)
            os.remove(index)
        self.config.save(path)


# bytes per element of the safetensors dtypes
SAFETENSORS_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
                      "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def safetensors_names(f):
    """The tensor names in a safetensors file, after checking its header against the file without reading the
    tensors: 8 bytes of header length, a JSON header, each tensor's byte range as long as its dtype and shape
    need, and the ranges ending exactly at the end of the file (a truncated copy fails here)."""
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else size
        if 8 + n > size:
            raise ValueError(f"{f}: truncated or not a safetensors file ({size:,} bytes, shorter than its header)")
        try:
            header = json.loads(fh.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ValueError(f"{f}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise ValueError(f"{f}: not a safetensors file (its header is not a JSON object)")
    header.pop("__metadata__", None)
    end = 0
    for name, t in header.items():
        try:
            begin, stop = t["data_offsets"]
            need = math.prod(t["shape"]) * SAFETENSORS_DTYPES.get(t["dtype"], 0)
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{f}: malformed safetensors header entry for {name!r}") from None
        if stop < begin or (need and stop - begin != need):
            raise ValueError(f"{f}: {name} takes bytes {begin}..{stop} but its {t['dtype']} {t['shape']} needs {need}")
        end = max(end, stop)
    if 8 + n + end != size:
        raise ValueError(f"{f}: the header describes {8 + n + end:,} bytes but the file has {size:,}: "
                         f"truncated or corrupt; copy it again")
    return set(header)


def open_weights(paths, config_class, who="merge"):
    """-> one {tensor name: safe_open handle} per checkpoint directory (nothing read yet; the stored lm_head of a
    checkpoint whose config (config_class, e.g. model.Qwen3Config) is tied left out: it is the embedding), after
    checking that all hold the same names and shapes (an embedding's rows up to those convert.py appends for a mask
    token: rows_with_mask); a one-line exit naming `who` otherwise."""
    from safetensors import SafetensorError, safe_open
    handles = []
    for path in paths:
        h = {}
        try:
            tied = config_class.load(path).tie_word_embeddings
            for f in weight_files(Path(path)):
                sf = safe_open(f, "pt")
                h.update({k: sf for k in sf.keys() if not (tied and k == "lm_head.weight")})
        except (FileNotFoundError, OSError, ValueError, SafetensorError) as e:
            raise SystemExit(f"{who}: {path}: {e}")
        handles.append(h)
    def same(a, b):  # equal, or an embedding with convert.py's mask rows appended to the other's (rows_with_mask)
        return a == b or len(a) == 2 and a[1:] == b[1:] and rows_with_mask(min(a[0], b[0])) == max(a[0], b[0])
    shapes = [{k: tuple(sf.get_slice(k).get_shape()) for k, sf in h.items()} for h in handles]
    for path, sh in zip(paths[1:], shapes[1:]):
        if sh.keys() != shapes[0].keys() or not all(same(s, shapes[0][k]) for k, s in sh.items()):
            diff = sorted(set(sh.items()) ^ set(shapes[0].items()))[:2]
            raise SystemExit(f"{who}: {path} and {paths[0]} hold different tensors (names or shapes), e.g. {diff}: "
                             f"they are not the same model")
    return handles


def read_tensor(handles, name, device="cpu"):
    """One tensor, in fp32 on `device`, from a checkpoint opened by open_weights."""
    return handles[name].get_tensor(name).to(device).float()


def weight_files(path):
    """The safetensors files of a checkpoint (one, or the shards its model.safetensors.index.json names), each
    checked by safetensors_names, and the index checked against the shards: ValueError naming the bad file."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            shards = {s: {k for k, v in weight_map.items() if v == s} for s in set(weight_map.values())}
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
            raise ValueError(f"{index}: not a valid shard index (JSON with a weight_map)") from None
    else:
        shards = {"model.safetensors": set()}
    files = []
    for s, names in sorted(shards.items()):
        f = path / s
        if not f.is_file():
            raise FileNotFoundError(f"{f} not found: no weights in {path}")
        if missing := names - safetensors_names(f):
            raise ValueError(f"{index} places {sorted(missing)[:3]} in {f}, which does not hold them")
        files.append(f)
    return files
