"""Decay-rotation core: the Mamba-3 SISO recurrence of the official reference code.

Per head, with a_t = exp(dt_t A_t), lambda_t the trapezoid weight (None: Euler, lambda = 1):
  phase_t = (phase_{t-1} + dt_t theta_t) mod 2 pi                    (b, h, r), r <= n / 2
  B~_t = R(phase_t) B_t, C~_t = R(phase_t) C_t on interleaved pairs (2i, 2i+1), i < r
  h_t = a_t h_{t-1} + (1 - lambda_t) dt_t a_t x_{t-1} B~_{t-1}^T + lambda_t dt_t x_t B~_t^T
  y_t = h_t C~_t + D x_t
The state lives in rotated-B coordinates (protocol §1.3.1): history is only scaled, every rotation is
carried by B~ and C~. The final state carries (phase, h, B~_T, x_T) so a split run equals the whole.
"""
from __future__ import annotations

import functools

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.cores import _checks, _finite, auto
from ssmgate.cores._ssd import associative_states, chunked_ssd, expand_groups, per_token, previous_writes
from ssmgate.cores._trig import sin_cos
from ssmgate.cores.pallas import pallas_ssd

CORE = "rotation"
TWO_PI = 2.0 * np.pi  # float32(2 pi) when it meets float32 phases: see cumulative_phase


class RotationState(NamedTuple):
    """phase (b, h, r) reduced mod 2 pi; h (b, h, p, n); B_prev (b, h, n) = B~ of the last token;
    x_prev (b, h, p) = x of the last token (both feed the next token's trapezoid term)."""

    phase: jax.Array
    h: jax.Array
    B_prev: jax.Array
    x_prev: jax.Array

    @classmethod
    def zeros(cls, b: int, h: int, p: int, n: int, r: int, dtype=jnp.float32) -> "RotationState":
        return cls(jnp.zeros((b, h, r), dtype), jnp.zeros((b, h, p, n), dtype),
                   jnp.zeros((b, h, n), dtype), jnp.zeros((b, h, p), dtype))


def rotate_pairs(v, cos, sin):
    """Rotates interleaved pairs (2i, 2i+1), i < r = cos.shape[-1], of v (..., n) by the angle:
    (v0, v1) -> (v0 cos - v1 sin, v0 sin + v1 cos); channels >= 2r pass unchanged."""
    r = cos.shape[-1]
    if r == 0:
        return v
    pairs = v[..., : 2 * r].reshape(*v.shape[:-1], r, 2)
    v0, v1 = pairs[..., 0], pairs[..., 1]
    rotated = jnp.stack([v0 * cos - v1 * sin, v0 * sin + v1 * cos], axis=-1).reshape(*v.shape[:-1], 2 * r)
    return jnp.concatenate([rotated, v[..., 2 * r:]], axis=-1)


def cumulative_phase(increments_bthr, phase0_bhr):
    """phase_t = (phase_{t-1} + inc_t) mod 2 pi for all t, in log depth.

    Reducing at every combine keeps partial sums below 4 pi, so each combine rounds by ~1e-7 rad
    (a plain cumsum reaches thousands of radians over long sequences, where float32 resolves only
    ~1e-4 rad). In float32 the modulus is float32(2 pi), 1.7e-7 above 2 pi, so the absolute phase
    drifts from an exact-2pi reference by 1.7e-7 rad per full turn (the step function does the
    same). Outputs depend only on phase differences between nearby tokens and are unaffected; the
    state h, kept in rotated-B coordinates, carries the same offset as its phase, consistently.
    """
    inc = increments_bthr.at[:, 0].add(phase0_bhr)
    return jax.lax.associative_scan(lambda a, b: jnp.mod(a + b, TWO_PI), inc, axis=1)


