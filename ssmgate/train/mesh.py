"""One device mesh with axes ("replica", "data", "model"), and where every array lives on it.

A parameter's sharding is decided in two steps:
1. PARTITION_TABLE maps its path to logical axes, what each dimension *is* (vocab, embed,
   inner, heads, mlp); the first row whose pattern matches the path and whose rank matches the
   leaf wins;
2. the mode maps logical axes to mesh axes: fsdp puts "embed" on "data", tp puts
   "inner"/"heads"/"mlp"/"vocab" on "model", fsdp_tp does both.
A dimension its mesh axis does not divide stays replicated, and the plan records it in its notes
(shown by --dry_run). A path no row matches (a new module) is replicated except its leading axis,
which fsdp shards when divisible, so new modules work before anyone writes their row.

Sweeps put a leading replica axis on every state leaf (`replica_axis=True`), sharded over "replica".
"""
from __future__ import annotations

import dataclasses
import fnmatch
import math
from typing import Any, Callable, NamedTuple

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec as P

from ssmgate.tree_paths import path_str, path_tuple

AXES = ("replica", "data", "model")
MODES = ("replicated", "fsdp", "tp", "fsdp_tp")
LEADING = "leading"  # logical axis of an unknown param's first dimension

# (pattern on "/" + param path, logical axes per dimension); None = never sharded. Names are
# those of ssmgate.models (LanguageModel and its blocks).
PARTITION_TABLE = (
    # token maps
    ("*/embed/embedding", ("vocab", "embed")),
    ("*/lm_head/kernel", ("embed", "vocab")),
    # SSM mixers: projections into and out of the inner width, the depthwise conv over it,
    # per-head gate and skip parameters, Mamba-3's per-head B/C biases and MIMO mixing weights
    ("*/in_proj/kernel", ("embed", "inner")),
    ("*/out_proj/kernel", ("inner", "embed")),
    ("*/conv/kernel", (None, "inner")),  # (width, channels)
    ("*/conv/bias", ("inner",)),
    ("*/A_log", ("heads",)),
    ("*/dt_bias", ("heads",)),
    ("*/D", ("heads",)),
    ("*/[BC]_bias", ("heads", None, None)),  # (heads, rank, state)
    ("*/mimo_[xzo]", ("heads", None, None)),  # (heads, rank, headdim)
    ("*/static_angle", ("heads", None)),  # (heads, pairs)
    # attention, heads fused: (embed, heads * head_dim) in, (heads * head_dim, embed) out
    ("*/attn/query/kernel", ("embed", "heads")),
    ("*/attn/key/kernel", ("embed", "heads")),
    ("*/attn/value/kernel", ("embed", "heads")),
    ("*/attn/query/bias", ("heads",)),
    ("*/attn/key/bias", ("heads",)),
    ("*/attn/value/bias", ("heads",)),
    ("*/attn/out/kernel", ("heads", "embed")),
    ("*/attn/out/bias", ("embed",)),
    # MLPs: up and gate (SwiGLU) in, down out
    ("*/mlp/up/kernel", ("embed", "mlp")),
    ("*/mlp/gate/kernel", ("embed", "mlp")),
    ("*/mlp/up/bias", ("mlp",)),
    ("*/mlp/gate/bias", ("mlp",)),
    ("*/mlp/down/kernel", ("mlp", "embed")),
    ("*/mlp/down/bias", ("embed",)),
    # norms (block, final, gated, B/C): small, replicated
    ("*norm*/scale", (None,)),
    ("*norm*/bias", (None,)),
)

_FSDP = {"embed": "data", LEADING: "data"}
_TP = {"inner": "model", "heads": "model", "mlp": "model", "vocab": "model"}
MODE_RULES = {"replicated": {}, "fsdp": _FSDP, "tp": _TP, "fsdp_tp": {**_FSDP, **_TP}}


@dataclasses.dataclass(frozen=True)
class MeshCfg:
    replica: int = 1
    data: int = -1          # -1: all devices left after replica and model
    model: int = 1
    params: str = "replicated"  # one of MODES
    microbatches: int = 1   # the step's batch in this many slices, gradients accumulated (train/step.py)
    remat: bool = False     # recompute each layer's activations in the backward pass (models/lm.py)
    loss_chunk: int = 0     # score the text loss this many positions at a time (train/chunked_loss.py); 0: at once

    def validate(self) -> "MeshCfg":
        for field in ("replica", "model", "microbatches"):
            if getattr(self, field) < 1:
                raise ValueError(f"--mesh_{field}={getattr(self, field)}: expected an integer >= 1")
        if self.loss_chunk < 0:
            raise ValueError(f"--mesh_loss_chunk={self.loss_chunk}: expected a number of positions >= 1, or 0 to "
                             "score the whole sequence at once")
        if self.data != -1 and self.data < 1:
            raise ValueError(f"--mesh_data={self.data}: expected an integer >= 1, or -1 for all remaining devices")
        if self.params not in MODES:
            raise ValueError(f"MeshCfg.params={self.params!r}: expected one of {MODES}")
        return self

    def axis_sizes(self, n_devices: int) -> tuple[int, int, int]:
        """(replica, data, model) for `n_devices`, resolving data = -1."""
        self.validate()
        r, m = self.replica, self.model
        d = n_devices // (r * m) if self.data == -1 else self.data
        if r * d * m != n_devices:
            data = "-1 (all remaining)" if self.data == -1 else str(self.data)
            raise ValueError(
                f"--mesh_replica={r} x --mesh_data={data} x --mesh_model={m} does not match the {n_devices} "
                f"devices: expected sizes whose product is {n_devices}")
        return r, d, m


