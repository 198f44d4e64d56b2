"""Second-order damped cores (P2): each rotated pair of state rows is a damped oscillator.

Pair i < r of the state rows of every head evolves by the exact discretisation
  Abar_t = exp(dt_t A(kappa_t)),  A(kappa) = [[0, 1], [-(a^2 - kappa), -2a]]  (companion form)
with kappa = -nu^2 (under), 0 (critical) or (c a tanh nu)^2 (over, 0 < c < 1); rows >= 2r decay by
exp(-dt a). Writes and reads are those of the rotation core without phases (trapezoid transported
by Abar_t, protocol §1.5):
  h_t = Abar_t (h_{t-1} + (1 - lambda_t) dt_t x_{t-1} B_{t-1}^T) + lambda_t dt_t x_t B_t^T,
  y_t = h_t C_t + D x_t.
Parallel forms: `associative` over (2x2 matrix, state block) pairs, and `chunked`. SSD's own
factorisation would write the transition between two tokens of a chunk as P_t P_s^{-1} of
cumulative products, and for kappa > 0 the non-decaying factor of P grows like exp(sqrt(kappa) sum dt)
(its inverse likewise), so the product cancels catastrophically in float32; `chunked` builds those
transitions forward instead (ssmgate/cores/_damped_chunked.py).
"""
from __future__ import annotations

import functools

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ssmgate.cores import _checks, _finite, auto
from ssmgate.cores._damped_chunked import chunked_damped
from ssmgate.cores._ssd import expand_groups, per_token, previous_writes
from ssmgate.cores.rotation import trapezoid_inputs

CORE = "damped"
REGIMES = ("under", "critical", "over")
ALGORITHMS = ("auto", "sequential", "associative", "chunked")
_SMALL = 1e-4  # below this argument the series branches are exact to float32/float64 rounding


class DampedState(NamedTuple):
    """h (b, h, p, n); B_prev (b, h, n) and x_prev (b, h, p) of the last token (trapezoid term)."""

    h: jax.Array
    B_prev: jax.Array
    x_prev: jax.Array

    @classmethod
    def zeros(cls, b: int, h: int, p: int, n: int, dtype=jnp.float32) -> "DampedState":
        return cls(jnp.zeros((b, h, p, n), dtype), jnp.zeros((b, h, n), dtype), jnp.zeros((b, h, p), dtype))


def _sinc(x):
    """sin(x) / x with its series near 0 (gradient-safe)."""
    small = jnp.abs(x) < _SMALL
    safe = jnp.where(small, 1.0, x)
    return jnp.where(small, 1.0 - x * x / 6.0, jnp.sin(safe) / safe)


def _one_minus_exp_neg2x_over_2x(x):
    """(1 - exp(-2x)) / (2x) for x >= 0, via expm1, with its series near 0 (gradient-safe)."""
    small = x < _SMALL
    safe = jnp.where(small, 1.0, x)
    return jnp.where(small, 1.0 - x + (2.0 / 3.0) * x * x, -jnp.expm1(-2.0 * safe) / (2.0 * safe))


def transition(dt, a, nu, *, regime: str, overdamped_c: float = 0.9):
    """Closed-form Abar = exp(dt A(kappa)) = e^{-a dt} (c I + s N), N = A + aI, N^2 = kappa I.

    dt, a broadcast against nu's leading axes (...,) and nu is (..., r). Returns the entries
    (m00, m01, m10, m11), each (..., r). Every exponential is of a non-positive number (for
    'over' the two real modes e^{-(a -+ r) dt} are formed directly), so no entry overflows or
    cancels catastrophically, from dt*a = 1e-6 up to dt*a = 50 and beyond.
    """
    dt, a = dt[..., None], a[..., None]
    if regime == "under":
        decay = jnp.exp(-a * dt)
        ec = decay * jnp.cos(nu * dt)
        es = decay * dt * _sinc(nu * dt)
        gap = a * a + nu * nu  # a^2 - kappa
    elif regime == "critical":
        decay = jnp.exp(-a * dt) * jnp.ones_like(nu)
        ec, es, gap = decay, decay * dt, a * a
    elif regime == "over":
        r = jnp.abs(overdamped_c * a * jnp.tanh(nu))
        slow = jnp.exp(-(a - r) * dt)
        ec = 0.5 * (slow + jnp.exp(-(a + r) * dt))
        es = slow * dt * _one_minus_exp_neg2x_over_2x(r * dt)
        gap = (a - r) * (a + r)
    else:
        raise ValueError(f"{CORE}: unknown regime {regime!r}; expected one of {', '.join(map(repr, REGIMES))}")
    return ec + es * a, es, -es * gap, ec - es * a