def _check_state(core, state, b, h, p, n, r, arg="initial_state"):
    if not isinstance(state, RotationState):
        raise TypeError(
            f"{core}: argument '{arg}' is a {type(state).__name__}; expected a RotationState "
            f"(phase, h, B_prev, x_prev), e.g. the final_state of a previous call or RotationState.zeros(...)")
    for name, arr, shape, axes in (("phase", state.phase, (b, h, r), "(b, h, r)"),
                                   ("h", state.h, (b, h, p, n), "(b, h, p, n)"),
                                   ("B_prev", state.B_prev, (b, h, n), "(b, h, n)"),
                                   ("x_prev", state.x_prev, (b, h, p), "(b, h, p)")):
        _checks.check_state_array(core, f"{arg}.{name}", arr, shape, axes)


def _step(state, x, dt, A, B, C, theta, lam, D):
    """One token in the compute dtype. lam is None for Euler."""
    heads = x.shape[1]
    phase = jnp.mod(state.phase + dt[..., None] * theta, TWO_PI)
    # jnp here, not _trig.sin_cos: on a step's few phases the polynomial measured ~10% slower
    cos, sin = jnp.cos(phase), jnp.sin(phase)
    B_rot = rotate_pairs(expand_groups(B, heads), cos, sin)
    C_rot = rotate_pairs(expand_groups(C, heads), cos, sin)
    a = jnp.exp(dt * A)
    gamma = dt if lam is None else lam * dt
    h = a[..., None, None] * state.h + (gamma[..., None] * x)[..., None] * B_rot[:, :, None, :]
    if lam is not None:
        beta = (1.0 - lam) * dt * a
        h = h + (beta[..., None] * state.x_prev)[..., None] * state.B_prev[:, :, None, :]
    y = jnp.einsum("bhpn,bhn->bhp", h, C_rot)
    if D is not None:
        y = y + D[:, None] * x
    return y, RotationState(phase, h, B_rot, x)


def rotation_step(state, x, dt, A, B, C, theta, D=None, *, trap=None, check_values=None):
    """One decoding step. state: RotationState or None; x (b, h, p); dt (b, h); A (h,) or (b, h);
    B, C (b, g, n); theta (b, h, r); trap (b, h) or None. Returns (y (b, h, p), new state)."""
    core = "rotation_step"
    b, h, p, g, n = _checks.check_step_inputs(core, x, dt, A, B, C, D)
    r = _checks.check_pairs(core, "theta", theta, (b, h), n, "(b, h, r)")
    _checks.check_trap(core, trap, (b, h), "(b, h)")
    _checks.check_values(core, _checks.value_checks_enabled(check_values), dt=dt, rate=A, trap=trap)
    cdt = _checks.compute_dtype(x, dt, A, B, C, theta, D, trap)
    if state is None:
        state = RotationState.zeros(b, h, p, n, r, cdt)
    else:
        _check_state(core, state, b, h, p, n, r, arg="state")
    c = functools.partial(_checks.cast, dtype=cdt)
    y, new = _step(RotationState(*(c(v) for v in state)), c(x), c(dt), jnp.broadcast_to(c(A), (b, h)),
                   c(B), c(C), c(theta), c(trap), c(D))
    return y.astype(x.dtype), new


def scan_tokens(step, x, dt, A, B, C, theta, lam, D, state0):
    """The sequential reference of a rotation-family core: `step(state, x_t, dt_t, A_t, B_t, C_t,
    theta_t, lam_t, D) -> (y_t, state)` run over t with `lax.scan` (the time axis is axis 1)."""
    def body(state, inputs):
        y, state = step(state, *inputs[:6], None if lam is None else inputs[6], D)
        return state, y

    seq = [x, dt, A, B, C, theta] + ([] if lam is None else [lam])
    final, ys = jax.lax.scan(body, state0, tuple(jnp.moveaxis(a, 1, 0) for a in seq))
    return jnp.moveaxis(ys, 0, 1), final


def phases_cos_sin(dt, theta, phase0):
    """Cumulative phases (b, t, h, r) of the increments dt * theta and their cos and sin (by
    `_trig.sin_cos`: jnp.cos/sin cost 10x as much on XLA:CPU)."""
    phase = cumulative_phase(dt[..., None] * theta, phase0)
    sin, cos = sin_cos(phase)
    return phase, cos, sin


