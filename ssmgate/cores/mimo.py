"""Decay-rotation core of rank R: the Mamba-3 MIMO recurrence (protocol §1.3.3).

Per head, with a_t = exp(dt_t A_t), lambda_t the trapezoid weight (None: Euler, lambda = 1), and the
phase and pair rotation of `rotation` applied with the same angle to every rank column k < R:
  phase_t = (phase_{t-1} + dt_t theta_t) mod 2 pi                       (b, h, r), r <= n / 2
  B~_{t,k} = R(phase_t) B_{t,k},  C~_{t,k} = R(phase_t) C_{t,k}        (n,) each, k < R
  W_t = sum_k x_{t,k} B~_{t,k}^T                                       (p, n): a rank-R write
  h_t = a_t h_{t-1} + (1 - lambda_t) dt_t a_t W_{t-1} + lambda_t dt_t W_t
  y_{t,k} = h_t C~_{t,k} + D x_{t,k}                                   (R, p): R reads
The state h (b, h, p, n) is the SISO one: the rank multiplies the work per token, not the state.
R = 1 is `rotation`. Reducing y over ranks (learned per-rank weights, protocol §1.3.3) and the x -> X
up-projection belong to the model, not to the core. The final state carries
(phase, h, B~_T, x_T) so a split run equals the whole.

Shapes: x (b, t, h, R, p); dt (b, t, h); A (h,) or (b, t, h); B, C (b, t, g, R, n) with h % g == 0;
theta (b, t, h, r); D (h,) or None; trap (b, t, h) or None; y (b, t, h, R, p).
"""
from __future__ import annotations

import functools

from typing import NamedTuple

import jax
import jax.numpy as jnp
from einops import rearrange

from ssmgate.cores import _checks, _finite, auto
from ssmgate.cores._ssd import associative_states, carry_chunk_states, chunk_time, per_token, segment_decays
from ssmgate.cores.rotation import TWO_PI, phases_cos_sin, rotate_pairs, scan_tokens, trapezoid_scales

CORE = "rotation_mimo"
# The official MIMO kernels keep chunk * R <= 64 (protocol §1.3: chunk 16 at R = 4): the intra-chunk
# score matrix is (chunk R) x (chunk R) per head. Very high ranks keep at least 8 tokens per chunk.
CHUNK_BUDGET = 64
MIN_CHUNK = 8