def _apply(m, decay, h):
    """Abar h: pairs of rows (2i, 2i+1), i < r, by the 2x2 entries m (each (b, h, r) or with
    extra leading axes), rows >= 2r by decay. h (..., p, n)."""
    m00, m01, m10, m11 = (e[..., None, :] for e in m)
    r = m00.shape[-1]
    pairs = h[..., : 2 * r].reshape(*h.shape[:-1], r, 2)
    h0, h1 = pairs[..., 0], pairs[..., 1]
    out = jnp.stack([m00 * h0 + m01 * h1, m10 * h0 + m11 * h1], axis=-1).reshape(*h.shape[:-1], 2 * r)
    return jnp.concatenate([out, decay[..., None, None] * h[..., 2 * r:]], axis=-1)


def _matmul(m2, m1):
    """2x2 products M2 M1 of entry tuples."""
    a00, a01, a10, a11 = m2
    b00, b01, b10, b11 = m1
    return (a00 * b00 + a01 * b10, a00 * b01 + a01 * b11, a10 * b00 + a11 * b10, a10 * b01 + a11 * b11)


def _advance(state, x, dt, m, decay, B, C, lam, D):
    """One token given its transition (m, decay); compute dtype."""
    heads = x.shape[1]
    B_h, C_h = expand_groups(B, heads), expand_groups(C, heads)
    carried = state.h
    if lam is not None:
        carried = carried + (((1.0 - lam) * dt)[..., None] * state.x_prev)[..., None] * state.B_prev[:, :, None, :]
    gamma = dt if lam is None else lam * dt
    h = _apply(m, decay, carried) + (gamma[..., None] * x)[..., None] * B_h[:, :, None, :]
    y = jnp.einsum("bhpn,bhn->bhp", h, C_h)
    if D is not None:
        y = y + D[:, None] * x
    return y, DampedState(h, B_h, x)


def _step(state, x, dt, a, nu, B, C, lam, D, regime, c):
    m = transition(dt, a, nu, regime=regime, overdamped_c=c)
    return _advance(state, x, dt, m, jnp.exp(-dt * a), B, C, lam, D)


def _check_regime(core, regime, overdamped_c):
    if regime not in REGIMES:
        raise ValueError(f"{core}: unknown regime {regime!r}; expected one of {', '.join(map(repr, REGIMES))}")
    if regime == "over" and not (0.0 < float(overdamped_c) < 1.0):
        raise ValueError(f"{core}: argument 'overdamped_c' is {overdamped_c!r}; expected 0 < c < 1 "
                         "(c >= 1 would make the slow mode -a + r non-negative)")


def _check_state(core, state, b, h, p, n, arg="initial_state"):
    if not isinstance(state, DampedState):
        raise TypeError(f"{core}: argument '{arg}' is a {type(state).__name__}; expected a DampedState "
                        "(h, B_prev, x_prev), e.g. the final_state of a previous call or DampedState.zeros(...)")
    for name, arr, shape, axes in (("h", state.h, (b, h, p, n), "(b, h, p, n)"),
                                   ("B_prev", state.B_prev, (b, h, n), "(b, h, n)"),
                                   ("x_prev", state.x_prev, (b, h, p), "(b, h, p)")):
        _checks.check_state_array(core, f"{arg}.{name}", arr, shape, axes)


def damped_step(state, x, dt, a, nu, B, C, D=None, *, regime, overdamped_c=0.9, trap=None, check_values=None):
    """One decoding step. state: DampedState or None; x (b, h, p); dt (b, h); a (h,) or (b, h);
    nu (b, h, r); B, C (b, g, n); trap (b, h) or None. Returns (y (b, h, p), new state)."""
    core = "damped_step"
    _check_regime(core, regime, overdamped_c)
    b, h, p, g, n = _checks.check_step_inputs(core, x, dt, a, B, C, D, A_name="a")
    _checks.check_pairs(core, "nu", nu, (b, h), n, "(b, h, r)")
    _checks.check_trap(core, trap, (b, h), "(b, h)")
    _checks.check_values(core, _checks.value_checks_enabled(check_values), dt=dt, rate=a, rate_name="a",
                         rate_sign=+1, trap=trap)
    cdt = _checks.compute_dtype(x, dt, a, nu, B, C, D, trap)
    if state is None:
        state = DampedState.zeros(b, h, p, n, cdt)
    else:
        _check_state(core, state, b, h, p, n, arg="state")
    c = functools.partial(_checks.cast, dtype=cdt)
    y, new = _step(DampedState(*(c(v) for v in state)), c(x), c(dt), jnp.broadcast_to(c(a), (b, h)),
                   c(nu), c(B), c(C), c(trap), c(D), regime, overdamped_c)
    return y.astype(x.dtype), new