def _sequential(*args):
    return scan_tokens(_step, *args)


def trapezoid_scales(dt, lam):
    """The chunked forms' write scales under the trapezoid: token s enters the state with weight
    gamma_s = lambda_s dt_s at s and gamma_s + (1 - lambda_{s+1}) dt_{s+1} from s+1 on (the shifted
    term, already decayed by a_{s+1}); the diagonal (s read at s) keeps gamma_s. Returns that scale
    (b, t, h), the shifted part (subtracted again on the diagonal) and (1 - lambda_0) dt_0, the
    weight of the previous call's last write (b, h)."""
    carry = (1.0 - lam) * dt
    nxt = jnp.concatenate([carry[:, 1:], jnp.zeros_like(carry[:, :1])], axis=1)
    return lam * dt + nxt, nxt, carry[:, 0]


def trapezoid_inputs(x, dt, lam, state0):
    """The parallel forms' inputs under `trapezoid_scales`: x times its write scale, the diagonal's
    correction -(1 - lambda_{t+1}) dt_{t+1} x_t (None for Euler, lam None) and the initial state
    with the previous call's last write (x_prev, B_prev of state0) added."""
    if lam is None:
        return x * dt[..., None], None, state0.h
    scale, nxt, carry0 = trapezoid_scales(dt, lam)
    h0 = state0.h + (carry0[..., None] * state0.x_prev)[..., None] * state0.B_prev[:, :, None, :]
    return x * scale[..., None], -nxt[..., None] * x, h0


def _final_state(phase, B, cos, sin, h_final, x):
    B_last = rotate_pairs(expand_groups(B[:, -1], x.shape[2]), cos[:, -1], sin[:, -1])
    return RotationState(jnp.mod(phase[:, -1], TWO_PI), h_final, B_last, x[:, -1])


def _associative(x, dt, A, B, C, theta, lam, D, state0):
    heads = x.shape[2]
    phase, cos, sin = phases_cos_sin(dt, theta, state0.phase)
    B_rot = rotate_pairs(expand_groups(B, heads), cos, sin)
    C_rot = rotate_pairs(expand_groups(C, heads), cos, sin)
    a = jnp.exp(dt * A)
    gamma = dt if lam is None else lam * dt
    write = x[..., None] * B_rot[:, :, :, None, :]  # x_t B~_t^T: (b, t, h, p, n)
    inc = gamma[..., None, None] * write
    if lam is not None:
        prev = previous_writes(write, state0.x_prev, state0.B_prev)
        inc = inc + ((1.0 - lam) * dt * a)[..., None, None] * prev
    states = associative_states(a, inc, state0.h)
    y = jnp.einsum("bthpn,bthn->bthp", states, C_rot)
    if D is not None:
        y = y + D[:, None] * x
    return y, _final_state(phase, B, cos, sin, states[:, -1], x)


def _chunked(x, dt, A, B, C, theta, lam, D, state0, chunk):
    heads, r, n = x.shape[2], theta.shape[-1], B.shape[-1]
    phase, cos, sin = phases_cos_sin(dt, theta, state0.phase)
    # Rotated channels are per head (the phase depends on dt); the rest keep their groups, so their
    # C B^T is shared by the heads of a group as in scalar_decay.
    blocks = []
    if r:
        blocks.append((rotate_pairs(expand_groups(B[..., : 2 * r], heads), cos, sin),
                       rotate_pairs(expand_groups(C[..., : 2 * r], heads), cos, sin)))
    if 2 * r < n:
        blocks.append((B[..., 2 * r:], C[..., 2 * r:]))
    xs, xdiag, h0 = trapezoid_inputs(x, dt, lam, state0)
    y, h_final = chunked_ssd(xs, dt * A, blocks, h0, chunk, xdiag)
    if D is not None:
        y = y + D[:, None] * x
    return y, _final_state(phase, B, cos, sin, h_final, x)