def check_batch(batch: int, data: int, microbatches: int = 1) -> None:
    """A global batch must split evenly over the `data` axis (each device its own rows), and each
    device's rows into the step's microbatches."""
    if data > 0 and batch % data:
        raise ValueError(f"--batch={batch} does not split over the data axis of {data} devices "
                         f"(--mesh_data={data}): expected a multiple of {data}")
    if microbatches > 1 and batch % (max(data, 1) * microbatches):
        raise ValueError(f"--batch={batch} does not split into --mesh_microbatches={microbatches} on each of the "
                         f"{max(data, 1)} devices of the data axis: expected a multiple of {max(data, 1) * microbatches}")


def check_replicas(replicas: int, slices: int, whose: str = "the sweep's",
                   grid: str = "seeds x learning rates x offsets") -> None:
    """A sweep's replicas must split evenly over the `replica` axis: each replica's batch rows sit on
    one slice of it."""
    if replicas % slices:
        raise ValueError(f"--mesh_replica={slices} does not divide {whose} {replicas} replicas ({grid}); expected a "
                         f"divisor of {replicas}, or the devices on the batch instead (--mesh_replica=1, --mesh_data)")


def make_mesh(cfg: MeshCfg, devices=None) -> Mesh:
    devices = list(jax.devices() if devices is None else devices)
    sizes = cfg.axis_sizes(len(devices))
    try:  # topology-aware order (matters on TPU); plain order where the helper cannot place it
        grid = mesh_utils.create_device_mesh(sizes, devices, allow_split_physical_axes=True)
    except (ValueError, NotImplementedError, AssertionError):
        grid = np.asarray(devices).reshape(sizes)
    return Mesh(grid, AXES)


def mesh_for_description(cfg: MeshCfg) -> tuple[Mesh | AbstractMesh, str]:
    """(mesh, note) for --dry_run: the real mesh when the sizes fit the local devices, else an
    AbstractMesh of the requested sizes, so a pod-scale plan can be checked on a laptop."""
    try:
        return make_mesh(cfg), ""
    except ValueError:
        if cfg.data == -1:  # "all remaining devices" means nothing without the devices
            raise
        sizes = cfg.axis_sizes(cfg.replica * cfg.data * cfg.model)
        return AbstractMesh(sizes, AXES), f" (abstract: {math.prod(sizes)} devices, {jax.device_count()} here)"


# ---------------------------------------------------------------------------- params

def logical_axes(path: str, ndim: int):
    """The PARTITION_TABLE row for a param path (as path_str writes it) and rank; None if no row."""
    for pattern, axes in PARTITION_TABLE:
        if len(axes) == ndim and fnmatch.fnmatchcase("/" + path, pattern):
            return axes
    return None


def _mesh_axes(path, shape, logical, mesh, rules, notes) -> list:
    spec, used = [], set()
    for dim, (size, name) in enumerate(zip(shape, logical)):
        axis = rules.get(name)
        if axis is not None and axis in used:
            notes.append(f"{path}: dim {dim} ({name}) wants '{axis}' again: replicated")
            axis = None
        elif axis is not None and size % mesh.shape[axis]:
            notes.append(f"{path}: dim {dim} ({name}, size {size}) not divisible by "
                         f"{axis}={mesh.shape[axis]}: replicated")
            axis = None
        spec.append(axis)
        used.add(axis)
    return spec


def _replica_spec(path, shape, mesh, notes) -> list:
    if not shape:
        raise ValueError(f"{path}: a scalar has no leading replica axis (expected shape (replicas, ...))")
    if shape[0] % mesh.shape["replica"]:
        notes.append(f"{path}: {shape[0]} replicas not divisible by replica={mesh.shape['replica']}: replicated")
        return [None]
    return ["replica"]


class ShardingPlan(NamedTuple):
    specs: Any               # the params' tree of PartitionSpec
    notes: tuple[str, ...]   # every default and every fallback to replicated, for --dry_run