def _split_pairs(v, r: int):
    """(..., n) -> even pair channels (..., r), odd pair channels (..., r), the rest (..., n - 2r)."""
    return v[..., 0:2 * r:2], v[..., 1:2 * r:2], v[..., 2 * r:]


def _sequential(x, dt, a, nu, B, C, lam, D, state0, regime, c):
    """lax.scan over tokens of u_t = Abar_t u_{t-1} + w_t x_t B_t^T, where u_t = h_t plus the next
    token's trapezoid carry (1 - lambda_{t+1}) dt_{t+1} x_t B_t^T, so w_t = lambda_t dt_t +
    (1 - lambda_{t+1}) dt_{t+1} and y_t = u_t C_t minus that carry's read (the chunked forms' split,
    `trapezoid_scales`). The state is kept as its even pair rows, odd pair rows and the rest, so a
    step is a few fused multiply-adds: no pair reshapes inside the loop."""
    heads, r = x.shape[2], nu.shape[-1]
    m = transition(dt, a, nu, regime=regime, overdamped_c=c)  # the transitions depend on no state
    decay = jnp.exp(-dt * a)
    B_h, C_h = expand_groups(B, heads), expand_groups(C, heads)
    xs, xdiag, u0 = trapezoid_inputs(x, dt, lam, state0)

    def body(u, inputs):
        (ue, uo, ur), (xs_t, m00, m01, m10, m11, d_t, Bs, Cs) = u, inputs
        m00, m01, m10, m11 = (e[:, :, None, :] for e in (m00, m01, m10, m11))
        w = [xs_t[..., None] * b[:, :, None, :] for b in Bs]
        u = (m00 * ue + m01 * uo + w[0], m10 * ue + m11 * uo + w[1], d_t[..., None, None] * ur + w[2])
        y = sum(jnp.einsum("bhpk,bhk->bhp", part, c) for part, c in zip(u, Cs))
        return u, y

    seq = (xs, *m, decay, _split_pairs(B_h, r), _split_pairs(C_h, r))
    # Rematerialised in the backward pass: saving each step's broadcast operands costs more than
    # recomputing them (1.2-1.4x faster gradients on CPU).
    body = jax.checkpoint(body, prevent_cse=False)
    (ue, uo, ur), ys = jax.lax.scan(body, _split_pairs(u0, r), jax.tree.map(lambda v: jnp.moveaxis(v, 1, 0), seq))
    y = jnp.moveaxis(ys, 0, 1)
    if xdiag is not None:
        y = y + xdiag * jnp.sum(B_h * C_h, axis=-1)[..., None]
    if D is not None:
        y = y + D[:, None] * x
    h_final = jnp.concatenate([jnp.stack([ue, uo], axis=-1).reshape(*ue.shape[:-1], 2 * r), ur], axis=-1)
    return y, DampedState(h_final, B_h[:, -1], x[:, -1])


def _associative(x, dt, a, nu, B, C, lam, D, state0, regime, c):
    heads = x.shape[2]
    B_h, C_h = expand_groups(B, heads), expand_groups(C, heads)
    m = transition(dt, a, nu, regime=regime, overdamped_c=c)  # each (b, t, h, r)
    decay = jnp.exp(-dt * a)
    gamma = dt if lam is None else lam * dt
    write = x[..., None] * B_h[:, :, :, None, :]  # x_t B_t^T: (b, t, h, p, n)
    carried = jnp.zeros_like(write).at[:, 0].set(state0.h)  # what Abar_t acts on besides h_{t-1}
    if lam is not None:
        prev = previous_writes(write, state0.x_prev, state0.B_prev)
        carried = carried + ((1.0 - lam) * dt)[..., None, None] * prev
    inc = _apply(m, decay, carried) + gamma[..., None, None] * write

    def combine(left, right):
        m1, d1, u1 = left
        m2, d2, u2 = right
        return _matmul(m2, m1), d2 * d1, _apply(m2, d2, u1) + u2

    _, _, states = jax.lax.associative_scan(combine, (m, decay, inc), axis=1)
    y = jnp.einsum("bthpn,bthn->bthp", states, C_h)
    if D is not None:
        y = y + D[:, None] * x
    return y, DampedState(states[:, -1], B_h[:, -1], x[:, -1])


