"""Official Mamba-3 checkpoints (mamba_ssm, PyTorch, safetensors) -> ssmgate `LanguageModel` params.

P2's interventions run on official Mamba-3 checkpoints, so their PyTorch weights must become the
parameter pytree of `ssmgate.models.lm.LanguageModel`. No torch here: a small safetensors reader
(numpy + json), upstream's config.json read into a ModelCfg (`config_from_upstream`) and a
name/layout map. docs/interventions.md says which upstream revisions and options load.

Official names (mamba_ssm/models/mixer_seq_simple.py + modules/mamba3.py, block.py, mlp.py) and
where they go (i = layer; H heads, P headdim, N d_state, G groups, R MIMO rank, r rotated pairs,
f MLP width; PyTorch Linear weights are (out, in), Flax kernels (in, out)):
  backbone.embedding.weight           (V, d)                  embed/embedding
  backbone.layers.i.norm.weight       (d,)                    layers_i/norm/scale
  backbone.layers.i.mixer.in_proj.weight (2 d_inner + 2 G N R + 3 H + r, d)  .../mixer/in_proj/kernel (T)
  backbone.layers.i.mixer.dt_bias     (H,)                    .../mixer/dt_bias
  backbone.layers.i.mixer.B_norm.weight, C_norm.weight (N,)   .../mixer/B_norm/scale, C_norm/scale
  backbone.layers.i.mixer.B_bias, C_bias (H, R, N)            .../mixer/B_bias, C_bias
  backbone.layers.i.mixer.D           (H,)                    .../mixer/D
  backbone.layers.i.mixer.mimo_x, mimo_z, mimo_o (H, R, P)    .../mixer/mimo_* (MIMO only)
  backbone.layers.i.mixer.out_proj.weight (d, d_inner)        .../mixer/out_proj/kernel (T)
  backbone.layers.i.norm2.weight      (d,)                    layers_i/mlp_norm/scale  (d_intermediate > 0)
  backbone.layers.i.mlp.fc1.weight    (2 f, d)                rows [:f] -> mlp/up, rows [f:] -> mlp/gate (T)
  backbone.layers.i.mlp.fc2.weight    (d, f)                  layers_i/mlp/down/kernel (T)
  backbone.norm_f.weight              (d,)                    final_norm/scale
  lm_head.weight                      (V, d)                  lm_head/kernel (T) when untied; when tied
                                                              it may be absent or must equal the embedding
(GatedMLP computes fc2(y * silu(gate)) with y, gate = fc1(x).chunk(2): y is ssmgate's `up`.)

MIMO state order. The official MIMO kernels rotate the state pairs (n, n + N/2), n < r (RoPE
"halves"), the SISO kernels the interleaved pairs (2n, 2n + 1) that ssmgate's cores use for both.
RMSNorm over N, the per-channel bias and the read-out contraction over N all commute with a
permutation of the N axis, so a MIMO checkpoint is converted exactly by reordering that axis
consistently in the B/C rows of in_proj, B_norm/C_norm and B_bias/C_bias (ssmgate channel 2n <-
official n, 2n + 1 <- official n + N/2).

The model comes from upstream's config.json beside the weights (MambaConfig's fields; ssm_cfg
holds Mamba3's keywords): every option either converts exactly, has no effect on the function
(NO_EFFECT), or is refused with an error naming it. The decay is A = -max(act(dd_A), A_floor)
with act = heavy tail since mamba_ssm HEAVY_TAIL_REVISION, softplus before; config.json does not
record which, so it is an argument (default heavy, the only activation of every upstream revision
whose LM class builds Mamba-3 layers), and `check_logits` / `reference=` catch a wrong one.
is_outproj_norm=True converts to OfficialMamba3Cfg(outproj_norm=True) (`mixer.norm.weight`).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Callable, Mapping, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.models import lm
from ssmgate.models.config import ModelCfg, OfficialMamba3Cfg

Path = tuple[str, ...]                  # a params leaf, e.g. ("layers_0", "mixer", "D")
PathLike = Union[str, "os.PathLike[str]"]

# ----------------------------------------------------------------------------- safetensors reader

# safetensors dtype tag -> little-endian numpy dtype of the stored bytes (BF16 read as raw uint16).
_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4",
           "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}
INDEX_NAME = "model.safetensors.index.json"


def bf16_to_float32(raw_u16: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32: bf16 is the high half of a float32."""
    return (raw_u16.astype(np.uint32) << 16).view(np.float32)


