"""The train and eval steps: pure functions of (state, batch), jitted once by the caller.

A step whose loss or gradient is not finite keeps its input parameters and optimizer state, says
why in `metrics["nonfinite"]` and marks the state halted (`state.step` becomes `-1 - step`); a
halted state passes through later steps unchanged. The loop reads each step's flag one step late
(so the host never waits for the step it has just dispatched), and by then the state it holds is
still the last good one, whatever else was dispatched. `unhalt` gives it back its step count.

With `microbatches` = k > 1 the step computes its gradient in k slices of the batch, one after
another (a lax.scan), so a device holds the activations of one slice: the memory of a batch k
times smaller at the same update. Slice i holds rows i, i + k, i + 2k, ...: rows a device owns
stay its own in every slice. Each slice's loss and metrics are weighted by its scored tokens (the
sum of `batch.mask`; equal weights for a batch without one), so a loss that is a mean over the
scored tokens, and its gradient, equal the whole batch's up to float rounding; a metric that is a
ratio over other units (queries, say) is that weighted mean of the slices' ratios.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from ssmgate.train.optim import current_learning_rate
from ssmgate.train.state import TrainState

FINITE, LOSS_NONFINITE, GRAD_NONFINITE = 0, 1, 2  # values of metrics["nonfinite"]


def cast_floating(tree, dtype):
    """Floating leaves to `dtype`; integer leaves untouched."""
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def _all_finite(tree) -> jax.Array:
    # per leaf rather than via the global norm, whose sum of squares can overflow on finite grads
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def make_train_step(loss_fn: Callable, tx: optax.GradientTransformation, *, compute_dtype=jnp.float32,
                    microbatches: int = 1):
    """`loss_fn(params, batch, rng) -> (loss, aux)` with aux a dict of scalars. Returns
    `step(state, batch) -> (state, metrics)`; metrics: loss, grad_norm (before clipping), lr (the
    one this update used), nonfinite (0 ok, 1 loss, 2 a gradient) and aux. microbatches: see the
    module docstring; the batch's rows must be a multiple of it."""
    def loss_in_compute_dtype(params, batch, rng):
        # The cast is inside the differentiated function, so gradients come back float32.
        loss, aux = loss_fn(cast_floating(params, compute_dtype), batch, rng)
        return loss.astype(jnp.float32), aux

    grad_fn = jax.value_and_grad(loss_in_compute_dtype, has_aux=True)
    if microbatches > 1:
        grad_fn = _accumulated(grad_fn, microbatches)

    def step(state: TrainState, batch):
        rng = jax.random.fold_in(state.rng, state.step)
        (loss, aux), grads = grad_fn(state.params, batch, rng)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        new = state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                            opt_state=opt_state)
        code = jnp.where(~jnp.isfinite(loss), LOSS_NONFINITE,
                         jnp.where(_all_finite(grads), FINITE, GRAD_NONFINITE)).astype(jnp.int32)
        keep = (code == FINITE) & (state.step >= 0)
        new = jax.tree.map(lambda n, o: jnp.where(keep, n, o), new, state)
        new = new.replace(step=jnp.where(keep | (state.step < 0), new.step, -1 - state.step))
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
                   "lr": current_learning_rate(opt_state), "nonfinite": code}
        if clash := sorted(set(aux) & set(metrics)):
            raise ValueError(f"loss_fn aux metrics {clash} clash with the step's own metrics {sorted(metrics)}")
        return new, {**metrics, **aux}

    return step


def _accumulated(grad_fn: Callable, k: int) -> Callable:
    """grad_fn over k slices of the batch, summed with the slices' token weights (module docstring)."""
    def sliced(batch):
        def split(x):
            if x.shape[0] % k:
                raise ValueError(f"--mesh_microbatches={k}: a batch of {x.shape[0]} rows does not split into {k} "
                                 f"slices; expected rows a multiple of {k}")
            return jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)
        return jax.tree.map(split, batch)

    def weight(batch):
        mask = getattr(batch, "mask", None)
        return jnp.float32(1.0) if mask is None else jnp.sum(mask).astype(jnp.float32)

    def accumulated(params, batch, rng):
        slices = sliced(batch)
        (loss0, aux0), grads0 = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], slices), rng)
        zeros = lambda tree: jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), tree)

        def add(carry, xs):
            i, piece = xs
            (loss, aux), grads = grad_fn(params, piece, jax.random.fold_in(rng, i))
            w = weight(piece)
            total, acc = carry
            acc = jax.tree.map(lambda a, v: a + w * v.astype(jnp.float32), acc, (loss, aux, grads))
            return (total + w, acc), None

        init = (jnp.float32(0.0), (jnp.float32(0.0), zeros(aux0), zeros(grads0)))
        (total, (loss, aux, grads)), _ = jax.lax.scan(add, init, (jnp.arange(k), slices))
        total = jnp.maximum(total, 1e-30)  # a batch with no scored token: zero loss and gradient
        loss, aux, grads = jax.tree.map(lambda a: a / total, (loss, aux, grads))
        aux = jax.tree.map(lambda a, s: a.astype(s.dtype), aux, aux0)
        grads = jax.tree.map(lambda g, s: g.astype(s.dtype), grads, grads0)
        return (loss, aux), grads
    return accumulated


def unhalt(state: TrainState) -> TrainState:
    """A halted state with its step count restored (updates applied before the bad step)."""
    return state.replace(step=jnp.where(state.step < 0, -1 - state.step, state.step))


def make_eval_step(metric_fn: Callable, *, compute_dtype=jnp.float32):
    """`metric_fn(params, batch) -> dict of scalars`; returns `eval_step(state, batch) -> metrics`."""
    def eval_step(state: TrainState, batch):
        return metric_fn(cast_floating(state.params, compute_dtype), batch)

    return eval_step