def _chunked(x, dt, a, nu, B, C, lam, D, state0, regime, c, chunk):
    heads = x.shape[2]
    m = transition(dt, a, nu, regime=regime, overdamped_c=c)
    xs, xdiag, h0 = trapezoid_inputs(x, dt, lam, state0)  # the shifted write, transported as in rotation
    B_h, C_h = expand_groups(B, heads), expand_groups(C, heads)
    y, h_final = chunked_damped(xs, m, -dt * a, B_h, C_h, B, C, h0, chunk, xdiag)
    if D is not None:
        y = y + D[:, None] * x
    return y, DampedState(h_final, B_h[:, -1], x[:, -1])


# The scan form folds token s+1's trapezoid weight into token s's write (rotation.trapezoid_inputs),
# so a bad dt or trap at s+1 reached y_s: it spreads backwards like the chunked form.
_GUARDED = _finite.SPREADING_ALGORITHMS + ("sequential",)


def _run(algorithm, chunk_size, x, dt, a, nu, B, C, lam, D, state0, *, regime, c):
    if algorithm in _GUARDED:
        H = _finite.HEAD
        return _finite.keep_past_clean(
            functools.partial(_run_form, algorithm, chunk_size, regime=regime, c=c),
            (x, dt, a, nu, B, C, lam, D, state0), (H, H, H, H, _finite.GROUP, None, H, None, None), x.shape[2])
    return _run_form(algorithm, chunk_size, x, dt, a, nu, B, C, lam, D, state0, regime=regime, c=c)


def _run_form(algorithm, chunk_size, x, dt, a, nu, B, C, lam, D, state0, *, regime, c):
    if algorithm == "chunked":
        return _chunked(x, dt, a, nu, B, C, lam, D, state0, regime, c, chunk_size or 16)
    run = _sequential if algorithm == "sequential" else _associative
    return run(x, dt, a, nu, B, C, lam, D, state0, regime, c)


def damped(x, dt, a, nu, B, C, D=None, *, regime, overdamped_c=0.9, trap=None, initial_state=None,
           algorithm="auto", chunk_size=None, check_values=None):
    """Runs the second-order damped recurrence; returns (y, final_state: DampedState).

    a (h,) or (b, t, h): damping rate a = -A > 0. nu (b, t, h, r), r <= n/2: signed angular
    frequency (under), unused by 'critical' except for r, squashed to r_t = c a tanh(nu) by 'over'.
    regime in {'under', 'critical', 'over'}; algorithm in {'auto', 'sequential', 'associative',
    'chunked'} (`chunk_size` tokens per chunk, 16 by default: see ssmgate/cores/_damped_chunked.py).
    """
    _checks.check_algorithm(CORE, algorithm, ALGORITHMS)
    _checks.check_chunk_size(CORE, chunk_size)
    _check_regime(CORE, regime, overdamped_c)
    b, t, h, p, g, n = _checks.check_ssm_inputs(CORE, x, dt, a, B, C, D, A_name="a")
    _checks.check_pairs(CORE, "nu", nu, (b, t, h), n)
    _checks.check_trap(CORE, trap, (b, t, h))
    _checks.check_values(CORE, _checks.value_checks_enabled(check_values), dt=dt, rate=a, rate_name="a",
                         rate_sign=+1, trap=trap)
    cdt = _checks.compute_dtype(x, dt, a, nu, B, C, D, trap)
    if initial_state is None:
        state0 = DampedState.zeros(b, h, p, n, cdt)
    else:
        _check_state(CORE, initial_state, b, h, p, n)
        state0 = DampedState(*(_checks.cast(v, cdt) for v in initial_state))
    args = [_checks.cast(v, cdt) for v in (x, dt, per_token(a, b, t, h), nu, B, C, trap, D)] + [state0]
    run = functools.partial(_run, regime=regime, c=overdamped_c)
    if algorithm == "auto":
        y, final = auto.run_auto(CORE, t, chunk_size, run, *args, state_size=p * n)
    else:
        y, final = run(algorithm, chunk_size, *args)
    return y.astype(x.dtype), final
