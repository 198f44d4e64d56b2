"""One language-model run or sweep, built for the training loop: the pieces every LM program shares.

`build_run` turns a model, an optimizer, replicas and a data function into what `loop.run`
needs: the initial state (sharded on the mesh), its abstract shape with shardings (for resume),
the jitted step, the batch of step k and the evaluation. With one replica (and no forced sweep)
it is a single run on TrainState; otherwise the replicas are stacked and trained by one vmapped
step (ssmgate.train.sweep).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.models.config import ModelCfg
from ssmgate.config_error import ConfigError
from ssmgate.models import presets
from ssmgate.models.gates import offset_gates
from ssmgate.models.lm import build_model, head_matrix
from ssmgate.train import mesh as meshlib, optim, sweep
from ssmgate.train.state import TrainState
from ssmgate.train.chunked_loss import chunked_text_loss
from ssmgate.train.step import make_train_step


def lm_loss_fn(model, loss: Callable, loss_chunk: int = 0) -> Callable:
    """loss_fn(params, batch, rng) of the train step: logits of `batch.inputs`, then loss(logits, batch).
    loss_chunk > 0 (`text_loss` only): the same values from the final hidden states, the head applied
    that many positions at a time (ssmgate.train.chunked_loss), never the whole sequence's logits."""
    if loss_chunk and loss is not text_loss:
        raise ConfigError(f"--mesh_loss_chunk={loss_chunk}: scoring in chunks computes the next-token text loss "
                          f"(the language-model programs'); this program's loss ({getattr(loss, '__name__', loss)}) "
                          "reads whole logits: expected --mesh_loss_chunk=0")

    def loss_fn(params, batch, rng):
        del rng  # the models are deterministic (no dropout)
        if loss_chunk:
            h_btd, _ = model.apply({"params": params}, batch.inputs, head=False)
            return chunked_text_loss(h_btd, head_matrix(model.cfg, params), batch, loss_chunk, model.constrain)
        logits, _ = model.apply({"params": params}, batch.inputs)
        return loss(logits, batch)
    return loss_fn


def init_params_fn(model, model_cfg: ModelCfg, seq_len: int = 16, base_params=None) -> Callable:
    """init(key, offset) -> params, traceable in offset (Mamba-2's gate offset; 0 elsewhere): fresh
    weights, or `base_params` (a pretrained checkpoint's) with the offset applied."""
    tokens = jnp.zeros((1, seq_len), jnp.int32)

    def init(key, offset):
        params = model.init(key, tokens)["params"] if base_params is None else base_params
        return offset_gates(params, offset) if model_cfg.block == "mamba2" else params
    return init


def describe_mesh(model_cfg: ModelCfg, mesh_cfg: meshlib.MeshCfg, batch: int | None = None) -> list[str]:
    """The --dry_run lines of the mesh and of every parameter's sharding on it. Checks what the run
    itself checks first: the mesh against the devices here and `batch` against its data axis."""
    try:
        mesh, note = meshlib.mesh_for_description(mesh_cfg)
        if batch is not None:
            meshlib.check_batch(batch, mesh.shape["data"], mesh_cfg.microbatches)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    params = presets.param_shapes(model_cfg)
    return ["", f"mesh {dict(mesh.shape)}{note}",
            meshlib.describe_shardings(params, meshlib.param_shardings(params, mesh, mesh_cfg.params))]