def _header(path: str, size: int, head: bytes) -> tuple[dict, int]:
    """Parses the length-prefixed JSON header; returns (entries, offset of the data section)."""
    if size < 8:
        raise ValueError(f"safetensors file {path!r} has {size} bytes; expected at least 8 (the header length)")
    n = int.from_bytes(head[:8], "little")
    if n > size - 8:
        raise ValueError(f"safetensors file {path!r}: header length {n} bytes but only {size - 8} bytes follow; "
                         f"expected a complete header (truncated or not a safetensors file)")
    try:
        entries = json.loads(head[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"safetensors file {path!r}: header is not valid UTF-8 JSON ({err}); "
                         f"expected {{name: {{dtype, shape, data_offsets}}}}") from None
    if not isinstance(entries, dict):
        raise ValueError(f"safetensors file {path!r}: header is a {type(entries).__name__}; expected a JSON object")
    entries.pop("__metadata__", None)
    return entries, 8 + n


def _entry_layout(path: str, name: str, entry, data_size: int) -> tuple[str, tuple[int, ...], int, int]:
    """Validated (dtype tag, shape, begin, end) of one header entry."""
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise ValueError(f"safetensors file {path!r}: entry {name!r} is {entry!r}; expected "
                         f"{{'dtype', 'shape', 'data_offsets'}}")
    tag, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if tag not in _DTYPES:
        raise ValueError(f"safetensors file {path!r}: tensor {name!r} has dtype {tag!r}; expected one of "
                         f"{sorted(_DTYPES)}")
    if (not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape)
            or not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and o >= 0 for o in offsets)):
        raise ValueError(f"safetensors file {path!r}: tensor {name!r} has shape {shape!r} and data_offsets "
                         f"{offsets!r}; expected a list of non-negative ints and [begin, end]")
    begin, end = offsets
    nbytes = math.prod(shape) * np.dtype(_DTYPES[tag]).itemsize
    if end - begin != nbytes:
        raise ValueError(f"safetensors file {path!r}: tensor {name!r} ({tag}, shape {tuple(shape)}) spans "
                         f"data_offsets [{begin}, {end}) = {end - begin} bytes; expected {nbytes}")
    if end > data_size:
        raise ValueError(f"safetensors file {path!r} is truncated: tensor {name!r} needs bytes [{begin}, {end}) "
                         f"of the data section, which has only {data_size} bytes")
    return tag, tuple(shape), begin, end


def read_safetensors(path: PathLike) -> dict[str, np.ndarray]:
    """All tensors of one .safetensors file as numpy arrays (BF16 -> float32, others as stored).
    The file is memory-mapped; arrays are copies, so the file can be closed or deleted afterwards."""
    path = os.fspath(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        head += f.read(min(n, max(size - 8, 0)))
    entries, data_start = _header(path, size, head)
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=data_start) if size > data_start else np.zeros(0, np.uint8)
    out = {}
    for name, entry in entries.items():
        tag, shape, begin, end = _entry_layout(path, name, entry, data.size)
        arr = np.frombuffer(data[begin:end].tobytes(), dtype=_DTYPES[tag]).reshape(shape)
        out[name] = bf16_to_float32(arr) if tag == "BF16" else arr
    return out


