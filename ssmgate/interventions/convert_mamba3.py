"""Official Mamba-3 checkpoints (mamba_ssm, PyTorch, safetensors) -> ssmgate `LanguageModel` params.

SPEC 8 runs its interventions on the official Mamba-3 1.5B SISO and MIMO checkpoints, so their
PyTorch weights must become the parameter pytree of `ssmgate.models.lm.LanguageModel` with a
`ModelCfg(block="mamba3", ...)`. No torch here: a small safetensors reader (numpy + json) and a
name/layout map.

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

Semantics the shapes cannot show, checked on the config: the official decay is A = -max(softplus,
A_floor), so cfg.a_activation must be "softplus"; it always rotates (transition "native") with
rope_fraction 0.5 or 1.0. Its B/C norm eps is fixed at 1e-5 (ssmgate uses cfg.norm_eps) and its
A_floor defaults to 1e-4 (cfg.a_floor). Checkpoints with is_outproj_norm=True (a `mixer.norm.weight`)
have no ssmgate counterpart and are refused.
"""
from __future__ import annotations

import json
import math
import os
import re
from typing import Callable, Mapping, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.models import lm
from ssmgate.models.config import ModelCfg

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

def _check_cfg(cfg: ModelCfg) -> ModelCfg:
    """The config must describe what the official module computes (see module docstring)."""
    cfg = cfg.validate()
    wants = {"block": "mamba3", "transition": "native", "a_activation": "softplus"}
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


def infer_config(state_dict: Mapping[str, np.ndarray], **overrides) -> ModelCfg:
    """The ModelCfg an official Mamba-3 state dict describes, from its shapes; `overrides`
    (ModelCfg fields) replace inferred values, e.g. dtype="bfloat16"."""
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
                    rope_fraction=fraction, mimo_rank=R, a_activation="softplus")
    return _check_cfg(ModelCfg(**{**inferred, **overrides}))


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
    r"\.mixer\.norm\.weight$": "is_outproj_norm=True (gated output norm) has no ssmgate counterpart",
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


def load_official(path: PathLike, cfg: Optional[ModelCfg] = None, **overrides) -> dict:
    """Reads an official checkpoint (file, sharded directory or index json) and converts it.
    cfg None: inferred from the shapes (`infer_config(state_dict, **overrides)`)."""
    state_dict = load_safetensors(path)
    if cfg is None:
        cfg = infer_config(state_dict, **overrides)
    elif overrides:
        cfg = cfg.replace(**overrides)
    return convert_state_dict(state_dict, cfg)
