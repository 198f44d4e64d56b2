"""The oscillator view of frozen linear-recurrence transitions, in float64 numpy/scipy.

Formulas of protocol §1.5-1.8 (P2 §2.2, §4.2, App. A, App. C.1-C.3):

* second-order form of one 2x2 block: generator A(kappa) = [[0, 1], [-(a^2 - kappa), -2a]] with
  eigenvalues -a +- sqrt(kappa), its regimes (under: kappa < 0, critical: kappa = 0, over:
  0 < kappa < a^2), its exact discretisation Abar = exp(dt A) in closed form, damping ratio and
  natural frequency, and the map from discrete eigenvalues to continuous rates (§1.5, §1.7 "Rates");
* modal persistence (§1.6): the critical Jordan limit, the collapse of overdamped trajectories onto
  the slow mode, and the angle-preserving underdamped flow;
* the steady-state gain of a rotating accumulator (§1.8);
* the frozen-transition spectra of six linear-attention families (§1.7, Table 8): builders,
  eigenvalues, the stated "complex iff" conditions, the table's damping ratios and random draws.

Everything is a pure function of its arguments; no JAX, no state, no I/O. Bad arguments raise
ValueError naming the argument, the allowed range and the value given.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Callable

import numpy as np
from scipy import linalg

from ssmgate.theory._args import _array, _check, _out

__all__ = [
    # second-order view of one block (protocol §1.5, §1.7 Rates)
    "REGIMES", "natural_frequency", "damping_ratio", "kappa_from_natural_frequency", "core_kappa",
    "regime", "rates_from_complex_pair", "rate_from_real_eigenvalue", "continuous_generator",
    "discrete_transition", "rotation_generator", "companion_from_rotation",
    # modal persistence (protocol §1.6)
    "propagate", "angle_between", "critical_limit", "critical_scaled_propagator", "overdamped_rates",
    "slow_eigenvector", "overdamped_direction_cosine", "underdamped_angles", "asymptotic_decay_rate",
    # steady-state gain (protocol §1.8)
    "steady_state_gain", "transient_gain", "simulated_gain",
    # frozen-transition spectra (protocol §1.7, Table 8)
    "MODELS", "linear_attention_transition", "deltanet_transition", "gated_deltanet_transition",
    "kda_transition", "kda_symmetrized", "complex_kda_block", "momentum_deltanet_block",
    "complex_kda_is_complex", "momentum_deltanet_is_complex", "complex_kda_boundary_cos",
    "pair_damping_ratio", "block_damping_ratio", "gated_deltanet_damping_ratio",
    "frozen_transition", "spectrum", "eigen_type", "stated_complex", "table_damping_ratios",
    "spectral_damping_ratios", "random_draws",
]

REGIMES = ("under", "critical", "over")
_SERIES_LIMIT = 1e-6  # |kappa| dt^2 below this: c and s from their series (protocol §1.5)


# --------------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------------

def _finite(name, value):
    return _check(name, value, np.isfinite, "finite")


def _positive(name, value):
    return _check(name, value, lambda x: (x > 0) & np.isfinite(x), "> 0 (and finite)")


def _non_negative(name, value):
    return _check(name, value, lambda x: (x >= 0) & np.isfinite(x), ">= 0 (and finite)")


def _open_interval(name, value, low, high):
    return _check(name, value, lambda x: (x > low) & (x < high), f"in ({low:g}, {high:g})")


def _unit_vector(name, value):
    k = _array(name, value)
    if k.ndim != 1 or k.size < 1:
        raise ValueError(f"{name} must be a 1-D vector, got shape {k.shape}")
    norm = np.linalg.norm(k)
    if not abs(norm - 1.0) <= 1e-10:
        raise ValueError(f"{name} must be a unit vector (norm 1 within 1e-10), got norm {norm!r}")
    return k


def _vector2(name, value):
    z = _finite(name, value)
    if z.shape != (2,):
        raise ValueError(f"{name} must have shape (2,), got shape {z.shape}")
    return z


def _times(times):
    t = _non_negative("times", times)
    return np.atleast_1d(t)


def _matrix2(*rows):
    """Stacks broadcastable entries [[m00, m01], [m10, m11]] into (..., 2, 2)."""
    (m00, m01), (m10, m11) = rows
    m00, m01, m10, m11 = np.broadcast_arrays(m00, m01, m10, m11)
    return np.stack([np.stack([m00, m01], -1), np.stack([m10, m11], -1)], -2)


# --------------------------------------------------------------------------------------------------
# Second-order view of one block (protocol §1.5, §1.7 "Rates")
# --------------------------------------------------------------------------------------------------

def natural_frequency(a, nu):
    """omega0 = sqrt(a^2 + nu^2): the undamped frequency of the complex pair -a +- i nu (protocol §1.7).

    In second-order form H'' + 2a H' + omega0^2 H = 0, omega0^2 = a^2 - kappa with kappa = -nu^2.
    """
    return _out(np.hypot(_finite("a", a), _finite("nu", nu)))


def damping_ratio(a, nu):
    """zeta = a / sqrt(a^2 + nu^2) of the complex pair -a +- i nu (protocol §1.7 "Rates").

    In (0, 1) for a > 0, nu != 0 (underdamped); 1 at nu = 0. Scale-free: the same for (a, nu) and
    (a dt, nu dt), so it can be read from a discrete pair rho e^{+-i phi} as (-log rho, phi).
    """
    a_, nu_ = _positive("a", a), _finite("nu", nu)
    return _out(a_ / np.hypot(a_, nu_))


def kappa_from_natural_frequency(omega0, a):
    """kappa = a^2 - omega0^2: the regime parameter at damping rate a and natural frequency omega0 (protocol §1.6)."""
    return _out(_finite("a", a) ** 2 - _positive("omega0", omega0) ** 2)


def core_kappa(regime_name, a, nu, overdamped_c=0.9):
    """kappa of the damped core's regimes (protocol §1.5): under -nu^2, critical 0, over (c a tanh nu)^2.

    Mirrors how `ssmgate.cores.damped` maps its (a, nu) arguments to a generator.
    """
    a_, nu_ = _positive("a", a), _finite("nu", nu)
    if regime_name == "under":
        return _out(-nu_ ** 2 + 0.0 * a_)
    if regime_name == "critical":
        return _out(np.zeros(np.broadcast_shapes(a_.shape, nu_.shape)))
    if regime_name == "over":
        c = float(_open_interval("overdamped_c", overdamped_c, 0.0, 1.0))
        return _out((c * a_ * np.tanh(nu_)) ** 2)
    raise ValueError(f"regime_name must be one of {', '.join(map(repr, REGIMES))}, got {regime_name!r}")


def regime(kappa, a, tol=1e-12):
    """Classifies a damped block (protocol §1.5): 'under' (kappa < -tol), 'critical' (|kappa| <= tol),
    'over' (tol < kappa < a^2).

    kappa >= a^2 is rejected: the slow root -a + sqrt(kappa) would not decay. Returns a str for
    scalar input, an array of str otherwise.
    """
    a_, t = _positive("a", a), float(_non_negative("tol", tol))
    k = _check("kappa", kappa, lambda x: np.isfinite(x) & (x < a_ ** 2),
               "finite and < a**2 (a non-decaying slow mode has no damped regime)")
    names = np.select([k < -t, k <= t], ["under", "critical"], "over")
    return str(names) if names.ndim == 0 else names


def rates_from_complex_pair(rho, phi, dt):
    """(a, nu) = (-log rho / dt, phi / dt) of a discrete pair rho e^{+-i phi} with step dt (protocol §1.7)."""
    r = _open_interval("rho", rho, 0.0, np.inf)
    step = _positive("dt", dt)
    return _out(-np.log(r) / step), _out(_finite("phi", phi) / step)


def rate_from_real_eigenvalue(mu, dt):
    """b = -log mu / dt of a real eigenvalue mu in (0, 1] with step dt (protocol §1.7); b = 0 at mu = 1."""
    m = _check("mu", mu, lambda x: (x > 0) & (x <= 1), "in (0, 1]")
    return _out(-np.log(m) / _positive("dt", dt))


def continuous_generator(a, kappa):
    """A(kappa) = [[0, 1], [-(a^2 - kappa), -2a]] (protocol §1.5), shape (..., 2, 2) over broadcast a, kappa.

    Eigenvalues -a +- sqrt(kappa); companion form of H'' + 2a H' + (a^2 - kappa) H = 0.
    """
    a_, k = _finite("a", a), _finite("kappa", kappa)
    return _matrix2((0.0, 1.0), (-(a_ ** 2 - k), -2.0 * a_))


def _scaled_c_s(dt, a, kappa):
    """(e^{-a dt} c(kappa), e^{-a dt} s(kappa)) of protocol §1.5.

    kappa > 0 uses the mode form e^{-a dt} cosh(r dt) = (e^{-(a-r)dt} + e^{-(a+r)dt}) / 2 and
    e^{-a dt} sinh(r dt)/r = e^{-(a-r)dt} (1 - e^{-2r dt}) / (2r), which never overflows; the
    series 1 + x/2 + x^2/24 and dt (1 + x/6 + x^2/120), x = kappa dt^2, covers |x| < 1e-6.
    """
    x = kappa * dt * dt
    series = np.abs(x) < _SERIES_LIMIT
    over = (kappa > 0) & ~series
    root_k = np.sqrt(np.where(series, 1.0, np.abs(kappa)))  # sqrt|kappa| (dummy 1 on the series branch)
    root = root_k * dt
    decay = np.exp(-a * dt)
    slow = np.exp(-(a - root_k) * dt)
    fast_ratio = np.exp(-2.0 * root)
    c = np.select([series, over], [decay * (1.0 + x / 2.0 + x * x / 24.0), slow * (1.0 + fast_ratio) / 2.0],
                  decay * np.cos(root))
    s = np.select([series, over], [decay * dt * (1.0 + x / 6.0 + x * x / 120.0),
                                   slow * -np.expm1(-2.0 * root) / (2.0 * root_k)],
                  decay * np.sin(root) / root_k)
    return c, s


def discrete_transition(dt, a, kappa):
    """Abar = exp(dt A(kappa)) = e^{-a dt} [c(kappa) I + s(kappa) N] in closed form (protocol §1.5).

    N = A + aI = [[a, 1], [-(a^2 - kappa), -a]] satisfies N^2 = kappa I; c, s are cosh/sinh
    (kappa > 0), 1/dt (kappa = 0) or cos/sin (kappa < 0) terms. Shape (..., 2, 2) over broadcast
    dt, a, kappa. Any finite kappa is allowed (kappa >= a^2 gives a growing mode, still exact).
    """
    step, a_, k = _non_negative("dt", dt), _finite("a", a), _finite("kappa", kappa)
    step, a_, k = np.broadcast_arrays(step, a_, k)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # unused np.select branches
        ec, es = _scaled_c_s(step, a_, k)
    return _matrix2((ec + es * a_, es), (-es * (a_ ** 2 - k), ec - es * a_))


def rotation_generator(a, nu):
    """-a I + nu J, J = [[0, -1], [1, 0]]: the underdamped block in rotation coordinates z = (H, P) (protocol §1.5).

    Its exponential is e^{-a t} R(nu t), R(phi) = [[cos, -sin], [sin, cos]].
    """
    a_, nu_ = _finite("a", a), _finite("nu", nu)
    return _matrix2((-a_, -nu_), (nu_, -a_))


def companion_from_rotation(a, nu):
    """M = [[1, 0], [-a, -nu]] with (H, H') = M (H, P): rotation to companion coordinates (protocol §1.5).

    Invertible iff nu != 0; then A(-nu^2) = M (-a I + nu J) M^{-1}.
    """
    a_, nu_ = _finite("a", a), _finite("nu", nu)
    return _matrix2((1.0, 0.0), (-a_, -nu_))


# --------------------------------------------------------------------------------------------------
# Modal persistence (protocol §1.6): frozen coefficients, natural frequency omega0, varying a
# --------------------------------------------------------------------------------------------------

def propagate(generator, z0, times, shift=0.0):
    """Rows e^{shift t} e^{G t} z0 for each t in `times` (scipy expm of t (G + shift I)), shape (len(times), 2).

    The shift rescales a decaying flow to O(1) without changing directions or angles (e^{G t}
    itself underflows for long times); it commutes with G, so the product is exact.
    """
    g = _finite("generator", generator)
    if g.shape != (2, 2):
        raise ValueError(f"generator must have shape (2, 2), got shape {g.shape}")
    z, t = _vector2("z0", z0), _times(times)
    shifted = g + float(_finite("shift", shift)) * np.eye(2)
    return np.stack([linalg.expm(tk * shifted) @ z for tk in t])


def angle_between(u, v):
    """Angle in [0, pi] between 2-vectors, row by row: atan2(|u x v|, u . v) (accurate near 0 and pi)."""
    u_, v_ = _finite("u", u), _finite("v", v)
    cross = u_[..., 0] * v_[..., 1] - u_[..., 1] * v_[..., 0]
    return _out(np.arctan2(np.abs(cross), np.sum(u_ * v_, axis=-1)))


def critical_limit(omega0):
    """N = A + omega0 I = [[omega0, 1], [-omega0^2, -omega0]]: nilpotent (N^2 = 0), rank 1 (protocol §1.6)."""
    w = float(_positive("omega0", omega0))
    return np.array([[w, 1.0], [-w * w, -w]])


def critical_scaled_propagator(omega0, t):
    """e^{omega0 t} e^{A t} / t for the critical block a = omega0 (protocol §1.6); tends to N as t grows.

    e^{A t} = e^{-omega0 t}(I + t N) (Jordan block), so the value is N + I/t. Computed by expm of
    t (A + omega0 I) (e^{A t} alone underflows at t = 1e3).
    """
    w, time = float(_positive("omega0", omega0)), float(_positive("t", t))
    shifted = continuous_generator(w, 0.0) + w * np.eye(2)
    return linalg.expm(time * shifted) / time


def overdamped_rates(omega0, a):
    """(slow, fast) = (a - r, a + r), r = sqrt(a^2 - omega0^2), for a > omega0 (protocol §1.6).

    The slow (dominant) rate is formed as omega0^2 / (a + r) < omega0, free of cancellation.
    """
    w = _positive("omega0", omega0)
    a_ = _check("a", a, lambda x: np.isfinite(x) & (x > w), "> omega0 (overdamped)")
    r = np.sqrt((a_ - w) * (a_ + w))
    return _out(w * w / (a_ + r)), _out(a_ + r)


def slow_eigenvector(omega0, a):
    """Unit eigenvector (1, -(a - r)) / norm of A(kappa) for the slow root -(a - r) (protocol §1.6)."""
    slow, _ = overdamped_rates(omega0, a)
    v = np.array([1.0, -slow])
    return v / np.linalg.norm(v)


def overdamped_direction_cosine(omega0, a, z0, times):
    """|cos| of the angle between e^{A t} z0 and the slow eigenvector at each t (protocol §1.6).

    The fast/slow amplitude ratio shrinks like e^{-2 r t}, so this tends to 1 when z0 has a slow
    component. Frozen A(kappa), kappa = a^2 - omega0^2 > 0.
    """
    slow, _ = overdamped_rates(omega0, a)
    generator = continuous_generator(a, kappa_from_natural_frequency(omega0, a))
    traj = propagate(generator, z0, times, shift=slow)
    v = slow_eigenvector(omega0, a)
    return np.abs(traj @ v) / np.linalg.norm(traj, axis=1)


def underdamped_angles(omega0, a, z0, z1, times, coordinates="rotation"):
    """Angle between the trajectories from z0 and z1 of the underdamped block at each t (protocol §1.6).

    nu = sqrt(omega0^2 - a^2). coordinates='rotation': z = (H, P) under -aI + nu J, where
    z_t = e^{-a t} R(nu t) z_0 and the angle is constant; 'companion': the same motions seen as
    (H, H') = M z under A(-nu^2), where it is not (M is not a similarity of the plane).
    """
    w = _positive("omega0", omega0)
    a_ = float(_check("a", a, lambda x: (x > 0) & (x < w), "in (0, omega0) (underdamped)"))
    nu = float(np.sqrt((w - a_) * (w + a_)))
    z0_, z1_ = _vector2("z0", z0), _vector2("z1", z1)
    if coordinates == "rotation":
        generator = rotation_generator(a_, nu)
    elif coordinates == "companion":
        generator = continuous_generator(a_, -nu * nu)
        m = companion_from_rotation(a_, nu)
        z0_, z1_ = m @ z0_, m @ z1_
    else:
        raise ValueError(f"coordinates must be 'rotation' or 'companion', got {coordinates!r}")
    return angle_between(propagate(generator, z0_, times, shift=a_), propagate(generator, z1_, times, shift=a_))


def asymptotic_decay_rate(omega0, a):
    """Slowest mode's decay rate a - Re sqrt(a^2 - omega0^2): a (under), omega0 (critical), a - r (over).

    Largest, omega0, at critical damping a = omega0 (protocol §1.6).
    """
    w, a_ = _positive("omega0", omega0), _positive("a", a)
    r = np.sqrt(np.maximum((a_ - w) * (a_ + w), 0.0))
    return _out(np.where(a_ > w, w * w / (a_ + r), a_))


# --------------------------------------------------------------------------------------------------
# Steady-state gain (protocol §1.8)
# --------------------------------------------------------------------------------------------------

def _gain_args(rho, theta, u):
    r = _check("rho", rho, lambda x: (x >= 0) & (x < 1), "in [0, 1)")
    return r, _finite("theta", theta), np.abs(_write("u", u))


def _write(name, value):
    """A real or complex write as complex128; raises naming it when not numeric or not finite."""
    try:
        arr = np.asarray(value, dtype=np.complex128)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real or complex number or array, got {value!r}") from None
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return arr


def steady_state_gain(rho, theta, u=1.0):
    """|z_inf| = |u| / |1 - rho e^{i theta}| of z_t = rho e^{i theta} z_{t-1} + u (protocol §1.8).

    |1 - rho e^{i theta}|^2 = (1 - rho)^2 + 4 rho sin^2(theta/2) (= (1-rho)^2 + 2 rho (1 - cos theta),
    without its cancellation at small theta). theta = 0 gives 1/(1 - rho), the no-rotation maximum.
    """
    r, th, mag = _gain_args(rho, theta, u)
    return _out(mag / np.sqrt((1.0 - r) ** 2 + 4.0 * r * np.sin(th / 2.0) ** 2))


def transient_gain(rho, theta, steps, u=1.0):
    """|z_t| = |1 - (rho e^{i theta})^t| / |1 - rho e^{i theta}| |u| after t steps from z_0 = 0 (protocol §1.8)."""
    r, th, mag = _gain_args(rho, theta, u)
    t = _check("steps", steps, lambda x: np.isfinite(x) & (x >= 0) & (x == np.round(x)), "an integer >= 0")
    lam = r * np.exp(1j * th)
    return _out(mag * np.abs(1.0 - lam ** t) / np.abs(1.0 - lam))


def simulated_gain(rho, theta, steps, u=1.0):
    """|z_steps| from iterating z_t = rho e^{i theta} z_{t-1} + u, z_0 = 0 (protocol §1.8, check C4).

    Vectorised over broadcast rho, theta, u (complex u allowed: the gain depends on |u| only).
    """
    r = _check("rho", rho, lambda x: (x >= 0) & (x < 1), "in [0, 1)")
    th = _finite("theta", theta)
    n = int(_check("steps", steps, lambda x: np.isfinite(x) & (x >= 0) & (x == np.round(x)), "an integer >= 0"))
    write = _write("u", u)
    lam = r * np.exp(1j * th)
    z = np.zeros(np.broadcast_shapes(lam.shape, write.shape), dtype=np.complex128)
    for _ in range(n):
        z = lam * z + write
    return _out(np.abs(z))


# --------------------------------------------------------------------------------------------------
# Frozen-transition spectra (protocol §1.7, Table 8): S_t = T S_{t-1}, unit key k, H = I - beta k k^T
# --------------------------------------------------------------------------------------------------

def _householder_like(k, beta):
    return np.eye(k.size) - beta * np.outer(k, k)


def linear_attention_transition(d):
    """T = I_d: pure accumulation, every eigenvalue 1 (rate 0)."""
    n = int(_check("d", d, lambda x: (x >= 1) & (x == np.round(x)), "an integer >= 1"))
    return np.eye(n)


def deltanet_transition(k, beta):
    """T = H = I - beta k k^T, 0 < beta < 1: eigenvalue 1 - beta on k, 1 on k^perp (no restoring term)."""
    return _householder_like(_unit_vector("k", k), float(_open_interval("beta", beta, 0.0, 1.0)))


def gated_deltanet_transition(k, beta, alpha):
    """T = alpha H, 0 < alpha < 1: eigenvalues alpha (1 - beta) on k and alpha on k^perp."""
    a = float(_open_interval("alpha", alpha, 0.0, 1.0))
    return a * deltanet_transition(k, beta)


def _kda_args(k, beta, alpha):
    k_ = _unit_vector("k", k)
    b = float(_open_interval("beta", beta, 0.0, 1.0))
    gates = _open_interval("alpha", alpha, 0.0, 1.0)
    if gates.shape != k_.shape:
        raise ValueError(f"alpha must have the key's shape {k_.shape} (one gate per channel), got shape {gates.shape}")
    return k_, b, gates


def kda_transition(k, beta, alpha):
    """T = H D, D = Diag(alpha), alpha_i in (0, 1): similar to the symmetric PD D^{1/2} H D^{1/2},
    so its spectrum is real and lies in (0, 1)."""
    k_, b, gates = _kda_args(k, beta, alpha)
    return _householder_like(k_, b) * gates[None, :]


def kda_symmetrized(k, beta, alpha):
    """D^{1/2} (H D) D^{-1/2} = D^{1/2} H D^{1/2}: the symmetric matrix similar to the KDA transition."""
    k_, b, gates = _kda_args(k, beta, alpha)
    root = np.sqrt(gates)
    return np.outer(root, root) * _householder_like(k_, b)  # entrywise; exactly symmetric


def complex_kda_block(alpha, theta):
    """T = R(theta) Diag(-alpha, 1), -1 < alpha < 0 (reflection beta = 2 with a signed gate).

    Trace (1 - alpha) cos theta, determinant -alpha; a complex pair has modulus sqrt(-alpha).
    """
    a = float(_open_interval("alpha", alpha, -1.0, 0.0))
    th = float(_finite("theta", theta))
    rot = np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])
    return rot * np.array([-a, 1.0])[None, :]


def _momentum_args(alpha, beta, eta, mu):
    return (float(_open_interval("alpha", alpha, 0.0, 1.0)), float(_open_interval("beta", beta, 0.0, 1.0)),
            float(_positive("eta", eta)), float(_open_interval("mu", mu, 0.0, 1.0)))


def momentum_deltanet_block(alpha, beta, eta, mu):
    """Key-direction (state, momentum) block [[alpha (1 - beta eta), -beta mu], [alpha eta, mu]].

    Trace tau = alpha (1 - beta eta) + mu, determinant alpha mu; a complex pair has modulus sqrt(alpha mu).
    """
    a, b, e, m = _momentum_args(alpha, beta, eta, mu)
    return np.array([[a * (1.0 - b * e), -b * m], [a * e, m]])


def complex_kda_boundary_cos(alpha):
    """2 sqrt(-alpha) / (1 - alpha) in (0, 1]: |cos theta| at which the complex-KDA discriminant vanishes."""
    a = _open_interval("alpha", alpha, -1.0, 0.0)
    return _out(2.0 * np.sqrt(-a) / (1.0 - a))


def complex_kda_is_complex(alpha, theta):
    """Table 8's condition for a complex pair: |cos theta| < 2 sqrt(-alpha) / (1 - alpha)."""
    return bool(abs(np.cos(float(_finite("theta", theta)))) < complex_kda_boundary_cos(alpha))


def momentum_deltanet_is_complex(alpha, beta, eta, mu):
    """Table 8's condition for a complex pair: tau^2 < 4 alpha mu, tau = alpha (1 - beta eta) + mu."""
    a, b, e, m = _momentum_args(alpha, beta, eta, mu)
    tau = a * (1.0 - b * e) + m
    return bool(tau * tau < 4.0 * a * m)


def pair_damping_ratio(rate_i, rate_j):
    """zeta = (b_i + b_j) / (2 sqrt(b_i b_j)) of u'' + (b_i + b_j) u' + b_i b_j u = 0 (Table 8).

    >= 1 (1 only for equal rates); inf when one rate is 0 (no restoring term, omega0 = 0); NaN when
    both are 0 (no damping at all).
    """
    bi, bj = _non_negative("rate_i", rate_i), _non_negative("rate_j", rate_j)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _out((bi + bj) / (2.0 * np.sqrt(bi * bj)))


def _rates_zeta(mu_i, mu_j):
    """pair_damping_ratio of two real eigenvalues' rates; NaN unless both are in (0, 1]."""
    if not (0.0 < mu_i <= 1.0 and 0.0 < mu_j <= 1.0):
        return np.nan
    return pair_damping_ratio(max(-np.log(mu_i), 0.0), max(-np.log(mu_j), 0.0))


def block_damping_ratio(trace, det):
    """zeta of a real 2x2 block from its trace and determinant (det > 0).

    Complex pair (trace^2 < 4 det): rho = sqrt(det), phi = atan2(sqrt(4 det - trace^2), trace),
    zeta = -log rho / sqrt(log^2 rho + phi^2) (underdamped, < 1). Real pair: the rates' zeta >= 1
    of `pair_damping_ratio`, NaN if an eigenvalue is outside (0, 1].
    """
    tr, dt_ = float(_finite("trace", trace)), float(_positive("det", det))
    disc = tr * tr - 4.0 * dt_
    if disc < 0.0:
        log_rho = 0.5 * np.log(dt_)
        phi = np.arctan2(np.sqrt(-disc), tr)
        return float(-log_rho / np.hypot(log_rho, phi))
    root = np.sqrt(disc)
    big = (tr + np.copysign(root, tr)) / 2.0  # larger-magnitude root without cancellation
    return _rates_zeta(big, dt_ / big) if big != 0.0 else np.nan


def gated_deltanet_damping_ratio(beta, alpha):
    """zeta = (2 gamma + b) / (2 sqrt(gamma (gamma + b))) > 1, gamma = -log alpha, b = -log(1 - beta) (Table 8).

    The (k^perp, k) plane as u'' + (2 gamma + b) u' + gamma (gamma + b) u = 0; dt cancels.
    """
    b = -np.log1p(-float(_open_interval("beta", beta, 0.0, 1.0)))
    gamma = -np.log(float(_open_interval("alpha", alpha, 0.0, 1.0)))
    return float((2.0 * gamma + b) / (2.0 * np.sqrt(gamma * (gamma + b))))


def _kda_pair_ratios(k, beta, alpha):
    """Table 8's zeta for every pair of KDA rates, from the symmetric form's eigenvalues (eigvalsh)."""
    mus = np.linalg.eigvalsh(kda_symmetrized(k, beta, alpha))
    return _all_pair_ratios(mus)


def _all_pair_ratios(mus):
    mus = np.sort(np.real(mus))
    return np.array([_rates_zeta(mus[i], mus[j]) for i, j in itertools.combinations(range(mus.size), 2)])


def _unit_key(rng, d):
    k = rng.standard_normal(d)
    return k / np.linalg.norm(k)


def _uniform_open(rng, low, high, size=None):
    """Uniform on the open interval (low, high): the (probability 2^-53) endpoint draw is moved to the middle."""
    x = rng.uniform(low, high, size)
    return np.where(x == low, (low + high) / 2.0, x)


@dataclasses.dataclass(frozen=True)
class _Model:
    """One Table-8 family: T from parameters, the stated complex condition, the table's zeta(s), a sampler."""

    transition: Callable[..., np.ndarray]
    is_complex: Callable[..., bool]
    table_zeta: Callable[..., np.ndarray]
    draw: Callable[[np.random.Generator, int], dict]


def _never(**_):
    return False


def _block_zeta(block):
    """Table-8 zeta of a 2x2 family, from its block's trace and determinant."""
    def zeta(**params):
        t = block(**params)
        return np.array([block_damping_ratio(np.trace(t), np.linalg.det(t))])
    return zeta


MODELS = {
    "linear_attention": _Model(
        linear_attention_transition, _never, lambda d: np.array([np.nan]),
        lambda rng, d: {"d": d}),
    "deltanet": _Model(
        deltanet_transition, _never, lambda k, beta: np.array([np.inf]),
        lambda rng, d: {"k": _unit_key(rng, d), "beta": float(_uniform_open(rng, 0.0, 1.0))}),
    "gated_deltanet": _Model(
        gated_deltanet_transition, _never, lambda k, beta, alpha: np.array([gated_deltanet_damping_ratio(beta, alpha)]),
        lambda rng, d: {"k": _unit_key(rng, d), "beta": float(_uniform_open(rng, 0.0, 1.0)),
                        "alpha": float(_uniform_open(rng, 0.0, 1.0))}),
    "kda": _Model(
        kda_transition, _never, _kda_pair_ratios,
        lambda rng, d: {"k": _unit_key(rng, d), "beta": float(_uniform_open(rng, 0.0, 1.0)),
                        "alpha": _uniform_open(rng, 0.0, 1.0, d)}),
    "complex_kda": _Model(
        complex_kda_block, complex_kda_is_complex, _block_zeta(complex_kda_block),
        lambda rng, d: {"alpha": float(_uniform_open(rng, -1.0, 0.0)), "theta": float(rng.uniform(-np.pi, np.pi))}),
    "momentum_deltanet": _Model(
        momentum_deltanet_block, momentum_deltanet_is_complex, _block_zeta(momentum_deltanet_block),
        lambda rng, d: {name: float(_uniform_open(rng, 0.0, 1.0)) for name in ("alpha", "beta", "eta", "mu")}),
}
"""Table 8's families by name. Draws: unit key k ~ normalised Gaussian; beta, alpha, alpha_i, mu, eta
uniform on (0, 1); complex KDA alpha on (-1, 0), theta on (-pi, pi)."""


def _model(model):
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(map(repr, MODELS))}, got {model!r}")
    return MODELS[model]


def frozen_transition(model, params):
    """The frozen T (d x d, or the 2x2 block for complex KDA / momentum) of `model` at `params` (Table 8)."""
    return _model(model).transition(**params)


def spectrum(model, params):
    """Eigenvalues of `frozen_transition(model, params)` (numpy's general eigensolver)."""
    return np.linalg.eigvals(frozen_transition(model, params))


def eigen_type(eigenvalues, tol=1e-12):
    """'complex' if some eigenvalue has |Im| > tol * max(1, max |lambda|), else 'real'."""
    lam = np.asarray(eigenvalues)
    scale = max(1.0, float(np.max(np.abs(lam)))) if lam.size else 1.0
    return "complex" if np.any(np.abs(lam.imag) > tol * scale) else "real"


def stated_complex(model, params):
    """Table 8's "complex eigenvalues iff" column evaluated at `params` (never for the four real families)."""
    return _model(model).is_complex(**params)


def table_damping_ratios(model, params):
    """Damping ratios by Table 8's formulas, as an array.

    linear attention: [NaN] (no damping, pure accumulation); DeltaNet: [inf] (no restoring term);
    Gated DeltaNet: [(2 gamma + b) / (2 sqrt(gamma (gamma + b)))]; KDA: one (b_i + b_j)/(2 sqrt(b_i b_j))
    per pair of rates of D^{1/2} H D^{1/2}; complex KDA, momentum: [zeta of the 2x2 block from trace
    and determinant] (< 1 when complex; >= 1 or NaN as `block_damping_ratio` when real).
    """
    return _model(model).table_zeta(**params)


def spectral_damping_ratios(model, eigenvalues, tol=1e-12):
    """Damping ratios read from the eigenvalues alone, to hold against `table_damping_ratios`.

    A complex pair rho e^{+-i phi}: -log rho / sqrt(log^2 rho + phi^2). Real eigenvalues: rates
    b = -log mu (|b| <= tol counts as 0) and pair_damping_ratio of every pair for KDA, of the
    (slowest, fastest) pair otherwise (the key mode against the k^perp modes).
    """
    _model(model)
    lam = np.asarray(eigenvalues, dtype=np.complex128)
    if eigen_type(lam, tol) == "complex":
        upper = lam[lam.imag > 0]
        log_rho = np.log(np.abs(upper))
        return -log_rho / np.hypot(log_rho, np.angle(upper))
    mus = np.sort(lam.real)
    mus = np.where(np.abs(np.log(np.abs(mus))) <= tol, 1.0, mus)  # snap rate-0 modes to exactly 1
    if model == "kda":
        return _all_pair_ratios(mus)
    return np.array([_rates_zeta(mus[0], mus[-1])])


def random_draws(model, n, rng, d=4):
    """n parameter dicts of `model` drawn in Table 8's ranges (see MODELS), key dimension d."""
    spec = _model(model)
    count = int(_check("n", n, lambda x: (x >= 0) & (x == np.round(x)), "an integer >= 0"))
    dim = int(_check("d", d, lambda x: (x >= 2) & (x == np.round(x)), "an integer >= 2"))
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return [spec.draw(rng, dim) for _ in range(count)]