def _shard_files(path: PathLike) -> list[str]:
    """The .safetensors files a checkpoint path names: a file, an index json, or a directory
    (its index json when present, else every *.safetensors in it)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        index = os.path.join(path, INDEX_NAME)
        if os.path.exists(index):
            return _shard_files(index)
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
        if not files:
            raise FileNotFoundError(f"checkpoint directory {path!r} has no *.safetensors file and no {INDEX_NAME}")
        return files
    if path.endswith(".json"):
        with open(path) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"safetensors index {path!r} has no 'weight_map'; expected {{tensor name: shard file}}")
        root = os.path.dirname(path)
        return [os.path.join(root, f) for f in sorted(set(weight_map.values()))]
    return [path]


def load_safetensors(path: PathLike) -> dict[str, np.ndarray]:
    """All tensors of a checkpoint (file, sharded directory or index json), merged by name.
    With an index, every name it lists must be in the shard it names, and no shard may hold others."""
    path = os.fspath(path)
    files = _shard_files(path)
    merged: dict[str, np.ndarray] = {}
    owner: dict[str, str] = {}
    for file in files:
        for name, arr in read_safetensors(file).items():
            if name in merged:
                raise ValueError(f"tensor {name!r} is in both {owner[name]!r} and {file!r}; expected one shard")
            merged[name], owner[name] = arr, file
    index = os.path.join(path, INDEX_NAME) if os.path.isdir(path) else path
    if index.endswith(".json") and os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        root = os.path.dirname(index)
        wrong = sorted(n for n, f in weight_map.items() if owner.get(n) != os.path.join(root, f))
        extra = sorted(set(merged) - set(weight_map))
        if wrong or extra:
            raise ValueError(f"safetensors index {index!r} disagrees with its shards: listed but not found in the "
                             f"named shard {wrong[:10]}, in a shard but not listed {extra[:10]}")
    return merged


# ----------------------------------------------------------------------------- config

CONFIG_NAME = "config.json"
# The upstream revisions this converter is written against (github.com/state-spaces/mamba).
HEAVY_TAIL_REVISION = "c69aaab (2026-06-02)"   # decay -heavy_tail(dd_A) replaces -softplus(dd_A)
LM_REVISION = "b3cae1b (2026-06-10)"           # MambaLMHeadModel accepts ssm_cfg layer "Mamba3"

# MambaConfig's fields and defaults (mamba_ssm/models/config_mamba.py): config.json is its __dict__.
LM_DEFAULTS = {"d_model": 2560, "d_intermediate": 0, "n_layer": 64, "vocab_size": 50277, "ssm_cfg": {},
               "attn_layer_idx": [], "attn_cfg": {}, "rms_norm": True, "residual_in_fp32": True,
               "fused_add_norm": True, "pad_vocab_size_multiple": 8, "tie_embeddings": True}
# Mamba3.__init__'s keywords and defaults (mamba_ssm/modules/mamba3.py); ssm_cfg also holds "layer".
MAMBA3_DEFAULTS = {"d_state": 128, "expand": 2, "headdim": 64, "ngroups": 1, "rope_fraction": 0.5, "dt_min": 0.001,
                   "dt_max": 0.1, "dt_init_floor": 1e-4, "A_floor": 1e-4, "is_outproj_norm": False, "is_mimo": False,
                   "mimo_rank": 4, "fuse_pregate_headwise_norm": True, "chunk_size": 64, "dropout": 0.0}
# Keywords that do not change the function a trained model computes, and why.
NO_EFFECT = {"dt_min": "initialisation only", "dt_max": "initialisation only", "dt_init_floor": "initialisation only",
             "chunk_size": "the kernels' tiling", "dropout": "absorbed and unused by Mamba3",
             "fuse_pregate_headwise_norm": "fused or not, the same out-proj norm",
             "fused_add_norm": "fused or not, the same add + norm",
             "residual_in_fp32": "rounding only (ssmgate's residual stream is always float32)"}
# ModelCfg fields config.json does not decide: free to set.
FREE_FIELDS = ("dtype", "algorithm", "chunk_size")
GATED_MLP_MULTIPLE = 128  # GatedMLP rounds its hidden width up to a multiple of this


def config_path(path: PathLike) -> str:
    """Where upstream's config.json of a checkpoint (file, shard folder or index json) is: beside it."""
    path = os.fspath(path)
    return os.path.join(path if os.path.isdir(path) else os.path.dirname(path), CONFIG_NAME)


def read_config(path: PathLike) -> Optional[dict]:
    """The checkpoint's config.json as a dict, or None when there is none."""
    where = config_path(path)
    if not os.path.exists(where):
        return None
    with open(where) as f:
        try:
            config = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not valid JSON ({err}); expected mamba_ssm's MambaConfig as JSON") from None
    if not isinstance(config, dict):
        raise ValueError(f"{where}: a JSON {type(config).__name__}; expected an object (MambaConfig's fields)")
    return config


def _fail(what: str, expected: str):
    raise ValueError(f"convert_mamba3: config.json {what}; expected {expected}")


_JSON_TYPES = {bool: "true or false", int: "an integer", float: "a number", dict: "an object", list: "an array",
               str: "a string"}


def _json_type(value) -> str:
    return next((name for t, name in _JSON_TYPES.items() if isinstance(value, t)), "null")


# Keys whose default is an integer but which upstream takes as any number: Mamba3 computes
# d_inner = int(expand * d_model), so expand=1.5 is legal JSON there and is judged by its value below.
_NUMBER_KEYS = {"expand"}


def _check_types(values: Mapping, defaults: Mapping, prefix: str = "") -> None:
    """Every value of a known key has the JSON type of its default (an object may also be null):
    a string d_model or a list ssm_cfg is named here, not met later as a TypeError."""
    for key, default in defaults.items():
        if key not in values:
            continue
        value, kind = values[key], float if key in _NUMBER_KEYS else type(default)
        ok = {bool: lambda v: isinstance(v, bool),
              int: lambda v: isinstance(v, int) and not isinstance(v, bool),
              float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              dict: lambda v: v is None or isinstance(v, dict)}.get(kind, lambda v: isinstance(v, kind))(value)
        if not ok:
            _fail(f"{prefix}{key}={value!r} is {_json_type(value)}", f"{_JSON_TYPES[kind]} (mamba_ssm's MambaConfig)")