def default_chunk_size(rank: int) -> int:
    """Tokens per chunk of `chunked` when chunk_size is None: max(8, 64 // R)."""
    return max(MIN_CHUNK, CHUNK_BUDGET // rank)


class MimoState(NamedTuple):
    """phase (b, h, r) reduced mod 2 pi; h (b, h, p, n); B_prev (b, h, R, n) = B~ of the last token;
    x_prev (b, h, R, p) = x of the last token (both feed the next token's trapezoid term)."""

    phase: jax.Array
    h: jax.Array
    B_prev: jax.Array
    x_prev: jax.Array

    @classmethod
    def zeros(cls, b: int, h: int, R: int, p: int, n: int, r: int, dtype=jnp.float32) -> "MimoState":
        return cls(jnp.zeros((b, h, r), dtype), jnp.zeros((b, h, p, n), dtype),
                   jnp.zeros((b, h, R, n), dtype), jnp.zeros((b, h, R, p), dtype))


# ----------------------------------------------------------------------------- argument checks

def _check_inputs(core, x, dt, A, B, C, D, *, step: bool):
    """Checks x (b, [t,] h, R, p), dt (b, [t,] h), A (h,) or (b, [t,] h), B/C (b, [t,] g, R, n), D (h,);
    returns (lead, h, R, p, g, n) with lead = (b, t) for a sequence, (b,) for a step."""
    for name, arr in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
        _checks.check_float(core, name, arr)
    if D is not None:
        _checks.check_float(core, "D", D)
    lead_axes = "b" if step else "b, t"
    _checks.check_ndim(core, "x", x, f"({lead_axes}, h, R, p)")
    lead, (h, R, p) = tuple(x.shape[:-3]), x.shape[-3:]
    if not step and lead[1] < 1:
        raise ValueError(f"{core}: argument 'x' has shape {tuple(x.shape)}; expected a sequence length t >= 1")
    if R < 1:
        raise ValueError(f"{core}: argument 'x' has shape {tuple(x.shape)}; expected a rank R >= 1 (axis -2)")
    of_x = f"to match x of shape {tuple(x.shape)}"
    per_tok = (*lead, h)
    axes_tok = f"({lead_axes}, h)"
    _checks.check_shape(core, "dt", dt, per_tok, axes_tok, of_x)
    if A.ndim == 1:
        _checks.check_shape(core, "A", A, (h,), "(h,)", f"(or {axes_tok} = {per_tok}) {of_x}")
    else:
        _checks.check_shape(core, "A", A, per_tok, axes_tok, f"(or (h,) = {(h,)}) {of_x}")
    axes_bc = f"({lead_axes}, g, R, n)"
    _checks.check_ndim(core, "B", B, axes_bc)
    g, n = B.shape[-3], B.shape[-1]
    _checks.check_shape(core, "B", B, (*lead, g, R, n), axes_bc,
                        f"with ({lead_axes}) and R from x of shape {tuple(x.shape)}")
    _checks.check_shape(core, "C", C, B.shape, axes_bc, f"to match B of shape {tuple(B.shape)}")
    if g < 1 or h % g != 0:
        raise ValueError(
            f"{core}: B/C have g = {g} groups (shape {tuple(B.shape)}) but x has h = {h} heads; "
            f"expected h % g == 0")
    if D is not None:
        _checks.check_shape(core, "D", D, (h,), "(h,)", of_x)
    return lead, h, R, p, g, n


def _check_state(core, state, b, h, R, p, n, r, arg="initial_state"):
    if not isinstance(state, MimoState):
        raise TypeError(
            f"{core}: argument '{arg}' is a {type(state).__name__}; expected a MimoState "
            f"(phase, h, B_prev, x_prev), e.g. the final_state of a previous call or MimoState.zeros(...)")
    for name, arr, shape, axes in (("phase", state.phase, (b, h, r), "(b, h, r)"),
                                   ("h", state.h, (b, h, p, n), "(b, h, p, n)"),
                                   ("B_prev", state.B_prev, (b, h, R, n), "(b, h, R, n)"),
                                   ("x_prev", state.x_prev, (b, h, R, p), "(b, h, R, p)")):
        _checks.check_state_array(core, f"{arg}.{name}", arr, shape, axes)


# ----------------------------------------------------------------------------- shared pieces

def _heads(arr, h: int, axis: int):
    """Group axis (size g, dividing h) -> h heads: head i reads group i // (h // g)."""
    g = arr.shape[axis]
    return arr if g == h else jnp.repeat(arr, h // g, axis=axis)


def _rotate_ranks(v_RN, cos_r, sin_r):
    """Rotates every rank column of v (..., R, n) by the per-head angles (..., r)."""
    return rotate_pairs(v_RN, cos_r[..., None, :], sin_r[..., None, :])


def _writes(x_RP, B_RN):
    """sum_k x_k B_k^T: (..., R, p), (..., R, n) -> (..., p, n)."""
    return jnp.einsum("...kp,...kn->...pn", x_RP, B_RN)


def _step(state, x, dt, A, B, C, theta, lam, D):
    """One token in the compute dtype: x (b, h, R, p), B/C (b, g, R, n). lam is None for Euler."""
    heads = x.shape[1]
    phase = jnp.mod(state.phase + dt[..., None] * theta, TWO_PI)
    cos, sin = jnp.cos(phase), jnp.sin(phase)
    B_rot = _rotate_ranks(_heads(B, heads, 1), cos, sin)
    C_rot = _rotate_ranks(_heads(C, heads, 1), cos, sin)
    a = jnp.exp(dt * A)
    gamma = dt if lam is None else lam * dt
    h = a[..., None, None] * state.h + gamma[..., None, None] * _writes(x, B_rot)
    if lam is not None:
        beta = (1.0 - lam) * dt * a
        h = h + beta[..., None, None] * _writes(state.x_prev, state.B_prev)
    y = jnp.einsum("bhpn,bhkn->bhkp", h, C_rot)
    if D is not None:
        y = y + D[:, None, None] * x
    return y, MimoState(phase, h, B_rot, x)


def rotation_mimo_step(state, x, dt, A, B, C, theta, D=None, *, trap=None, check_values=None):
    """One decoding step. state: MimoState or None; x (b, h, R, p); dt (b, h); A (h,) or (b, h);
    B, C (b, g, R, n); theta (b, h, r); D (h,) or None; trap (b, h) or None.
    Returns (y (b, h, R, p) in x's dtype, new float32 MimoState)."""
    core = "rotation_mimo_step"
    (b,), h, R, p, g, n = _check_inputs(core, x, dt, A, B, C, D, step=True)
    r = _checks.check_pairs(core, "theta", theta, (b, h), n, "(b, h, r)")
    _checks.check_trap(core, trap, (b, h), "(b, h)")
    _checks.check_values(core, _checks.value_checks_enabled(check_values), dt=dt, rate=A, trap=trap)
    cdt = _checks.compute_dtype(x, dt, A, B, C, theta, D, trap)
    if state is None:
        state = MimoState.zeros(b, h, R, p, n, r, cdt)
    else:
        _check_state(core, state, b, h, R, p, n, r, arg="state")
    c = functools.partial(_checks.cast, dtype=cdt)
    y, new = _step(MimoState(*(c(v) for v in state)), c(x), c(dt), jnp.broadcast_to(c(A), (b, h)),
                   c(B), c(C), c(theta), c(trap), c(D))
    return y.astype(x.dtype), new


# ----------------------------------------------------------------------------- algorithms

def _sequential(*args):
    return scan_tokens(_step, *args)


def _final_state(phase, B, cos, sin, h_final, x):
    B_last = _rotate_ranks(_heads(B[:, -1], x.shape[2], 1), cos[:, -1], sin[:, -1])
    return MimoState(jnp.mod(phase[:, -1], TWO_PI), h_final, B_last, x[:, -1])


def _associative(x, dt, A, B, C, theta, lam, D, state0):
    heads = x.shape[2]
    phase, cos, sin = phases_cos_sin(dt, theta, state0.phase)
    B_rot = _rotate_ranks(_heads(B, heads, 2), cos, sin)  # (b, t, h, R, n)
    C_rot = _rotate_ranks(_heads(C, heads, 2), cos, sin)
    a = jnp.exp(dt * A)
    gamma = dt if lam is None else lam * dt
    write = _writes(x, B_rot)  # W_t: (b, t, h, p, n)
    inc = gamma[..., None, None] * write
    if lam is not None:
        first = _writes(state0.x_prev, state0.B_prev)[:, None]
        prev = jnp.concatenate([first, write[:, :-1]], axis=1)  # W_{t-1}, the carried one first
        inc = inc + ((1.0 - lam) * dt * a)[..., None, None] * prev
    states = associative_states(a, inc, state0.h)
    y = jnp.einsum("bthpn,bthkn->bthkp", states, C_rot)
    if D is not None:
        y = y + D[:, None, None] * x
    return y, _final_state(phase, B, cos, sin, states[:, -1], x)


def chunked_mimo(xs_bthRp, logdecay_bth, blocks, h0_bhpn, chunk: int, xdiag_bthRp=None):
    """SSD decomposition of rank R: h_t = exp(l_t) h_{t-1} + sum_k xs_{t,k} B_{t,k}^T,
    y_{t,k} = h_t C_{t,k} (no D term).

    The intra-chunk form scores every (token, rank) pair against every other, (chunk R) x (chunk R)
    per head, with token-level decays and a token-level causal mask: the R reads of token t see all
    R writes of every token s <= t, those of t included.
    xs: inputs already multiplied by their write scale. l = logdecay <= 0.
    blocks: (B, C) pairs of shape (b, t, G, R, n_k), G dividing h; the state's channels are the
      blocks' channels concatenated in order (C B^T of a grouped block is shared by its heads).
    xdiag: optional (b, t, h, R, p); adds sum_k (C_{t,k'} . B_{t,k}) xdiag_{t,k} to y_{t,k'}, the
      trapezoid's diagonal fix.
    Any t: the sequence is zero-padded to a multiple of `chunk` (padded l = 0, xs = 0: inert).
    Returns y (b, t, h, R, p) and the final state (b, h, p, n).
    """
    b, t, h, R, p = xs_bthRp.shape
    q = chunk
    xs = chunk_time(xs_bthRp, q)
    blocks = [(chunk_time(B, q), chunk_time(C, q)) for B, C in blocks]
    cum_bcqh, decay_bchqs, to_end_bcqh = segment_decays(chunk_time(logdecay_bth, q))

    # Intra-chunk scores between (token q, rank k) reads and (token s, rank j) writes.
    cb_bchqksj = 0.0
    for B, C in blocks:
        cb_bchqksj = cb_bchqksj + _heads(jnp.einsum("bcqgkn,bcsgjn->bcgqksj", C, B), h, axis=2)
    scores = decay_bchqs[:, :, :, :, None, :, None] * cb_bchqksj
    y = jnp.einsum("bchqksj,bcshjp->bcqhkp", scores, xs)

    # Chunk states: contributions of each chunk to the state at its end.
    xw = xs * to_end_bcqh[..., None, None]
    states = []
    for B, _ in blocks:
        G = B.shape[3]
        xw_g = rearrange(xw, "b c s (g i) k p -> b c s g i k p", g=G)
        s = jnp.einsum("bcsgikp,bcsgkn->bcgipn", xw_g, B)
        states.append(rearrange(s, "b c g i p n -> b c (g i) p n"))
    chunk_states = states[0] if len(states) == 1 else jnp.concatenate(states, axis=-1)

    final, starts = carry_chunk_states(chunk_states, cum_bcqh, h0_bhpn)

    y_inter = 0.0
    offset = 0
    for B, C in blocks:
        G, nk = C.shape[3], C.shape[-1]
        s_k = rearrange(starts[..., offset:offset + nk], "b c (g i) p n -> b c g i p n", g=G)
        y_inter = y_inter + rearrange(jnp.einsum("bcqgkn,bcgipn->bcqgikp", C, s_k), "b c q g i k p -> b c q (g i) k p")
        offset += nk
    y = y + y_inter * jnp.exp(cum_bcqh)[..., None, None]

    if xdiag_bthRp is not None:
        xdiag = chunk_time(xdiag_bthRp, q)
        cb_diag_bchkjq = jnp.diagonal(cb_bchqksj, axis1=3, axis2=5)  # same token: (k, j) block
        y = y + jnp.einsum("bchkjq,bcqhjp->bcqhkp", cb_diag_bchkjq, xdiag)
    y = rearrange(y, "b c q h k p -> b (c q) h k p")[:, :t]
    return y, final


def _chunked(x, dt, A, B, C, theta, lam, D, state0, chunk):
    heads, r, n = x.shape[2], theta.shape[-1], B.shape[-1]
    phase, cos, sin = phases_cos_sin(dt, theta, state0.phase)
    # As in rotation: rotated channels are per head (the phase depends on dt); the rest keep their
    # groups, so their C B^T is shared by the heads of a group.
    blocks = []
    if r:
        blocks.append((_rotate_ranks(_heads(B[..., : 2 * r], heads, 2), cos, sin),
                       _rotate_ranks(_heads(C[..., : 2 * r], heads, 2), cos, sin)))
    if 2 * r < n:
        blocks.append((B[..., 2 * r:], C[..., 2 * r:]))
    h0, xdiag = state0.h, None
    if lam is None:
        scale = dt
    else:
        # As in rotation; the diagonal correction covers every rank pair of a token.
        scale, nxt, carry0 = trapezoid_scales(dt, lam)
        xdiag = -nxt[..., None, None] * x
        h0 = h0 + carry0[..., None, None] * _writes(state0.x_prev, state0.B_prev)
    y, h_final = chunked_mimo(x * scale[..., None, None], dt * A, blocks, h0, chunk, xdiag)
    if D is not None:
        y = y + D[:, None, None] * x
    return y, _final_state(phase, B, cos, sin, h_final, x)


def _run(algorithm, chunk_size, x, dt, A, B, C, theta, lam, D, state0):
    if algorithm in _finite.SPREADING_ALGORITHMS:
        H = _finite.HEAD
        return _finite.keep_past_clean(
            functools.partial(_run_form, algorithm, chunk_size),
            (x, dt, A, B, C, theta, lam, D, state0), (H, H, H, _finite.GROUP, None, H, H, None, None), x.shape[2])
    return _run_form(algorithm, chunk_size, x, dt, A, B, C, theta, lam, D, state0)


def _run_form(algorithm, chunk_size, x, dt, A, B, C, theta, lam, D, state0):
    if algorithm == "sequential":
        return _sequential(x, dt, A, B, C, theta, lam, D, state0)
    if algorithm == "associative":
        return _associative(x, dt, A, B, C, theta, lam, D, state0)
    return _chunked(x, dt, A, B, C, theta, lam, D, state0, chunk_size or default_chunk_size(x.shape[3]))


def auto_is_measured(backend: str | None = None) -> bool:
    """Whether `auto` has measured choices (or a fallback) for this core on the backend."""
    backend = backend or jax.default_backend()
    return CORE in auto.load_table().get(backend, {}) or CORE in auto.FALLBACK


def rotation_mimo(x, dt, A, B, C, theta, D=None, *, trap=None, initial_state=None, algorithm="auto",
                  chunk_size=None, check_values=None):
    """Runs the Mamba-3 MIMO (rank R) decay-rotation recurrence; returns (y, final_state: MimoState).

    x (b, t, h, R, p); B, C (b, t, g, R, n); y (b, t, h, R, p) in x's dtype; the state and all
    accumulation are float32 (float64 for float64 inputs). theta (b, t, h, r), r <= n/2, and trap
    (b, t, h) or None as in `rotation`; dt, A, D as in scalar_decay.
    `algorithm`: 'sequential' (lax.scan over `rotation_mimo_step`, the reference), 'associative'
    (lax.associative_scan over per-token states), 'chunked' (the SSD matmul form of rank R,
    `chunk_size` tokens per chunk, default max(8, 64 // R)) or 'auto'. 'auto' goes through
    `auto.run_auto` once the table of ssmgate/cores/auto.py (or its FALLBACK) holds 'rotation_mimo'
    for the backend; the benchmark does not measure this core yet, so until then 'auto' runs
    'chunked' with the default chunk: the form of the official MIMO kernels, whose forward and
    backward are matmuls over (chunk R)-sized blocks. On CPU (b=1, h=4, R=4, p=16, n=32, t=256 and
    1024) it was also the fastest forward and forward+backward of the three, 2-4x ahead of the scan
    in training.
    """
    _checks.check_algorithm(CORE, algorithm)
    _checks.check_chunk_size(CORE, chunk_size)
    (b, t), h, R, p, g, n = _check_inputs(CORE, x, dt, A, B, C, D, step=False)
    r = _checks.check_pairs(CORE, "theta", theta, (b, t, h), n)
    _checks.check_trap(CORE, trap, (b, t, h))
    _checks.check_values(CORE, _checks.value_checks_enabled(check_values), dt=dt, rate=A, trap=trap)
    cdt = _checks.compute_dtype(x, dt, A, B, C, theta, D, trap)
    if initial_state is None:
        state0 = MimoState.zeros(b, h, R, p, n, r, cdt)
    else:
        _check_state(CORE, initial_state, b, h, R, p, n, r)
        state0 = MimoState(*(_checks.cast(a, cdt) for a in initial_state))
    args = [_checks.cast(a, cdt) for a in (x, dt, per_token(A, b, t, h), B, C, theta, trap, D)] + [state0]
    if algorithm == "auto" and auto_is_measured():
        y, final = auto.run_auto(CORE, t, chunk_size, _run, *args, state_size=p * n)
    elif algorithm == "auto":
        y, final = _run("chunked", chunk_size, *args)
    else:
        y, final = _run(algorithm, chunk_size, *args)
    return y.astype(x.dtype), final
