"""Scalar-decay core (Mamba-2 SSD): h_t = exp(dt_t A_t) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t.

Shapes (mamba_ssm conventions): x (b, t, h, p), dt (b, t, h), A (h,) or (b, t, h) with A <= 0,
B, C (b, t, g, n) with h % g == 0 (head i reads group i // (h // g)), D (h,), state (b, h, p, n).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ssmgate.cores import _checks, _finite, auto
from ssmgate.cores._ssd import associative_states, chunked_ssd, expand_groups, per_token
from ssmgate.cores.pallas import pallas_ssd

CORE = "scalar_decay"


def _step(h_bhpn, x_bhp, dt_bh, A_bh, B_bgn, C_bgn, D_h):
    """One token in the compute dtype; A already per (b, h)."""
    heads = x_bhp.shape[1]
    B_bhn, C_bhn = expand_groups(B_bgn, heads), expand_groups(C_bgn, heads)
    decay = jnp.exp(dt_bh * A_bh)
    h_bhpn = decay[..., None, None] * h_bhpn + (dt_bh[..., None] * x_bhp)[..., None] * B_bhn[:, :, None, :]
    y = jnp.einsum("bhpn,bhn->bhp", h_bhpn, C_bhn)
    if D_h is not None:
        y = y + D_h[:, None] * x_bhp
    return y, h_bhpn


def scalar_decay_step(state, x, dt, A, B, C, D=None, *, check_values=None):
    """One decoding step. state (b, h, p, n) or None; x (b, h, p); dt (b, h); A (h,) or (b, h);
    B, C (b, g, n); D (h,) or None. Returns (y (b, h, p) in x's dtype, new float32 state)."""
    core = "scalar_decay_step"
    b, h, p, g, n = _checks.check_step_inputs(core, x, dt, A, B, C, D)
    _checks.check_values(core, _checks.value_checks_enabled(check_values), dt=dt, rate=A)
    cdt = _checks.compute_dtype(x, dt, A, B, C, D)
    if state is None:
        state = jnp.zeros((b, h, p, n), cdt)
    else:
        _checks.check_state_array(core, "state", state, (b, h, p, n), "(b, h, p, n)")
    A_bh = jnp.broadcast_to(_checks.cast(A, cdt), (b, h))
    c = functools.partial(_checks.cast, dtype=cdt)
    y, new = _step(c(state), c(x), c(dt), A_bh, c(B), c(C), c(D))
    return y.astype(x.dtype), new


def _sequential(x, dt, A, B, C, D, h0):
    def body(h, inputs):
        y, h = _step(h, *inputs, D)
        return h, y

    seq = tuple(jnp.moveaxis(a, 1, 0) for a in (x, dt, A, B, C))
    final, ys = jax.lax.scan(body, h0, seq)
    return jnp.moveaxis(ys, 0, 1), final


def _associative(x, dt, A, B, C, D, h0):
    h = x.shape[2]
    B_bthn, C_bthn = expand_groups(B, h), expand_groups(C, h)
    inc = (dt[..., None] * x)[..., None] * B_bthn[:, :, :, None, :]
    states = associative_states(jnp.exp(dt * A), inc, h0)
    y = jnp.einsum("bthpn,bthn->bthp", states, C_bthn)
    if D is not None:
        y = y + D[:, None] * x
    return y, states[:, -1]


def _chunked(x, dt, A, B, C, D, h0, chunk):
    y, final = chunked_ssd(x * dt[..., None], dt * A, [(B, C)], h0, chunk)
    if D is not None:
        y = y + D[:, None] * x
    return y, final


def _pallas(x, dt, A, B, C, D, h0, chunk, mm_dtype):
    y, final = pallas_ssd(x * dt[..., None], dt * A, B, C, h0, chunk, mm_dtype=mm_dtype)
    if D is not None:
        y = y + D[:, None] * x
    return y, final


def _run(algorithm, chunk_size, x, dt, A, B, C, D, h0, mm_dtype=None):
    if algorithm in _finite.SPREADING_ALGORITHMS:
        return _finite.keep_past_clean(
            functools.partial(_run_form, algorithm, chunk_size, mm_dtype=mm_dtype), (x, dt, A, B, C, D, h0),
            (_finite.HEAD, _finite.HEAD, _finite.HEAD, _finite.GROUP, None, None, None), x.shape[2])
    return _run_form(algorithm, chunk_size, x, dt, A, B, C, D, h0, mm_dtype)


def _run_form(algorithm, chunk_size, x, dt, A, B, C, D, h0, mm_dtype=None):
    if algorithm == "sequential":
        return _sequential(x, dt, A, B, C, D, h0)
    if algorithm == "associative":
        return _associative(x, dt, A, B, C, D, h0)
    if algorithm == "pallas":
        return _pallas(x, dt, A, B, C, D, h0, chunk_size or 64, mm_dtype)
    return _chunked(x, dt, A, B, C, D, h0, chunk_size or 64)


def scalar_decay(x, dt, A, B, C, D=None, *, initial_state=None, algorithm="auto", chunk_size=None,
                 check_values=None):
    """Runs the scalar-decay recurrence over a sequence; returns (y, final_state).

    y has x's dtype; the state (b, h, p, n) and all accumulation are float32 (float64 for float64
    inputs). `algorithm`: 'sequential' (lax.scan, the reference), 'associative'
    (lax.associative_scan), 'chunked' (SSD matmul form, `chunk_size` tokens per chunk), 'pallas'
    (the chunked form as a Pallas kernel, ssmgate/cores/pallas/; interpreted on CPU, slow) or
    'auto' (the fastest measured for this backend and size, see ssmgate/cores/auto.py).
    """
    _checks.check_algorithm(CORE, algorithm, _checks.KERNEL_ALGORITHMS)
    _checks.check_chunk_size(CORE, chunk_size)
    b, t, h, p, g, n = _checks.check_ssm_inputs(CORE, x, dt, A, B, C, D)
    _checks.check_values(CORE, _checks.value_checks_enabled(check_values), dt=dt, rate=A)
    if initial_state is not None:
        _checks.check_state_array(CORE, "initial_state", initial_state, (b, h, p, n), "(b, h, p, n)")
    cdt = _checks.compute_dtype(x, dt, A, B, C, D, initial_state)
    h0 = jnp.zeros((b, h, p, n), cdt) if initial_state is None else _checks.cast(initial_state, cdt)
    args = [_checks.cast(a, cdt) for a in (x, dt, per_token(A, b, t, h), B, C, D)] + [h0]
    run = functools.partial(_run, mm_dtype=_checks.matmul_dtype(x))
    if algorithm == "auto":
        y, final = auto.run_auto(CORE, t, chunk_size, run, *args, state_size=p * n)
    else:
        y, final = run(algorithm, chunk_size, *args)
    return y.astype(x.dtype), final


def scalar_decay_state(x, dt, A, B, *, initial_state=None, check_values=None):
    """The final state alone (prefill): h_T = exp(sum_t dt_t A_t) h_0 + sum_t w_t dt_t x_t B_t^T,
    w_t = exp(sum_{s > t} dt_s A_s), in O(t h p n) work and no outputs.

    Same arguments and state as `scalar_decay` (no C or D: nothing is read). For models that read the
    state once after a whole context, e.g. the P1 simplified SSM and decoding after a prompt.
    """
    core = "scalar_decay_state"
    b, t, h, p, g, n = _checks.check_ssm_inputs(core, x, dt, A, B, B, None)
    _checks.check_values(core, _checks.value_checks_enabled(check_values), dt=dt, rate=A)
    if initial_state is not None:
        _checks.check_state_array(core, "initial_state", initial_state, (b, h, p, n), "(b, h, p, n)")
    cdt = _checks.compute_dtype(x, dt, A, B, initial_state)
    x, dt, A, B = (_checks.cast(a, cdt) for a in (x, dt, per_token(A, b, t, h), B))
    logdecay = dt * A
    # Suffix sums (inclusive suffix minus the token's own term), not total - prefix: a long,
    # strongly decaying prefix would otherwise cancel against the total.
    after_bth = jnp.flip(jnp.cumsum(jnp.flip(logdecay, 1), axis=1), 1) - logdecay
    xw = x * (dt * jnp.exp(after_bth))[..., None]
    G = B.shape[2]
    state = jnp.einsum("btgjp,btgn->bgjpn", xw.reshape(b, t, G, h // G, p), B).reshape(b, h, p, n)
    if initial_state is not None:
        total = jnp.exp(after_bth[:, 0] + logdecay[:, 0])
        state = state + total[..., None, None] * _checks.cast(initial_state, cdt)
    return state