def config_from_upstream(config: Mapping, *, a_activation: Optional[str] = None, **overrides) -> ModelCfg:
    """The ModelCfg of an upstream MambaLMHeadModel config (config.json's dict). Every field that
    config.json decides is set from it; `overrides` may restate those (a different value is an
    error naming both) and set the free ones (FREE_FIELDS). `a_activation` is the decay activation,
    which no config.json records: None takes "heavy", because upstream's LM class builds Mamba-3
    layers only from LM_REVISION on, after HEAVY_TAIL_REVISION; say "softplus" for weights trained
    before that change (docs/interventions.md). Options that cannot convert exactly are refused by name."""
    unknown = sorted(set(config) - set(LM_DEFAULTS))
    if unknown:
        _fail(f"has keys {unknown} that mamba_ssm's MambaConfig does not take",
              f"only {sorted(LM_DEFAULTS)} (upstream's from_pretrained would refuse them too)")
    _check_types(config, LM_DEFAULTS)
    lm = {**LM_DEFAULTS, **config}
    ssm = dict(lm["ssm_cfg"] or {})
    _check_types(ssm, MAMBA3_DEFAULTS, prefix="ssm_cfg.")
    layer = ssm.pop("layer", "Mamba1")
    if layer != "Mamba3":
        _fail(f"ssm_cfg.layer={layer!r} (missing means 'Mamba1')", "'Mamba3'")
    unknown = sorted(set(ssm) - set(MAMBA3_DEFAULTS))
    if unknown:
        _fail(f"ssm_cfg has keys {unknown} that this converter does not know (Mamba3 absorbs unknown keywords "
              "silently, so a newer upstream option could change the model unseen)",
              f"only {sorted(MAMBA3_DEFAULTS)}, the keywords of Mamba3 at {LM_REVISION} and later")
    m = {**MAMBA3_DEFAULTS, **ssm}
    if lm["attn_layer_idx"]:
        _fail(f"attn_layer_idx={lm['attn_layer_idx']} (attention layers in the stack)",
              "[] (ssmgate's Mamba-3 language model has no hybrid attention layers)")
    if not lm["rms_norm"]:
        _fail("rms_norm=False (LayerNorm blocks)", "rms_norm=True (ssmgate's Mamba stack uses RMSNorm)")
    if m["rope_fraction"] not in (0.5, 1.0):
        _fail(f"ssm_cfg.rope_fraction={m['rope_fraction']!r}", "0.5 or 1.0 (Mamba3 asserts it)")
    d_model, expand, n = lm["d_model"], m["expand"], m["d_state"]
    d_inner = int(expand * d_model)
    if d_inner != expand * d_model or d_inner % d_model:
        _fail(f"ssm_cfg.expand={expand!r} with d_model={d_model}", "an integer expand (ssmgate's d_inner = expand * d_model)")
    mimo = bool(m["is_mimo"])
    rank = int(m["mimo_rank"]) if mimo else 1   # Mamba3 ignores mimo_rank without is_mimo
    # The kernels pair state channels (2i, 2i + 1) (SISO) or split N into halves / quarters (MIMO).
    multiple = (4 if m["rope_fraction"] == 0.5 else 2) if mimo else 2
    if n % multiple:
        _fail(f"ssm_cfg.d_state={n} with is_mimo={mimo}, rope_fraction={m['rope_fraction']}",
              f"a multiple of {multiple} (the layout of the rotated state pairs)")
    if m["A_floor"] <= 0:
        _fail(f"ssm_cfg.A_floor={m['A_floor']!r}", "a value > 0")
    vocab, pad = lm["vocab_size"], lm["pad_vocab_size_multiple"]
    f = lm["d_intermediate"]
    if a_activation is None:
        a_activation = "heavy"
    decided = dict(block="mamba3", transition="native", vocab_size=-(-vocab // pad) * pad, d_model=d_model,
                   n_layers=lm["n_layer"], tie_embeddings=bool(lm["tie_embeddings"]),
                   mlp="swiglu" if f else "none",
                   d_mlp=-(-f // GATED_MLP_MULTIPLE) * GATED_MLP_MULTIPLE if f else 0,
                   norm_eps=1e-5,  # MambaLMHeadModel never passes norm_epsilon; B/C and out-proj norms fix 1e-5
                   d_state=n, expand=d_inner // d_model, headdim=m["headdim"], n_groups=m["ngroups"],
                   rope_fraction=float(m["rope_fraction"]), mimo_rank=rank, a_floor=float(m["A_floor"]),
                   a_activation=a_activation, outproj_norm=bool(m["is_outproj_norm"]))
    clash = [f"{k}={v!r} (config.json gives {decided[k]!r})" for k, v in overrides.items()
             if k in decided and v != decided[k]]
    if clash:
        raise ValueError(f"convert_mamba3: overrides contradict the checkpoint's config.json: {'; '.join(clash)}; "
                         f"expected overrides of {FREE_FIELDS} only, or values equal to config.json's")
    unknown = sorted(set(overrides) - set(decided) - set(FREE_FIELDS))
    if unknown:
        raise ValueError(f"convert_mamba3: overrides {unknown} are not ModelCfg fields this converter sets; "
                         f"expected some of {FREE_FIELDS}")
    try:
        return _check_cfg(_make_cfg({**decided, **overrides}))
    except ValueError as err:
        raise ValueError(f"convert_mamba3: config.json describes no valid model: {err}") from None


def _check_cfg(cfg: ModelCfg) -> ModelCfg:
    """The config must describe what the official module computes (see module docstring)."""
    cfg = cfg.validate()
    wants = {"block": "mamba3", "transition": "native"}
    for field, value in wants.items():
        if getattr(cfg, field) != value:
            raise ValueError(f"convert_mamba3: ModelCfg.{field}={getattr(cfg, field)!r}; expected {value!r} "
                             f"(the official Mamba-3 module)")
    if cfg.rope_fraction not in (0.5, 1.0):
        raise ValueError(f"convert_mamba3: ModelCfg.rope_fraction={cfg.rope_fraction!r}; expected 0.5 or 1.0 "
                         f"(the official module asserts it)")
    if cfg.mlp not in ("none", "swiglu"):
        raise ValueError(f"convert_mamba3: ModelCfg.mlp={cfg.mlp!r}; expected 'none' or 'swiglu' (GatedMLP)")
    return cfg


def _make_cfg(fields: dict) -> ModelCfg:
    """A plain ModelCfg unless the out-proj norm needs OfficialMamba3Cfg (see models/config.py)."""
    if fields.get("outproj_norm"):
        return OfficialMamba3Cfg(**fields)
    return ModelCfg(**{k: v for k, v in fields.items() if k != "outproj_norm"})


def _outproj_norm(cfg: ModelCfg) -> bool:
    return bool(getattr(cfg, "outproj_norm", False))


def check_against_config(cfg: ModelCfg, official: ModelCfg) -> ModelCfg:
    """`cfg` (a caller's) must agree with the checkpoint's config.json (`official`) on every field
    config.json decides; FREE_FIELDS and a_activation are the caller's."""
    fields = [f.name for f in dataclasses.fields(official)]
    clash = [f"{k}={getattr(cfg, k, None)!r} (config.json gives {getattr(official, k)!r})" for k in fields
             if k not in FREE_FIELDS + ("a_activation",) and getattr(cfg, k, False if k == "outproj_norm" else None)
             != getattr(official, k)]
    if clash:
        raise ValueError(f"convert_mamba3: the given ModelCfg contradicts the checkpoint's config.json: "
                         f"{'; '.join(clash)}; expected the values config.json gives")
    return official.replace(**{k: getattr(cfg, k) for k in FREE_FIELDS + ("a_activation",)})


def infer_config(state_dict: Mapping[str, np.ndarray], *, a_activation: Optional[str] = None,
                 **overrides) -> ModelCfg:
    """The ModelCfg an official Mamba-3 state dict describes from its shapes alone (for weights
    without their config.json); `overrides` (ModelCfg fields) replace inferred values. The decay
    activation is not in the weights, so `a_activation` must be given."""
    if a_activation not in ("heavy", "softplus"):
        raise ValueError(f"infer_config: a_activation={a_activation!r}; expected 'heavy' (mamba_ssm since "
                         f"{HEAVY_TAIL_REVISION}) or 'softplus' (before): weights without config.json do not "
                         "tell which decay activation they were trained with")
    def shape(key):
        if key not in state_dict:
            raise KeyError(f"infer_config: no {key!r} in the state dict; expected an official Mamba-3 LM checkpoint")
        return tuple(state_dict[key].shape)

    vocab, d = shape("backbone.embedding.weight")
    layer_ids = {int(m.group(1)) for k in state_dict if (m := re.match(r"backbone\.layers\.(\d+)\.", k))}
    if layer_ids != set(range(len(layer_ids))) or not layer_ids:
        raise ValueError(f"infer_config: layer indices {sorted(layer_ids)}; expected 0 .. n_layers - 1")
    mixer = "backbone.layers.0.mixer."
    (h,) = shape(mixer + "D")
    _, R, n = shape(mixer + "B_bias")
    d_out, d_inner = shape(mixer + "out_proj.weight")
    if d_inner % d or d_inner % h:
        raise ValueError(f"infer_config: d_inner {d_inner} (out_proj) is not a multiple of d_model {d} and of "
                         f"the {h} heads; expected integer expand and headdim")
    width = shape(mixer + "in_proj.weight")[0]
    fraction, groups = _rope_and_groups(width, d_inner, h, n, R)
    lm_head = state_dict.get("lm_head.weight")
    tied = lm_head is None or np.array_equal(lm_head, state_dict["backbone.embedding.weight"])
    mlp = "backbone.layers.0.mlp.fc2.weight" in state_dict
    inferred = dict(block="mamba3", vocab_size=vocab, d_model=d, n_layers=len(layer_ids), tie_embeddings=tied,
                    mlp="swiglu" if mlp else "none", d_mlp=shape("backbone.layers.0.mlp.fc2.weight")[1] if mlp else 0,
                    d_state=n, expand=d_inner // d, headdim=d_inner // h, n_groups=groups, transition="native",
                    rope_fraction=fraction, mimo_rank=R, a_activation=a_activation,
                    outproj_norm=mixer + "norm.weight" in state_dict)
    return _check_cfg(_make_cfg({**inferred, **overrides}))


def _rope_and_groups(width: int, d_inner: int, h: int, n: int, R: int) -> tuple[float, int]:
    """Solves width = 2 d_inner + 2 G N R + 3 H + r for (rope_fraction, G), r = int(N f) // 2."""
    for fraction in (0.5, 1.0):
        rest = width - 2 * d_inner - 3 * h - int(n * fraction) // 2
        if rest > 0 and rest % (2 * n * R) == 0 and h % (rest // (2 * n * R)) == 0:
            return fraction, rest // (2 * n * R)
    raise ValueError(f"infer_config: in_proj has {width} output rows; expected 2 d_inner + 2 G N R + 3 H + r with "
                     f"d_inner={d_inner}, N={n}, R={R}, H={h}, G dividing H and r = N/4 or N/2")


# ----------------------------------------------------------------------------- the name/layout map

def mimo_state_order(n: int) -> np.ndarray:
    """ssmgate state channel j reads official channel order[j]: 2i <- i, 2i + 1 <- i + N/2
    (the official MIMO kernels pair (i, i + N/2), ssmgate pairs (2i, 2i + 1))."""
    if n % 2:
        raise ValueError(f"mimo_state_order: d_state {n} is odd; expected an even state size")
    return np.stack([np.arange(n // 2), np.arange(n // 2) + n // 2], axis=1).reshape(n)


def _in_proj_columns(cfg: ModelCfg) -> np.ndarray:
    """Row order of the official in_proj weight that gives ssmgate's in_proj kernel columns:
    identity, except that MIMO reorders N inside each (rank, group) block of B and of C."""
    d_inner, g, n, R, h = cfg.d_inner, cfg.n_groups, cfg.d_state, cfg.mimo_rank, cfg.n_ssm_heads
    order = np.arange(2 * d_inner + 2 * g * n * R + 3 * h + cfg.n_rot_pairs)
    if R > 1:
        within = mimo_state_order(n)
        for start in (2 * d_inner, 2 * d_inner + g * n * R):  # B block, then C block, each (r g n)
            blocks = order[start:start + g * n * R].reshape(R * g, n)
            order[start:start + g * n * R] = blocks[:, within].reshape(-1)
    return order


Rule = tuple[tuple[int, ...], Callable[[np.ndarray], dict[Path, np.ndarray]]]


def _rules(cfg: ModelCfg, shapes: Mapping[Path, tuple[int, ...]]) -> dict[str, Rule]:
    """Official key -> (expected official shape, fn(array) -> {ssmgate path: array}). Expected
    shapes come from the ssmgate shapes through the inverse layout, so init_params is the one
    source of truth."""
    def copy(path, order=None):
        if order is None:
            return shapes[path], lambda a: {path: a}
        return shapes[path], lambda a: {path: a[..., order]}

    def linear(path, columns=None):
        def fn(a):
            kernel = a.T if columns is None else a[columns].T
            return {path: np.ascontiguousarray(kernel)}
        return shapes[path][::-1], fn

    rules: dict[str, Rule] = {"backbone.embedding.weight": copy(("embed", "embedding")),
                              "backbone.norm_f.weight": copy(("final_norm", "scale"))}
    if not cfg.tie_embeddings:
        rules["lm_head.weight"] = linear(("lm_head", "kernel"))
    order = mimo_state_order(cfg.d_state) if cfg.mimo_rank > 1 else None
    for i in range(cfg.n_layers):
        key, path = f"backbone.layers.{i}.", (f"layers_{i}",)
        mixer, mpath = key + "mixer.", path + ("mixer",)
        rules[key + "norm.weight"] = copy(path + ("norm", "scale"))
        rules[mixer + "in_proj.weight"] = linear(mpath + ("in_proj", "kernel"), _in_proj_columns(cfg))
        rules[mixer + "out_proj.weight"] = linear(mpath + ("out_proj", "kernel"))
        for name in ("dt_bias", "D"):
            rules[mixer + name] = copy(mpath + (name,))
        for bc in ("B", "C"):
            rules[mixer + f"{bc}_norm.weight"] = copy(mpath + (f"{bc}_norm", "scale"), order)
            rules[mixer + f"{bc}_bias"] = copy(mpath + (f"{bc}_bias",), order)
        if cfg.mimo_rank > 1:
            for name in ("mimo_x", "mimo_z", "mimo_o"):
                rules[mixer + name] = copy(mpath + (name,))
        if _outproj_norm(cfg):  # (d_inner,) in (h p) order, headdim groups: ssmgate's layout too
            rules[mixer + "norm.weight"] = copy(mpath + ("out_norm_scale",))
        if cfg.mlp == "swiglu":
            rules[key + "norm2.weight"] = copy(path + ("mlp_norm", "scale"))
            rules[key + "mlp.fc1.weight"] = _fc1_rule(shapes, path + ("mlp",))
            rules[key + "mlp.fc2.weight"] = linear(path + ("mlp", "down", "kernel"))
    return rules


def _fc1_rule(shapes: Mapping[Path, tuple[int, ...]], mlp: Path) -> Rule:
    """GatedMLP.fc1 (2f, d): y = rows [:f] (ssmgate `up`), gate = rows [f:]."""
    d, f = shapes[mlp + ("up", "kernel")]

    def fn(a):
        return {mlp + ("up", "kernel"): np.ascontiguousarray(a[:f].T),
                mlp + ("gate", "kernel"): np.ascontiguousarray(a[f:].T)}
    return (2 * f, d), fn


# Keys some mamba_ssm checkpoints carry that this model cannot take, with the reason.
_UNSUPPORTED = {
    r"\.mixer\.norm\.weight$": "is_outproj_norm=True checkpoints need OfficialMamba3Cfg(outproj_norm=True)",
    r"\.mixer\.A_log$": "an A_log parameter belongs to Mamba-2 or the old Mamba3Simple, not the official Mamba3",
    r"\.mixer\.conv1d\.": "a causal conv belongs to Mamba-1/2; Mamba-3 has none",
    r"\.norm(2|_f)?\.bias$": "LayerNorm (rms_norm=False) stacks are not supported; ssmgate's Mamba stack uses RMSNorm",
}


_SHAPE_FIELDS = ("vocab_size", "d_model", "n_layers", "tie_embeddings", "mlp", "d_mlp", "d_state", "expand",
                 "headdim", "n_groups", "rope_fraction", "mimo_rank")


def _brief(cfg: ModelCfg) -> str:
    """The ModelCfg fields that decide the checkpoint's names and shapes."""
    return "ModelCfg(" + ", ".join(f"{f}={getattr(cfg, f)!r}" for f in _SHAPE_FIELDS) + ")"


def _key_error(missing: list[str], unexpected: list[str], cfg: ModelCfg) -> ValueError:
    def listed(keys):
        return f"{keys[:20]}" + (f" and {len(keys) - 20} more" if len(keys) > 20 else "")

    hints = sorted({why for k in unexpected for pat, why in _UNSUPPORTED.items() if re.search(pat, k)})
    return ValueError(
        f"convert_state_dict: state dict does not match {_brief(cfg)}: missing {len(missing)} keys {listed(missing)}; "
        f"unexpected {len(unexpected)} keys {listed(unexpected)}" + (f". Notes: {'; '.join(hints)}" if hints else "")
        + "; expected exactly the official Mamba-3 LM keys for this config (see infer_config)")


def expected_shapes(cfg: ModelCfg) -> dict[Path, tuple[int, ...]]:
    """Leaf path -> shape of `lm.init_params(cfg, key)`, traced without allocating."""
    tree = jax.eval_shape(lambda k: lm.init_params(cfg, k), jax.random.PRNGKey(0))
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {tuple(str(k.key) for k in kp): tuple(leaf.shape) for kp, leaf in leaves}


def _nest(flat: Mapping[Path, np.ndarray]) -> dict:
    tree: dict = {}
    for path, value in flat.items():
        node = tree
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = jnp.asarray(value, jnp.float32)
    return tree


def convert_state_dict(state_dict: Mapping[str, np.ndarray], cfg: ModelCfg) -> dict:
    """ssmgate params (float32 jax arrays) of an official Mamba-3 LM state dict. Every key must be
    used and every shape must fit `cfg`; otherwise a ValueError lists the offending keys."""
    cfg = _check_cfg(cfg)
    shapes = expected_shapes(cfg)
    rules = _rules(cfg, shapes)
    optional = {"lm_head.weight"} if cfg.tie_embeddings else set()
    missing = sorted(set(rules) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(rules) - optional)
    if missing or unexpected:
        raise _key_error(missing, unexpected, cfg)
    bad = [f"{k!r} has shape {tuple(np.shape(state_dict[k]))}, expected {shape}"
           for k, (shape, _) in rules.items() if tuple(np.shape(state_dict[k])) != shape]
    if cfg.tie_embeddings and "lm_head.weight" in state_dict:
        head, embed = state_dict["lm_head.weight"], state_dict["backbone.embedding.weight"]
        if np.shape(head) != np.shape(embed) or not np.array_equal(head, embed):
            raise ValueError("convert_state_dict: 'lm_head.weight' differs from 'backbone.embedding.weight' but "
                             "cfg.tie_embeddings is True; expected ModelCfg(tie_embeddings=False) for an untied head")
    if bad:
        raise ValueError(f"convert_state_dict: {len(bad)} arrays do not fit {_brief(cfg)}: " + "; ".join(bad))
    flat: dict[Path, np.ndarray] = {}
    for key, (_, fn) in rules.items():
        flat.update(fn(np.asarray(state_dict[key], np.float32)))
    if set(flat) != set(shapes):  # a rule table that misses a leaf is a bug here, not in the checkpoint
        raise AssertionError(f"convert_state_dict: produced leaves differ from init_params: missing "
                             f"{sorted(set(shapes) - set(flat))}, extra {sorted(set(flat) - set(shapes))}")
    return _nest(flat)


def max_relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max over positions of max|got - want| / max|want| (per position, over the vocabulary)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = np.maximum(np.abs(want).max(-1), 1e-30)
    return float((np.abs(got - want).max(-1) / scale).max())


def check_logits(cfg: ModelCfg, params, tokens: np.ndarray, want: np.ndarray, rtol: float = 1e-3) -> float:
    """The converted model's logits on `tokens` (b, t) against the upstream model's `want` (b, t, V):
    returns the max relative error (`max_relative_error`), or raises ValueError above `rtol`. The
    guard for what config.json cannot say, chiefly the decay activation."""
    got = np.asarray(lm.logits(lm.build_model(cfg), params, np.asarray(tokens, np.int32)))
    if got.shape != np.shape(want):
        raise ValueError(f"check_logits: the reference logits have shape {np.shape(want)}; the model gives {got.shape}")
    err = max_relative_error(got, want)
    if not err <= rtol:
        raise ValueError(f"check_logits: converted logits differ from the reference by {err:.3g} (max relative, "
                         f"allowed {rtol:g}) with a_activation={cfg.a_activation!r}; expected agreement. Weights "
                         f"trained before mamba_ssm {HEAVY_TAIL_REVISION} need a_activation='softplus', later ones "
                         f"'heavy'")
    return err


def load_official(path: PathLike, cfg: Optional[ModelCfg] = None, *, a_activation: Optional[str] = None,
                  reference: Optional[PathLike] = None, **overrides) -> dict:
    """Reads an official checkpoint (file, sharded directory or index json) and converts it.

    The model is upstream's config.json beside the weights (`official_config`); a given `cfg` or
    `overrides` must agree with it (they may set FREE_FIELDS and the activation). Without a
    config.json, `cfg` is taken as given (shapes still checked), or inferred from the shapes with
    an explicit `a_activation`. `reference`: an .npz with `tokens` (b, t) and the upstream model's
    `logits` (b, t, V) on them; the converted model must reproduce them (`check_logits`)."""
    state_dict = load_safetensors(path)
    cfg = official_config(path, cfg, a_activation=a_activation, state_dict=state_dict, **overrides)
    params = convert_state_dict(state_dict, cfg)
    if reference is not None:
        with np.load(os.fspath(reference)) as ref:
            check_logits(cfg, params, ref["tokens"], ref["logits"])
    return params


def official_config(path: PathLike, cfg: Optional[ModelCfg] = None, *, a_activation: Optional[str] = None,
                    state_dict: Optional[Mapping[str, np.ndarray]] = None, **overrides) -> ModelCfg:
    """The ModelCfg `load_official` converts a checkpoint with (see there); reads only config.json
    unless it must infer from the shapes."""
    config = read_config(path)
    if config is not None:
        if cfg is None:
            return config_from_upstream(config, a_activation=a_activation, **overrides)
        official = config_from_upstream(config, a_activation=a_activation or cfg.a_activation)
        return check_against_config(cfg.replace(**overrides) if overrides else cfg, official)
    if cfg is not None:
        return _check_cfg(cfg.replace(**overrides, **({"a_activation": a_activation} if a_activation else {})))
    if state_dict is None:
        state_dict = load_safetensors(path)
    return infer_config(state_dict, a_activation=a_activation, **overrides)
