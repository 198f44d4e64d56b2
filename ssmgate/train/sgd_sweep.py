"""Plain-SGD runs of small models, a whole sweep in one compiled program (protocol §2.7).

A sweep point is a replica: its parameters carry a leading replica axis, the run is `vmap`ped over
it and `jit`ted once. The data of step k comes from `batch_fn(data_key, k)`; replicas that share a
data key (the same seed) see the same batches, so grid points differ only by their parameters.

Both loops run a segment of steps starting at `start`, so a driver can run a long sweep in
segments (progress, metrics on disk) with exactly the batches of one uninterrupted run:
- `sgd_run` trains inside `lax.scan` and records per-step metrics;
- `sgd_until` trains inside `lax.while_loop` until `stop_fn` holds after a step; under `vmap` the
  loop runs until every replica has stopped, and stopped replicas keep their parameters.
Both report the first step whose loss was not finite (-1 = none) and stop updating after it.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

Params = Any


class UntilState(NamedTuple):
    params: Params
    stopped: jax.Array  # 1-based step after which stop_fn first held, -1 = not yet
    bad: jax.Array  # first step with a non-finite loss, -1 = none


def _sgd_update(params, grads, lr, trainable):
    """params - lr * grads on the leaves marked trainable (a dict of leaf name -> bool, default True)."""
    return {k: (v - lr * grads[k]) if trainable.get(k, True) else v for k, v in params.items()}


def sgd_run(loss_fn: Callable, params: Params, bad, batch_fn: Callable, data_key, start, *, lr, steps: int,
            trainable: dict | None = None, metrics_fn: Callable | None = None):
    """Steps start .. start + steps - 1. Returns (params, bad, per-step metrics {"loss", **metrics_fn(params)})."""
    trainable = trainable or {}
    grad_fn = jax.value_and_grad(loss_fn)

    def body(carry, k):
        params, bad = carry
        loss, grads = grad_fn(params, batch_fn(data_key, k))
        ok = jnp.isfinite(loss) & (bad < 0)
        new = _sgd_update(params, grads, lr, trainable)
        params = jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, params)
        bad = jnp.where((bad < 0) & ~jnp.isfinite(loss), k, bad)
        out = {"loss": loss} if metrics_fn is None else {"loss": loss, **metrics_fn(params)}
        return (params, bad), out

    (params, bad), history = jax.lax.scan(body, (params, bad), start + jnp.arange(steps))
    return params, bad, history


def sgd_until(loss_fn: Callable, state: UntilState, batch_fn: Callable, data_key, start, *, lr, steps: int,
              stop_fn: Callable, trainable: dict | None = None) -> UntilState:
    """Steps start .. start + steps - 1 (`steps` may be traced), leaving the loop once stop_fn(params)
    holds after a step."""
    trainable = trainable or {}
    grad_fn = jax.value_and_grad(loss_fn)
    end = start + steps

    def cond(carry):
        k, s = carry
        return (k < end) & (s.stopped < 0) & (s.bad < 0)

    def body(carry):
        k, s = carry
        loss, grads = grad_fn(s.params, batch_fn(data_key, k))
        params = _sgd_update(s.params, grads, lr, trainable)
        finite = jnp.isfinite(loss)
        stopped = jnp.where(finite & stop_fn(params), k + 1, -1)
        bad = jnp.where(finite, -1, k)
        params = jax.tree.map(lambda a, b: jnp.where(finite, a, b), params, s.params)
        return k + 1, UntilState(params, stopped, bad)

    _, state = jax.lax.while_loop(cond, body, (jnp.asarray(start), state))
    return state
