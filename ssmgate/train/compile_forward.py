"""An evaluation run's forward pass compiled for a TPU slice without running it (`python -m ssmgate.aot`
on a flag file that evaluates a checkpoint, e.g. the official Mamba-3 interventions).

Such a run scores long windows in pieces that carry the model's cache (ssmgate.train.lm_eval): one
compiled piece program per model, the native one and one per intervention built into the forward
pass. `compile_forward` compiles each of them, the piece that starts a window (no cache) and the
piece that continues one (the cache the first returns), for one device of the slice: the evaluation
is not sharded, so a larger slice does not give it more memory. Memory and the roofline estimate
are read as for a training step (ssmgate.train.compile_step); the estimate's useful work is the
forward third of the training FLOPs.
"""
from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ssmgate.cores import auto
from ssmgate.models import presets
from ssmgate.models.config import ModelCfg
from ssmgate.models.lm import init_params
from ssmgate.train import compile_step, lm_eval, topology
from ssmgate.train.throughput import model_flops


@dataclasses.dataclass(frozen=True)
class ForwardPlan:
    """What an evaluation run's forward pass is made of, without its weights or text."""
    model: ModelCfg
    models: dict            # label -> LanguageModel (the native one and each intervention's)
    rows: int               # windows scored together
    piece_len: int          # tokens a piece
    cache_len: int          # the longest window (a Transformer's key-value cache is sized for it)


def compile_forward(plan: ForwardPlan, topo: topology.Topology) -> dict:
    """Compiles every model's piece programs for one device of `topo`; the report of the largest,
    with each model's memory and compile time under "models"."""
    devices = topology.devices(topo.libtpu_name)
    one = NamedSharding(Mesh(np.asarray(devices[:1]), ("device",)), P())
    on_device = lambda tree: jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=one), tree)
    params = on_device(jax.eval_shape(lambda: init_params(plan.model, jax.random.PRNGKey(0))))
    tokens = jax.ShapeDtypeStruct((plan.rows, plan.piece_len), jnp.int32, sharding=one)
    weights = jax.ShapeDtypeStruct((plan.rows, plan.piece_len), jnp.float32, sharding=one)
    hbm, peak, bandwidth = topo.per_device(len(devices))
    n_tokens = plan.rows * plan.piece_len
    useful = model_flops(plan.model, plan.rows, plan.piece_len) / 3.0
    models, total_s = {}, 0.0
    with auto.for_backend("tpu"):
        for label, model in plan.models.items():
            run = lm_eval.piece_fn(model)
            cache = on_device(model.init_cache(plan.rows, plan.cache_len))
            start = time.perf_counter()
            first = run.lower(params, tokens, tokens, weights, cache).compile()
            carried = on_device(jax.eval_shape(run, params, tokens, tokens, weights, cache)[2])
            later = run.lower(params, tokens, tokens, weights, carried).compile()
            seconds = time.perf_counter() - start
            total_s += seconds
            measured = [compile_step.measure(c, hbm=hbm, peak=peak, bandwidth=bandwidth, tokens=n_tokens,
                                             useful_flops=useful) for c in (first, later)]
            models[label] = {"compile_s": seconds, **_larger(*measured)}
    worst = max(models.values(), key=lambda m: m["held_bytes"])
    return {
        "kind": "forward", "topology": topo.name, "libtpu_topology": topo.libtpu_name, "generation": topo.generation,
        "devices": 1, "hosts": 1, "chips": topo.chips, "mesh": {"device": 1}, "params": presets.param_count(plan.model),
        "replicas": 1, "batch_rows": plan.rows, "seq_len": plan.piece_len, "tokens_per_step": n_tokens,
        "hbm_bytes": int(hbm), "microbatches": 1, **{k: v for k, v in worst.items() if k != "compile_s"},
        "compile_s": total_s, "models": models}


def _larger(a: dict, b: dict) -> dict:
    return a if a["held_bytes"] >= b["held_bytes"] else b
