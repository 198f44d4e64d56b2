"""Sweeps: K replicas of one run trained by one vmapped, compiled step (docs/extending.md, "The training contract").

Replicas differ by seed (initialisation and data), peak learning rate (an array in the optimizer
state, `optax.inject_hyperparams`) and gate offset delta (A_log += delta at initialisation), so
one compilation serves the whole grid. The stacked `SweepState` carries, per replica, whether it
still trains, where it stopped and when it escaped, so early stopping and escape detection
change arrays, never the program:
  - escape step: the first evaluation whose `metric` exceeds `escape_thr` (protocol §3.4),
  - early stop: a replica whose `metric` reaches `stop_thr` is frozen (its state stops changing),
  - divergence: a replica whose loss or gradient is not finite is frozen at its last good state
    and reported; the others go on.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Optional, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ssmgate.train import mesh as meshlib, optim
from ssmgate.train.run_dir import say
from ssmgate.train.state import TrainState


@dataclasses.dataclass(frozen=True)
class Replica:
    seed: int
    lr: float
    offset: float = 0.0

    @property
    def label(self) -> str:
        return f"seed={self.seed} lr={self.lr:g} offset={self.offset:g}"


def grid(seeds: Sequence[int], lrs: Sequence[float], offsets: Sequence[float] = (0.0,)) -> list[Replica]:
    """The Cartesian product, offsets outermost then learning rates then seeds."""
    return [Replica(int(s), float(lr), float(o)) for o, lr, s in itertools.product(offsets, lrs, seeds)]


@dataclasses.dataclass(frozen=True)
class StopRule:
    metric: str = "seq_accuracy"       # an eval metric
    escape_thr: Optional[float] = None
    stop_thr: Optional[float] = None


class SweepState(flax.struct.PyTreeNode):
    train: TrainState          # every leaf has a leading replica axis K
    active: jax.Array          # (K,) bool: still training
    stopped_step: jax.Array    # (K,) int32: step where it stopped (-1: running or ran to the end)
    diverged: jax.Array        # (K,) bool
    escape_step: jax.Array     # (K,) int32: first eval above escape_thr (-1: not yet)

    @property
    def n_replicas(self) -> int:
        return int(self.active.shape[0])


def init_sweep(replicas: Sequence[Replica], init_params: Callable, tx) -> SweepState:
    """init_params(key, offset) -> params, traceable in offset (e.g. init then gates.offset_gates).
    Keys come from each replica's seed, so two replicas with one seed start from the same weights
    apart from their offsets."""
    seeds = jnp.array([r.seed for r in replicas], jnp.uint32)
    offsets = jnp.array([r.offset for r in replicas], jnp.float32)
    lrs = jnp.array([r.lr for r in replicas], jnp.float32)

    def one(seed, offset, lr):
        key_init, key_rng = jax.random.split(jax.random.PRNGKey(seed))
        state = TrainState.create(init_params(key_init, offset), tx, key_rng)
        return state.replace(opt_state=optim.set_learning_rate(state.opt_state, lr))

    train = jax.jit(jax.vmap(one))(seeds, offsets, lrs)
    k = len(replicas)
    return SweepState(train, jnp.ones(k, bool), jnp.full(k, -1, jnp.int32), jnp.zeros(k, bool),
                      jnp.full(k, -1, jnp.int32))


def sweep_shardings(abstract: SweepState, mesh, mode: str) -> SweepState:
    """Shardings of a SweepState: the stacked TrainState by the partition table with its replica
    axis on "replica", the per-replica vectors on "replica" (replicated when K does not divide)."""
    k = abstract.active.shape[0]
    vec = NamedSharding(mesh, P("replica") if k % mesh.shape["replica"] == 0 else P())
    return SweepState(meshlib.state_shardings(abstract.train, mesh, mode, replica_axis=True), vec, vec, vec, vec)


def _where_tree(mask_k, new, old):
    def pick(n, o):
        return jnp.where(mask_k.reshape(mask_k.shape + (1,) * (n.ndim - 1)), n, o)
    return jax.tree.map(pick, new, old)


def replica_vmap(fn: Callable, in_axes=0) -> Callable:
    """jax.vmap of fn over the leading replica axis (in_axes: 0 or None per positional argument),
    except that a sweep of one replica calls fn on the squeezed arguments and restores the axis.
    Same results; the point is speed: XLA:CPU runs a scan body with a degenerate size-1 axis
    several times slower (2026-12-01: the sequential damped core's gradient 5x slower vmapped over
    one replica than unbatched, while vmapped over two it cost no more per replica than one)."""
    vfn = jax.vmap(fn, in_axes)

    def call(*args):
        axes = tuple(in_axes) if isinstance(in_axes, (tuple, list)) else (in_axes,) * len(args)
        if len(axes) != len(args):
            raise ValueError(f"replica_vmap: {len(args)} arguments but in_axes {in_axes!r}")
        sizes = {leaf.shape[0] for a, ax in zip(args, axes) if ax == 0 for leaf in jax.tree.leaves(a)}
        if sizes != {1}:
            return vfn(*args)
        squeezed = [jax.tree.map(lambda v: v[0], a) if ax == 0 else a for a, ax in zip(args, axes)]
        return jax.tree.map(lambda v: jnp.expand_dims(v, 0), fn(*squeezed))
    return call


def sweep_step(step_fn) -> Callable:
    """The vmapped step: (SweepState, batch with a leading K axis) -> (SweepState, metrics (K,))."""
    vstep = replica_vmap(step_fn)

    def step(state: SweepState, batch):
        new_train, metrics = vstep(state.train, batch)
        bad = metrics["nonfinite"] != 0
        ok = state.active & ~bad
        newly_diverged = state.active & bad
        train = _where_tree(ok, new_train, state.train)
        stopped = jnp.where(newly_diverged, state.train.step, state.stopped_step)
        state = state.replace(train=train, active=state.active & ~bad, diverged=state.diverged | newly_diverged,
                              stopped_step=stopped)
        return state, dict(metrics, active=state.active)

    return step


def after_eval(rule: StopRule, labels: Sequence[str]) -> Callable:
    """Host-side update after an evaluation at step k: escape steps and early stopping."""
    def update(state: SweepState, k: int, evals: dict) -> SweepState:
        if rule.metric not in evals:
            raise KeyError(f"stop/escape metric {rule.metric!r} is not an eval metric; have {sorted(evals)}")
        value = np.asarray(evals[rule.metric]).reshape(-1)
        active = np.asarray(state.active)
        escape = np.asarray(state.escape_step).copy()
        stopped = np.asarray(state.stopped_step).copy()
        if rule.escape_thr is not None:
            new = (escape < 0) & (value > rule.escape_thr) & active
            for r in np.flatnonzero(new):
                say(f"[sweep] {labels[r]}: escaped at step {k} ({rule.metric} {value[r]:.4f} > {rule.escape_thr})")
            escape[new] = k
        if rule.stop_thr is not None:
            done = active & (value >= rule.stop_thr)
            for r in np.flatnonzero(done):
                say(f"[sweep] {labels[r]}: stopped at step {k} ({rule.metric} {value[r]:.4f} >= {rule.stop_thr})")
            stopped[done] = k
            active = active & ~done
        # Placed as the arrays they replace: an unsharded array would be a new input type to the
        # jitted step, which would trace and compile again (7 s for P1's small KV model, per shape).
        like = lambda new, old: jax.device_put(np.asarray(new, old.dtype), old.sharding)  # noqa: E731
        return state.replace(active=like(active, state.active), escape_step=like(escape, state.escape_step),
                             stopped_step=like(stopped, state.stopped_step))
    return update


def all_stopped(state: SweepState) -> bool:
    return not bool(np.asarray(state.active).any())


def report_divergence(state: SweepState, labels: Sequence[str]) -> list[str]:
    """Messages for the replicas that diverged (the loop prints them; the summary records them)."""
    diverged = np.asarray(state.diverged)
    stopped = np.asarray(state.stopped_step)
    return [f"{labels[r]}: loss or gradient not finite after step {stopped[r]}; frozen there"
            for r in np.flatnonzero(diverged)]
