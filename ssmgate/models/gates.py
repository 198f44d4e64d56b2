"""Mamba-2 gate initialisation, checkpoint gate edits and gate statistics (protocol §1.2, 2.5; P1).

A Mamba-2 head keeps exp(dt_t A) of its state per token, A = -exp(A_log), dt_t =
softplus(dt_raw_t + dt_bias). Its gate lives at two parameters of every `Mamba2Mixer`:
  .../<mixer>/A_log    (h,)  the log-rate lambda
  .../<mixer>/dt_bias  (h,)  softplus^{-1} of the input-independent step
e.g. params["params"]["layers_0"]["mixer"]["A_log"] in a language model. `gate_paths` finds every
A_log whatever the nesting (a leading "params" collection key or none), so edits and statistics
work on a mixer's or a model's params alike. Pass the params, not a whole TrainState: optimizer
moments mirror the params' paths and would be edited too. Mamba-3 mixers have no A_log (their
A_t is data-dependent) and are not touched.

Edits return new pytrees and never mutate their input (docs/extending.md, "Interventions").
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.tree_paths import key_name, path_tuple

GATE_NAME = "A_log"
DT_BIAS_NAME = "dt_bias"


def a_log_init(cfg, key):
    """(h,) float32: log U(lo, hi) per head; (lo, hi) = (a_init_lo, a_init_hi), or cfg.head_a_ranges[i]
    for head i when given. A gate offset delta is added after initialisation (offset_gates)."""
    h = cfg.n_ssm_heads
    if cfg.head_a_ranges is None:
        lo = jnp.full((h,), cfg.a_init_lo, jnp.float32)
        hi = jnp.full((h,), cfg.a_init_hi, jnp.float32)
    else:
        ranges = np.asarray(cfg.head_a_ranges, np.float32).reshape(h, 2)
        lo, hi = jnp.asarray(ranges[:, 0]), jnp.asarray(ranges[:, 1])
    a = lo + (hi - lo) * jax.random.uniform(key, (h,), jnp.float32)
    return jnp.log(a)


def softplus_inverse(y):
    """x with softplus(x) = y > 0 (stable for small and large y)."""
    return y + jnp.log(-jnp.expm1(-y))


def dt_bias_init(cfg, key):
    """(h,) float32: softplus^{-1}(dt0), dt0 log-uniform in [dt_min, dt_max], floored at dt_floor."""
    u = jax.random.uniform(key, (cfg.n_ssm_heads,), jnp.float32)
    dt = jnp.exp(math.log(cfg.dt_min) + u * (math.log(cfg.dt_max) - math.log(cfg.dt_min)))
    return softplus_inverse(jnp.maximum(dt, cfg.dt_floor))


def gate_paths(params) -> list[tuple]:
    """Every A_log in the pytree, as tuples of keys, in flattening order."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    return [path_tuple(kp) for kp, _ in leaves if kp and key_name(kp[-1]) == GATE_NAME]


def _require_gates(params, fn: str) -> None:
    if not gate_paths(params):
        raise ValueError(f"{fn}: the params pytree holds no '{GATE_NAME}' leaf; expected the params of a "
                         "model with Mamba-2 mixers (Mamba-3 has no A_log to edit)")


def _edit_gates(params, edit):
    def f(kp, leaf):
        return edit(leaf) if kp and key_name(kp[-1]) == GATE_NAME else leaf
    return jax.tree_util.tree_map_with_path(f, params)


def offset_gates(params, delta):
    """New pytree with A_log + delta on every mixer (P1's offset delta; delta finite). Traceable
    in delta (a sweep vmaps it); a concrete delta is checked here."""
    _require_gates(params, "offset_gates")
    if not isinstance(delta, jax.core.Tracer) and not np.all(np.isfinite(np.asarray(delta))):
        raise ValueError(f"offset_gates: delta = {delta!r}; expected a finite number")
    return _edit_gates(params, lambda a: a + jnp.asarray(delta, a.dtype))


def scale_gates(params, s):
    """New pytree with exp(A_log) scaled by s > 0 on every mixer, i.e. A_log + log s (P1 BFCL)."""
    _require_gates(params, "scale_gates")
    s_arr = np.asarray(s, np.float64)
    if not np.all(np.isfinite(s_arr)) or not np.all(s_arr > 0):
        raise ValueError(f"scale_gates: s = {s!r}; expected a finite scale s > 0 (A_log += log s)")
    return _edit_gates(params, lambda a: a + jnp.asarray(np.log(s_arr), a.dtype))


def _get(params, path):
    node = params
    for k in path:
        node = node[k]
    return node


def head_gates(params) -> list[tuple]:
    """[(path of A_log, A_log (h,), dt_bias (h,))] for every mixer, as float64 numpy."""
    out = []
    for path in gate_paths(params):
        parent = _get(params, path[:-1])
        if DT_BIAS_NAME not in parent:
            raise ValueError(f"head_gates: {'/'.join(path)} has no sibling '{DT_BIAS_NAME}'; expected a "
                             "Mamba-2 mixer's params")
        out.append((path, np.asarray(parent[GATE_NAME], np.float64), np.asarray(parent[DT_BIAS_NAME], np.float64)))
    return out


def head_rates(params) -> np.ndarray:
    """dt0 * exp(A_log) per head of every mixer, concatenated in gate_paths order: the per-token
    log-decay of the input-independent part of dt, dt0 = softplus(dt_bias) (protocol §2.5)."""
    _require_gates(params, "head_rates")
    return np.concatenate([np.logaddexp(0.0, dtb) * np.exp(alog) for _, alog, dtb in head_gates(params)])


def head_taus(params) -> np.ndarray:
    """tau = -1/log alpha = 1/(softplus(dt_bias) exp(A_log)) per head (tokens)."""
    return 1.0 / head_rates(params)


def head_alphas(params) -> np.ndarray:
    """alpha = exp(-softplus(dt_bias) exp(A_log)) per head: what a token keeps per step."""
    return np.exp(-head_rates(params))


def median_tau(params) -> float:
    """Median over all heads of all layers of tau (protocol §2.5, Table 1 rows)."""
    return float(np.median(head_taus(params)))


def median_alpha_change(before, after) -> float:
    """Median over heads of |alpha_after - alpha_before| (protocol §2.5, Table 1 |delta alpha|)."""
    a0, a1 = head_alphas(before), head_alphas(after)
    if a0.shape != a1.shape:
        raise ValueError(f"median_alpha_change: before has {a0.size} heads, after has {a1.size}; expected "
                         "the params of the same model")
    return float(np.median(np.abs(a1 - a0)))