def params_digest(params) -> str:
    """sha256 of every parameter's bytes in tree order: equal digests = bit-identical weights."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(jax.device_get(params)):
        h.update(np.ascontiguousarray(leaf).tobytes())
    return h.hexdigest()


@dataclasses.dataclass
class Run:
    model: object
    is_sweep: bool
    init_state: Callable      # () -> state, sharded
    abstract: object          # the state's ShapeDtypeStructs with shardings
    step: Callable            # (state, batch) -> (state, metrics), jitted with shardings
    batch_fn: Callable        # k -> batch (leading replica axis in a sweep)
    eval_fn: Callable         # state -> dict of metrics (per replica in a sweep)

    def params(self, state):
        return state.train.params if self.is_sweep else state.params


def build_run(model_cfg: ModelCfg, optim_cfg: optim.OptimCfg, replicas, *, sample: Callable | None = None,
              loss: Callable, eval_batches, mesh, mode: str, force_sweep: bool = False,
              stage: Callable | None = None, host_sample: Callable | None = None,
              global_batch: Callable | None = None, base_params=None, microbatches: int = 1,
              remat: bool = False, loss_chunk: int = 0) -> Run:
    """sample(seed, k) -> batch of step k for a replica seeded `seed` (jittable in k);
    loss(logits, batch) -> (loss, metrics); the evaluation is the mean of loss and metrics over
    the fixed `eval_batches`.

    Host-side data: instead of `sample`, `host_sample(seed, k)` may return the batch as numpy
    arrays (a memory-mapped text corpus, say, too large to live on the device); it is placed on
    the mesh with the batch sharding each step. It must still be a function of (seed, k) only.
    Every process computes the whole global batch there; with `global_batch(sharding) -> (k ->
    batch of jax.Arrays with that sharding)` instead (single runs), each process reads only its
    own rows and builds the global arrays itself (e.g. `ssmgate.data.loader.global_batch_fn`,
    with the replica's seed bound), again a function of k only.

    `base_params` (e.g. a pretrained checkpoint's) replace the random initial weights; a replica's
    gate offset is still added (Mamba-2: A_log += offset, P1's gate scale s = e^offset).

    Staged shapes: with `stage(k) -> s` (host-side, a function of k only; s hashable, e.g. a padded
    length or a length bucket) the sampler is `sample(seed, k, s)` with s static. Each stage compiles
    its own batch function and train step once, so a length curriculum or bucketed lengths pay for
    the padding of their stage, not of the longest sequence. Every replica of a sweep shares the
    stage of step k (one array shape per step).

    microbatches: each step's gradient accumulated over this many slices of its batch
    (ssmgate.train.step: the activations of one slice at a time). remat: each layer's activations
    recomputed in the backward pass (LanguageModel.remat), the same gradients for one more forward.
    loss_chunk: the text loss scored that many positions at a time (lm_loss_fn); 0: all at once."""
    if sum(x is not None for x in (sample, host_sample, global_batch)) != 1:
        raise ValueError("build_run: pass exactly one of sample (jittable), host_sample (numpy) and global_batch "
                         "(global arrays)")
    if stage is not None and sample is None:
        raise ValueError("build_run: stage applies to a jittable sample; host_sample and global_batch batches have "
                         "one shape")
    model = build_model(model_cfg).clone(remat=remat, constrain=meshlib.activation_constraint(mesh))
    tx = optim.make_optimizer(optim_cfg)
    loss_fn = lm_loss_fn(model, loss, loss_chunk)
    evaluate = mean_metrics(lambda params, batch: loss_fn(params, batch, None), eval_batches)
    step = make_train_step(loss_fn, tx, compute_dtype=jnp.dtype(model_cfg.dtype), microbatches=microbatches)
    init = init_params_fn(model, model_cfg, base_params=base_params)
    is_sweep = len(replicas) > 1 or force_sweep
    if is_sweep and global_batch is not None:
        raise ValueError("build_run: global_batch serves single runs; a sweep's batches carry a leading replica "
                         "axis (use sample or host_sample)")
    if is_sweep:
        meshlib.check_replicas(len(replicas), mesh.shape["replica"])
        make = lambda: sweep.init_sweep(replicas, init, tx)
        shapes = jax.eval_shape(make)
        shard = sweep.sweep_shardings(shapes, mesh, mode)
        batch_shard = meshlib.batch_sharding(mesh, replica_axis=True)  # a prefix: every batch leaf, any rank
        seeds = jnp.asarray([r.seed for r in replicas], jnp.uint32)
        if host_sample is not None:
            seed_list = [r.seed for r in replicas]
            batch_fn = on_mesh(lambda k: jax.tree.map(lambda *xs: np.stack(xs),
                                                      *[host_sample(s, k) for s in seed_list]), batch_shard)
        else:
            batch_fn = staged(lambda fn: lambda k: jax.vmap(fn, (0, None))(seeds, k), sample, stage, batch_shard)
        run_step = meshlib.jit_step(sweep.sweep_step(step), shard, batch_shard)
        eval_fn = jax.jit(lambda s: sweep.replica_vmap(evaluate)(s.train.params))
    else:
        r = replicas[0]

        def make():
            key_init, key_rng = jax.random.split(jax.random.PRNGKey(r.seed))
            state = TrainState.create(init(key_init, r.offset), tx, key_rng)
            return state.replace(opt_state=optim.set_learning_rate(state.opt_state, r.lr))

        shapes = jax.eval_shape(make)
        shard = meshlib.state_shardings(shapes, mesh, mode)
        batch_shard = meshlib.batch_sharding(mesh)
        if global_batch is not None:
            batch_fn = global_batch(batch_shard)
        elif host_sample is not None:
            batch_fn = on_mesh(lambda k: host_sample(r.seed, k), batch_shard)
        else:
            batch_fn = staged(lambda fn: lambda k: fn(r.seed, k), sample, stage, batch_shard)
        run_step = meshlib.jit_step(step, shard, batch_shard)
        eval_fn = jax.jit(lambda s: evaluate(s.params))
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, shard)
    return Run(model, is_sweep, jax.jit(make, out_shardings=shard), abstract, run_step, batch_fn, eval_fn)


def staged(batch_of: Callable, sample: Callable, stage: Callable | None, sharding) -> Callable:
    """k -> batch, jitted: batch_of(sample) (a function of k), or with stages batch_of(sample(., ., s))
    for s = stage(k), compiled once per stage."""
    if stage is None:
        return jax.jit(batch_of(sample), out_shardings=sharding)
    jitted = {}

    def batch_fn(k):
        s = stage(k)
        if s not in jitted:
            jitted[s] = jax.jit(batch_of(functools.partial(_with_stage, sample, s)), out_shardings=sharding)
        return jitted[s](k)
    return batch_fn


def on_mesh(host_batch: Callable, sharding) -> Callable:
    """k -> host_batch(k) (numpy leaves) as global arrays with `sharding`. Every process computes
    the same global batch and each device takes its slice, so this works on any number of hosts."""
    def batch_fn(k):
        def place(x):
            x = np.asarray(x)
            return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
        return jax.tree.map(place, host_batch(k))
    return batch_fn


def _with_stage(sample, s, seed, k):
    return sample(seed, k, s)


def mean_metrics(loss_fn_params: Callable, batches) -> Callable:
    """evaluate(params): the mean over fixed batches of loss(params, batch) -> (loss, metrics),
    with the loss under the key 'loss'."""
    def evaluate(params):
        ms = []
        for b in batches:
            value, metrics = loss_fn_params(params, b)
            ms.append(dict(metrics, loss=value))
        return jax.tree.map(lambda *v: jnp.mean(jnp.stack(v)), *ms)
    return evaluate


def text_loss(logits_btv, batch):
    """Masked mean cross-entropy and, for exact pooled perplexities over many batches, the sums:
    nll_sum, n_tokens and n_correct of the scored positions."""
    logp = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, batch.targets[..., None], axis=-1)[..., 0] * batch.mask
    n = batch.mask.sum()
    correct = (jnp.argmax(logits_btv, axis=-1) == batch.targets).astype(jnp.float32) * batch.mask
    loss = nll.sum() / jnp.maximum(n, 1.0)
    return loss, {"accuracy": correct.sum() / jnp.maximum(n, 1.0), "nll_sum": nll.sum(), "n_tokens": n,
                  "n_correct": correct.sum()}
