"""Hidden-state diagnostics of protocol §8.3 (Table 6), streamed over one long sequence.

In the implementation coordinates of the rotation cores (the state h kept in rotated-B
coordinates), S_t = P_t + U_t with the history P_t = alpha_t S_{t-1} and the write
U_t = S_t - alpha_t S_{t-1} (both trapezoid terms). Per layer, head and token:

    c_t = <P_t, U_t>_F / (|P_t|_F |U_t|_F + 1e-12)        and        |S_t|_F^2

`book_statistics` runs the model token by token from a zero state (`lax.scan` over decode steps,
so memory does not grow with the length) and accumulates, per window [lo, hi) of token positions,
the time-means of c_t and |S_t|^2 per (layer, head). `summarise` then takes protocol §8.3's order:
cosine = median over (layer, head) of the time-means; RMS = sqrt(median of the time-mean |S|^2);
`mean_over_books` averages those per-book numbers. Any `Intervention` can be applied (Table 6
compares native with phase removal).
"""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.cores.mimo import MimoState
from ssmgate.cores.rotation import RotationState
from ssmgate.interventions.forward import Intervention, intervened_model
from ssmgate.models.config import DAMPED, ModelCfg

EPS = 1e-12  # protocol §8.3's guard in the cosine's denominator


def step_terms(S_prev, S, alpha):
    """Per head, for states (..., H, P, N) and alpha (..., H): (cosine(P, U), |S|^2, |P|^2, |U|^2,
    <P, U>) with P = alpha S_prev, U = S - P."""
    P = alpha[..., None, None] * S_prev
    U = S - P
    pu = jnp.sum(P * U, axis=(-2, -1))
    pp = jnp.sum(P * P, axis=(-2, -1))
    uu = jnp.sum(U * U, axis=(-2, -1))
    ss = jnp.sum(S * S, axis=(-2, -1))
    return pu / (jnp.sqrt(pp) * jnp.sqrt(uu) + EPS), ss, pp, uu, pu


def _zero_cache(cfg: ModelCfg) -> list:
    h, p, n, r, R = cfg.n_ssm_heads, cfg.headdim, cfg.d_state, cfg.n_rot_pairs, cfg.mimo_rank
    r = 0 if cfg.transition == "none" else r
    if R > 1:
        return [MimoState.zeros(1, h, R, p, n, r) for _ in range(cfg.n_layers)]
    return [RotationState.zeros(1, h, p, n, r) for _ in range(cfg.n_layers)]


def book_statistics(cfg: ModelCfg, params, tokens, windows: Sequence[tuple], intervention=Intervention()) -> dict:
    """{window: {"cosine": (layers, H), "sq_norm": (layers, H)}} time-means over the positions of
    each window [lo, hi) of one sequence `tokens` (1-D), run from a zero state."""
    cfg = cfg.validate()
    if cfg.block != "mamba3" or cfg.transition in DAMPED:
        raise ValueError(f"book_statistics: block {cfg.block!r} / transition {cfg.transition!r}; the diagnostics read "
                         "the state of the rotation cores (block 'mamba3', transition native, none or static)")
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"book_statistics: tokens of shape {tokens.shape}; expected one sequence (t,)")
    for lo, hi in windows:
        if not 0 <= lo < hi <= len(tokens):
            raise ValueError(f"book_statistics: window [{lo}, {hi}) outside the {len(tokens)} tokens; expected "
                             f"0 <= lo < hi <= {len(tokens)}")
    cos_sum, sq_sum = _window_sums_fn(cfg, intervention)(params, jnp.asarray(windows, jnp.int32),
                                                         jnp.asarray(tokens, jnp.int32))
    counts = np.asarray([hi - lo for lo, hi in windows], np.float64)[:, None, None]
    cos_mean = np.asarray(cos_sum, np.float64) / counts
    sq_mean = np.asarray(sq_sum, np.float64) / counts
    return {tuple(w): {"cosine": cos_mean[k], "sq_norm": sq_mean[k]} for k, w in enumerate(windows)}


@functools.lru_cache(maxsize=32)
def _window_sums_fn(cfg: ModelCfg, intervention: Intervention):
    """Jitted (params, bounds (w, 2), tokens (t,)) -> the per-window sums of the step cosine and |S|^2,
    (w, layers, H) each; one compiled program per model, intervention and shape, reused across books."""
    model = intervened_model(cfg, intervention)
    layers, h = cfg.n_layers, cfg.n_ssm_heads

    def window_sums(params, bounds, tokens):
        def step(carry, inp):
            cache, sums = carry
            t, token = inp
            (_, new_cache), inter = model.apply({"params": params}, token[None, None], cache,
                                                mutable=["intermediates"])
            cos_l, sq_l = [], []
            for i in range(layers):
                alpha = inter["intermediates"][f"layers_{i}"]["mixer"]["decay"][0][0, 0]   # (H,)
                c, ss, *_ = step_terms(cache[i].h[0], new_cache[i].h[0], alpha)
                cos_l.append(c)
                sq_l.append(ss)
            inside = ((t >= bounds[:, 0]) & (t < bounds[:, 1])).astype(jnp.float32)[:, None, None]  # (w, 1, 1)
            cos_sum, sq_sum = sums
            return (new_cache, (cos_sum + inside * jnp.stack(cos_l), sq_sum + inside * jnp.stack(sq_l))), None

        zeros = jnp.zeros((bounds.shape[0], layers, h), jnp.float32)
        (_, sums), _ = jax.lax.scan(step, (_zero_cache(cfg), (zeros, zeros)), (jnp.arange(tokens.shape[0]), tokens))
        return sums

    return jax.jit(window_sums)


def summarise(per_head: dict) -> dict:
    """One book's window: cosine = median over (layer, head) of the time-mean cosine; rms =
    sqrt(median over (layer, head) of the time-mean |S|^2)."""
    return {"cosine": float(np.median(per_head["cosine"])), "rms": float(np.sqrt(np.median(per_head["sq_norm"])))}


def mean_over_books(books: list) -> dict:
    """Unweighted mean over books of their `summarise` numbers."""
    if not books:
        raise ValueError("mean_over_books: no books; expected at least one summarised book")
    return {key: float(np.mean([b[key] for b in books])) for key in ("cosine", "rms")}