def _pallas(x, dt, A, B, C, theta, lam, D, state0, chunk, mm_dtype):
    """The chunked form through the Pallas kernel: one (B~, C~) block, per head when any pair
    rotates (the unrotated channels are repeated over the heads of their group)."""
    heads, r = x.shape[2], theta.shape[-1]
    phase, cos, sin = phases_cos_sin(dt, theta, state0.phase)
    if r:
        B_k = rotate_pairs(expand_groups(B, heads), cos, sin)
        C_k = rotate_pairs(expand_groups(C, heads), cos, sin)
    else:
        B_k, C_k = B, C
    xs, xdiag, h0 = trapezoid_inputs(x, dt, lam, state0)
    y, h_final = pallas_ssd(xs, dt * A, B_k, C_k, h0, chunk, xdiag, mm_dtype=mm_dtype)
    if D is not None:
        y = y + D[:, None] * x
    return y, _final_state(phase, B, cos, sin, h_final, x)


def _run(algorithm, chunk_size, x, dt, A, B, C, theta, lam, D, state0, mm_dtype=None):
    if algorithm in _finite.SPREADING_ALGORITHMS:
        H = _finite.HEAD
        return _finite.keep_past_clean(
            functools.partial(_run_form, algorithm, chunk_size, mm_dtype=mm_dtype),
            (x, dt, A, B, C, theta, lam, D, state0), (H, H, H, _finite.GROUP, None, H, H, None, None), x.shape[2])
    return _run_form(algorithm, chunk_size, x, dt, A, B, C, theta, lam, D, state0, mm_dtype)


def _run_form(algorithm, chunk_size, x, dt, A, B, C, theta, lam, D, state0, mm_dtype=None):
    if algorithm == "sequential":
        return _sequential(x, dt, A, B, C, theta, lam, D, state0)
    if algorithm == "associative":
        return _associative(x, dt, A, B, C, theta, lam, D, state0)
    if algorithm == "pallas":
        return _pallas(x, dt, A, B, C, theta, lam, D, state0, chunk_size or 64, mm_dtype)
    return _chunked(x, dt, A, B, C, theta, lam, D, state0, chunk_size or 64)


def rotation(x, dt, A, B, C, theta, D=None, *, trap=None, initial_state=None, algorithm="auto", chunk_size=None,
             check_values=None):
    """Runs the Mamba-3 SISO decay-rotation recurrence; returns (y, final_state: RotationState).

    theta (b, t, h, r), r <= n/2: angle per unit dt in radians (a model applies pi*tanh to its
    projection). trap (b, t, h) in [0, 1] or None (Euler). Other arguments (and the algorithms,
    'pallas' included) as scalar_decay.
    """
    _checks.check_algorithm(CORE, algorithm, _checks.KERNEL_ALGORITHMS)
    _checks.check_chunk_size(CORE, chunk_size)
    b, t, h, p, g, n = _checks.check_ssm_inputs(CORE, x, dt, A, B, C, D)
    r = _checks.check_pairs(CORE, "theta", theta, (b, t, h), n)
    _checks.check_trap(CORE, trap, (b, t, h))
    _checks.check_values(CORE, _checks.value_checks_enabled(check_values), dt=dt, rate=A, trap=trap)
    cdt = _checks.compute_dtype(x, dt, A, B, C, theta, D, trap)
    if initial_state is None:
        state0 = RotationState.zeros(b, h, p, n, r, cdt)
    else:
        _check_state(CORE, initial_state, b, h, p, n, r)
        state0 = RotationState(*(_checks.cast(a, cdt) for a in initial_state))
    args = [_checks.cast(a, cdt) for a in (x, dt, per_token(A, b, t, h), B, C, theta, trap, D)] + [state0]
    run = functools.partial(_run, mm_dtype=_checks.matmul_dtype(x))
    if algorithm == "auto":
        y, final = auto.run_auto(CORE, t, chunk_size, run, *args, state_size=p * n)
    else:
        y, final = run(algorithm, chunk_size, *args)
    return y.astype(x.dtype), final