def partition_specs(params_shape, mesh: Mesh, mode: str, *, replica_axis: bool = False) -> ShardingPlan:
    """PartitionSpecs for params (arrays or ShapeDtypeStructs); with `replica_axis` every leaf has
    a leading replica dimension, sharded over "replica"."""
    if mode not in MODE_RULES:
        raise ValueError(f"params sharding mode {mode!r}: expected one of {MODES}")
    rules, notes = MODE_RULES[mode], []
    flat, treedef = jax.tree_util.tree_flatten_with_path(params_shape)
    specs = []
    for key_path, leaf in flat:
        path, shape = path_str(key_path), tuple(leaf.shape)
        lead = _replica_spec(path, shape, mesh, notes) if replica_axis else []
        shape = shape[1:] if replica_axis else shape
        logical = logical_axes(path, len(shape))
        if logical is None:
            logical = (LEADING,) + (None,) * (len(shape) - 1) if len(shape) >= 2 else (None,) * len(shape)
            if rules:
                fsdp = "leading axis on data" if rules.get(LEADING) and len(shape) >= 2 else "replicated"
                notes.append(f"{path}: no partition-table row for rank {len(shape)}: default ({fsdp})")
        specs.append(P(*lead, *_mesh_axes(path, shape, logical, mesh, rules, notes)))
    return ShardingPlan(jax.tree_util.tree_unflatten(treedef, specs), tuple(notes))


def _named(mesh, specs):
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def param_shardings(params_shape, mesh: Mesh, mode: str, *, replica_axis: bool = False):
    return _named(mesh, partition_specs(params_shape, mesh, mode, replica_axis=replica_axis).specs)


# ---------------------------------------------------------------------------- state and batch

def state_specs(state_shape, mesh: Mesh, mode: str, *, replica_axis: bool = False) -> ShardingPlan:
    """Specs for a whole TrainState: params by the table; optimizer-state leaves whose path ends
    with a param's path and that have its shape (Adam moments, Muon momentum) as that param;
    everything else (step, counts, lr, rng) replicated, or on "replica" with `replica_axis`."""
    plan = partition_specs(state_shape.params, mesh, mode, replica_axis=replica_axis)
    spec_leaves = jax.tree.leaves(plan.specs, is_leaf=lambda x: isinstance(x, P))
    by_path = {path_tuple(kp): (tuple(leaf.shape), spec) for (kp, leaf), spec in
               zip(jax.tree_util.tree_flatten_with_path(state_shape.params)[0], spec_leaves)}
    notes = list(plan.notes)

    def leaf_spec(key_path, leaf):
        names, shape = path_tuple(key_path), tuple(leaf.shape)
        for i in range(len(names)):
            hit = by_path.get(names[i:])
            if hit is not None and hit[0] == shape:
                return hit[1]
        if replica_axis:
            return P(*_replica_spec(path_str(key_path), shape, mesh, notes))
        return P()

    specs = jax.tree_util.tree_map_with_path(leaf_spec, state_shape)
    return ShardingPlan(specs, tuple(dict.fromkeys(notes)))


def state_shardings(state_shape, mesh: Mesh, mode: str, *, replica_axis: bool = False):
    return _named(mesh, state_specs(state_shape, mesh, mode, replica_axis=replica_axis).specs)


def batch_sharding(mesh: Mesh, ndim: int = 1, *, replica_axis: bool = False) -> NamedSharding:
    """Leading (batch) axis on "data", after a leading replica axis on "replica" for sweeps. As a
    prefix it serves every leaf of a batch pytree; `ndim` only spells out the trailing axes."""
    lead = ("replica", "data") if replica_axis else ("data",)
    return NamedSharding(mesh, P(*lead, *(None,) * max(ndim - 1, 0)))


def activation_constraint(mesh: Mesh) -> Callable | None:
    """x -> x with its leading (batch) axis on "data", the rest replicated, for a model's activations
    (LanguageModel.constrain); None when the data axis is 1. Without it GSPMD may meet a weight
    sharded over "data" (FSDP) by gathering the batch instead: a tied head then computes the whole
    global batch's logits on every device (docs/benchmarks.md). Under a sweep's vmap the replica
    axis stays the compiler's to place."""
    if mesh.shape["data"] == 1:
        return None
    sharding = NamedSharding(mesh, P("data"))
    return lambda x: jax.lax.with_sharding_constraint(x, sharding)


def jit_step(step: Callable, state_shardings, batch_sharding: NamedSharding):
    """jax.jit of `step(state, batch) -> (state, metrics)` with explicit shardings; the input
    state is donated, so the caller must use only the returned one."""
    sweep = len(batch_sharding.spec) > 0 and batch_sharding.spec[0] == "replica"
    metrics = NamedSharding(batch_sharding.mesh, P("replica") if sweep else P())
    return jax.jit(step, in_shardings=(state_shardings, batch_sharding),
                   out_shardings=(state_shardings, metrics), donate_argnums=0)


# ---------------------------------------------------------------------------- dry run

def describe_shardings(params, shardings, notes=()) -> str:
    """A table (path, shape, spec, elements per device) and the plan's notes."""
    rows = [("path", "shape", "spec", "per device")]
    total = per_device = 0
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    for (key_path, leaf), sharding in zip(flat, jax.tree.leaves(shardings)):
        n = math.prod(leaf.shape)
        local = math.prod(sharding.shard_shape(tuple(leaf.shape)))
        total, per_device = total + n, per_device + local
        spec = "(" + ", ".join(str(a) for a in sharding.spec) + ")"
        rows.append((path_str(key_path), str(tuple(leaf.shape)), spec, f"{local:,}"))
    rows.append(("total", f"{total:,}", "", f"{per_device:,}"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if notes:
        lines += ["", "notes:"] + [f"  {n}" for n in notes]
    return "\n".join(lines)
