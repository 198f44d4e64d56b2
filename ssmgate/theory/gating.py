"""Closed forms, flows and Bayes limits of the gating paper's toy-model theory, in float64 numpy/scipy.

This module holds every formula of protocol §2.3 (short context: exactly orthonormal keys, label noise
eps, the noise-averaged gradient flow of the margins u, v and the retention alpha, Prop. 1, Lemma 2,
the plateau flow, the reduced dynamics of Prop. 4 and the 3-D escape time; P1 §2 and App. B.1-B.4)
and protocol §2.4 (long context: retentions alpha_j = exp(-j / tau), S2 of Lemma 7, the label-coordinate
Bayes error of Lemma 6, the no-decay limit of Prop. 8 and the exact finite-ell locality contour of
Prop. 9; App. B.5-B.6). Everything is a pure function of its arguments; no JAX, no state, no I/O.
Conventions as protocol §0: natural logs, sigma = logistic sigmoid (evaluated with
`scipy.special.expit`), Phi = standard normal CDF, eps in (0, 1/2), kappa = log((1 - eps) / eps).
Bad arguments raise ValueError naming the argument, the allowed range and the value given.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import integrate, optimize, special

from ssmgate.theory._args import _array, _check, _out

__all__ = [
    # short context (protocol §2.3)
    "kappa", "initial_rate_ratio", "initial_rates", "alpha_star", "equal_rate_alpha", "plateau_u",
    "phi", "psi", "flow_rhs", "flow_solution", "flow_margins", "flow_crossing_alpha0",
    "flow_escape_time", "reduced_escape_v", "reduced_escape_time", "theta_law",
    "lambda0_from_alpha0", "alpha_from_lambda",
    # long context (protocol §2.4)
    "retention", "s2", "bayes_error", "bayes_accuracy", "no_decay_accuracy", "delta_max",
    "tau_log_d_over_tau",
]

# Solver settings of protocol §2.7 for the 3-D flow (state (u, v, log alpha), see `_rhs_log`).
_RTOL = 1e-8
_ATOL = 1e-12
_T_IGNORE = 1e-3  # both margins start at 0: escape is looked for only after this flow time


# --------------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------------

def _is_int(arr):
    return np.isfinite(arr) & (arr == np.round(arr))


def _eps(eps):
    return _check("eps", eps, lambda e: (e > 0) & (e < 0.5), "in (0, 0.5)")


def _P(P):
    return _check("P", P, lambda p: (p >= 1) & np.isfinite(p), ">= 1 (and finite)")


def _alpha(alpha, name="alpha"):
    return _check(name, alpha, lambda a: (a > 0) & (a < 1), "in (0, 1)")


def _tau(tau):
    return _check("tau", tau, lambda t: (t > 0) & np.isfinite(t), "> 0 (and finite; use e.g. 1e6 for no decay)")


def _d(d):
    return _check("d", d, lambda x: _is_int(x) & (x >= 1), "an integer >= 1")


def _ell(ell, minimum=1):
    return _check("ell", ell, lambda x: _is_int(x) & (x >= minimum), f"an integer >= {minimum}")


def _Delta(Delta, ell):
    ell_arr = np.asarray(ell, dtype=np.float64)
    upper = f"ell = {int(ell_arr)}" if ell_arr.ndim == 0 else "ell"
    return _check("Delta", Delta, lambda D: _is_int(D) & (D >= 1) & (D <= ell_arr),
                  f"an integer in [1, {upper}]")


# --------------------------------------------------------------------------------------------------
# Short context (protocol §2.3; P1 §2.1, App. B.1-B.4)
# --------------------------------------------------------------------------------------------------

def kappa(eps):
    """kappa = log((1 - eps) / eps) = sigma^{-1}(1 - eps), the plateau margin (Lemma 2 (B.2)).

    eps = 0.1 gives log 9 = 2.1972. Vectorised over eps in (0, 1/2).
    """
    e = _eps(eps)
    return _out(np.log1p(-e) - np.log(e))


def initial_rate_ratio(alpha, P, eps):
    """delta_r'(0) / delta_m'(0) = P alpha^2 / ((1 - 2 eps)(1 + alpha)^2) (Prop. 1 (B.1)).

    Vectorised over alpha (and broadcastable P, eps). Equals 1 at `equal_rate_alpha(P, eps)`.
    """
    a, p, e = _alpha(alpha), _P(P), _eps(eps)
    return _out(p * a * a / ((1.0 - 2.0 * e) * (1.0 + a) ** 2))


def initial_rates(alpha, P, eps):
    """Flow rates at t = 0 from u = v = 0 (Prop. 1 (B.1)).

    Returns a dict with u_dot = (1 + alpha)(1 - 2 eps) / (2P), v_dot = alpha / 2, alpha_dot = 0,
    delta_m_dot = (1 + alpha)^2 (1 - 2 eps) / (2P) and delta_r_dot = alpha^2 / 2
    (delta_m = (1 + alpha) u, delta_r = alpha v). Vectorised over alpha.
    """
    a, p, e = _alpha(alpha), _P(P), _eps(eps)
    u_dot = (1.0 + a) * (1.0 - 2.0 * e) / (2.0 * p)
    return {
        "u_dot": _out(u_dot),
        "v_dot": _out(a / 2.0),
        "alpha_dot": _out(np.zeros_like(a * p * e)),
        "delta_m_dot": _out((1.0 + a) * u_dot),
        "delta_r_dot": _out(a * a / 2.0),
    }


def alpha_star(P, eps):
    """Critical scale alpha* = sqrt((1 - 2 eps) / P) (Prop. 1, small-alpha / large-P approximation).

    P = 32, eps = 0.1 gives 0.158. The exact equal-rate point is `equal_rate_alpha`.
    """
    p, e = _P(P), _eps(eps)
    return _out(np.sqrt((1.0 - 2.0 * e) / p))


def equal_rate_alpha(P, eps):
    """Exact equal-initial-rate point alpha = s / (1 - s), s = sqrt((1 - 2 eps) / P) (Prop. 1 (B.1)).

    Solves initial_rate_ratio(alpha) = 1; P = 32, eps = 0.1 gives 0.1878. Requires s < 1 (always
    true for P >= 1 and eps > 0; checked anyway).
    """
    p, e = _P(P), _eps(eps)
    s = np.sqrt((1.0 - 2.0 * e) / p)
    if np.any(s >= 1.0):
        raise ValueError(f"P must exceed 1 - 2*eps so that s = sqrt((1 - 2 eps)/P) < 1, got s = {np.max(s)!r}")
    return _out(s / (1.0 - s))


def plateau_u(alpha, eps):
    """Plateau memorisation margin u* = kappa / (1 + alpha), the unique minimiser at v = 0 (Lemma 2 (B.2)).

    At u*, delta_m = (1 + alpha) u* = kappa. Vectorised over alpha.
    """
    a, e = _alpha(alpha), _eps(eps)
    return _out((np.log1p(-e) - np.log(e)) / (1.0 + a))


def phi(delta, eps):
    """phi(delta) = (1 - eps) sigma(-(kappa + delta)) + eps sigma(kappa - delta) (plateau flow, B.2).

    phi(0) = 2 eps (1 - eps). Vectorised over delta.
    """
    dl = _check("delta", delta, np.isfinite, "finite")
    e = _eps(eps)
    k = np.log1p(-e) - np.log(e)
    return _out((1.0 - e) * special.expit(-(k + dl)) + e * special.expit(k - dl))


def psi(delta, eps):
    """psi(delta) = (1 - eps) sigma(-(kappa + delta)) - eps sigma(kappa - delta) (plateau flow, B.2).

    psi(0) = 0 and |psi(delta)| <= C |delta| on [0, kappa] (Lemma 3). Vectorised over delta.
    """
    dl = _check("delta", delta, np.isfinite, "finite")
    e = _eps(eps)
    k = np.log1p(-e) - np.log(e)
    return _out((1.0 - e) * special.expit(-(k + dl)) - e * special.expit(k - dl))


def _flow_terms(u, v, a, P, eps):
    """(u_dot, v_dot, bracket of alpha_dot without the (alpha log alpha)^2 factor)."""
    dm, dr = (1.0 + a) * u, a * v
    A = (1.0 - eps) * special.expit(-(dm + dr))  # scipy's expit: no overflow for any margin
    B = eps * special.expit(dm - dr)
    return (1.0 + a) * (A - B) / P, a * (A + B), (u + v) * A + (v - u) * B


def flow_rhs(t, y, P, eps):
    """Right-hand side of the noise-averaged 3-D gradient flow, y = (u, v, alpha) (protocol §2.3, B.1):

        u'     = (1/P)(1 + alpha)[(1 - eps) sigma(-(dm + dr)) - eps sigma(dm - dr)]
        v'     = alpha [(1 - eps) sigma(-(dm + dr)) + eps sigma(dm - dr)]
        alpha' = (alpha log alpha)^2 [(1 - eps)(u + v) sigma(-(dm + dr)) + eps (v - u) sigma(dm - dr)]

    with dm = (1 + alpha) u, dr = alpha v. `t` is unused (autonomous; solve_ivp signature).
    Returns a float64 array of shape (3,).
    """
    p, e = float(_P(P)), float(_eps(eps))
    y = _array("y", y)
    if y.shape != (3,):
        raise ValueError(f"y must have shape (3,) = (u, v, alpha), got shape {y.shape}")
    u, v = y[0], y[1]
    a = float(_check("y[2] (alpha)", y[2], lambda x: (x > 0) & (x <= 1), "in (0, 1]"))
    du, dv, br = _flow_terms(u, v, a, p, e)
    return np.array([du, dv, (a * math.log(a)) ** 2 * br])


def _rhs_log(t, y, P, eps):
    """The flow in (u, v, l = log alpha): l' = alpha l^2 [bracket]. Keeps full relative accuracy in
    alpha when alpha0 is tiny (alpha0 = 1e-5 sits far below any useful absolute tolerance)."""
    u, v, l = y
    a = math.exp(l)
    du, dv, br = _flow_terms(u, v, a, P, eps)
    return [du, dv, a * l * l * br]


def _escape_event(t, y, P, eps):
    a = math.exp(y[2])
    return a * y[1] - (1.0 + a) * y[0]


_escape_event.terminal = True
_escape_event.direction = 1.0


def _integrate(alpha0, P, eps, t0, t1, y0, **kw):
    sol = integrate.solve_ivp(_rhs_log, (t0, t1), y0, method="LSODA", rtol=_RTOL, atol=_ATOL,
                              args=(P, eps), **kw)
    if sol.status == -1:
        raise RuntimeError(f"flow integration failed for alpha0={alpha0!r}, P={P!r}, eps={eps!r}: {sol.message}")
    return sol


def flow_solution(alpha0, P, eps, t_end):
    """(u, v, alpha) at flow time t_end of `flow_rhs` from u = v = 0, alpha = alpha0 (protocol §2.3, §2.7).

    LSODA, rtol 1e-8, atol 1e-12, integrated in (u, v, log alpha). Flow time t ~ lr x SGD steps.
    """
    a0, p, e = float(_alpha(alpha0, "alpha0")), float(_P(P)), float(_eps(eps))
    t1 = float(_check("t_end", t_end, lambda t: (t >= 0) & np.isfinite(t), ">= 0 (and finite)"))
    if t1 == 0.0:
        return 0.0, 0.0, a0
    u, v, l = _integrate(a0, p, e, 0.0, t1, [0.0, 0.0, math.log(a0)]).y[:, -1]
    return float(u), float(v), math.exp(l)


def flow_margins(alpha0, P, eps, t):
    """(delta_m, delta_r) = ((1 + alpha) u, alpha v) at flow time t of the 3-D flow (protocol §2.3)."""
    u, v, a = flow_solution(alpha0, P, eps, t)
    return (1.0 + a) * u, a * v


def flow_crossing_alpha0(P, eps, t, bracket=(1e-3, 0.9)):
    """The alpha0 at which delta_r(t) = delta_m(t) in the 3-D flow (brentq over alpha0; protocol §2.6, §10.7).

    P = 32, eps = 0.1, t = 2.5 (25 SGD steps at lr 0.1) gives 0.177, between alpha* = 0.158 and the
    initial-rate point 0.1878. Raises ValueError if delta_r - delta_m has the same sign at both ends
    of `bracket`.
    """
    p, e = float(_P(P)), float(_eps(eps))
    tt = float(_check("t", t, lambda x: (x > 0) & np.isfinite(x), "> 0 (and finite)"))
    if len(bracket) != 2:
        raise ValueError(f"bracket must be a pair (lo, hi), got {bracket!r}")
    lo, hi = (float(_alpha(b, "bracket")) for b in bracket)
    if not lo < hi:
        raise ValueError(f"bracket must satisfy lo < hi, got {bracket!r}")

    def gap(a0):
        dm, dr = flow_margins(a0, p, e, tt)
        return dr - dm

    g_lo, g_hi = gap(lo), gap(hi)
    if g_lo * g_hi > 0:
        raise ValueError(f"bracket {bracket!r} does not contain a crossing: delta_r - delta_m = "
                         f"{g_lo:.3g} at {lo!r} and {g_hi:.3g} at {hi!r} (t = {tt!r})")
    return float(optimize.brentq(gap, lo, hi, xtol=1e-10, rtol=1e-10))


def flow_escape_time(alpha0, P, eps, t_max=1e7):
    """First flow time t > 1e-3 at which delta_r - delta_m crosses 0 upward in the 3-D flow (Fig. 1b, protocol §2.3).

    Both margins are 0 at t = 0; the first 1e-3 of flow time is skipped (protocol §2.7). Returns 0.0 if
    delta_r > delta_m already at t = 1e-3 (alpha0 above the equal-rate point 0.1878 for P = 32,
    eps = 0.1) and math.inf if there is no crossing before t_max. LSODA (rtol 1e-8) in
    (u, v, log alpha) with a terminal solve_ivp event (direction +1). The gap delta_r - delta_m
    crosses once (from below) and stays positive afterwards, so a sign check at the solver's steps
    cannot miss it; the protocol values (P = 32, eps = 0.1: alpha0 = 1e-1 -> 10.6, ..., 1e-5 -> 5.91e4)
    are reproduced to < 0.1%.
    """
    a0, p, e = float(_alpha(alpha0, "alpha0")), float(_P(P)), float(_eps(eps))
    tm = float(_check("t_max", t_max, lambda t: (t > _T_IGNORE) & np.isfinite(t), f"> {_T_IGNORE} (and finite)"))
    y1 = _integrate(a0, p, e, 0.0, _T_IGNORE, [0.0, 0.0, math.log(a0)]).y[:, -1]
    if _escape_event(_T_IGNORE, y1, p, e) > 0:
        return 0.0
    sol = _integrate(a0, p, e, _T_IGNORE, tm, y1, events=_escape_event)
    if sol.t_events[0].size == 0:
        return math.inf
    return float(sol.t_events[0][0])


def _reduced_alpha(v, b0):
    """alpha(v) = exp(-1 / (1/b0 + v^2/2)) along the reduced dynamics (proof of Prop. 4)."""
    return math.exp(-1.0 / (1.0 / b0 + 0.5 * v * v))


def _reduced_vT(b0, k):
    f = lambda v: _reduced_alpha(v, b0) * v - k  # increasing in v, -k at v = 0
    hi = 1.0
    while f(hi) <= 0.0:
        hi *= 2.0
    return optimize.brentq(f, 0.0, hi, xtol=1e-14, rtol=4 * np.finfo(float).eps)


def reduced_escape_v(alpha0, eps):
    """v_T of the reduced dynamics: the first v with alpha(v) v = kappa, alpha(v) = exp(-1/(1/b0 + v^2/2)),
    b0 = log(1/alpha0) (proof of Prop. 4 (B.4)). eps = 0.1: 2.77 (alpha0 = 0.1) ... 2.81 (1e-5).
    """
    a0, e = float(_alpha(alpha0, "alpha0")), float(_eps(eps))
    return _reduced_vT(-math.log(a0), math.log1p(-e) - math.log(e))


def reduced_escape_time(alpha0, eps):
    """Escape time T of the reduced dynamics v' = alpha phi(alpha v), alpha' = (alpha log alpha)^2 v phi(alpha v)
    from v = 0, alpha = alpha0 (Prop. 4 (B.4)), by quadrature in the v-clock:

        T = int_0^{v_T} dv / (alpha(v) phi(alpha(v) v)),  alpha(v) = exp(-1/(1/b0 + v^2/2)),  b0 = log(1/alpha0),

    v_T = `reduced_escape_v`. T = Theta(1/(alpha0 log(1/alpha0))); eps = 0.1: alpha0 = 1e-2 -> 219.7,
    1e-5 -> 6.54e4.
    """
    a0, e = float(_alpha(alpha0, "alpha0")), float(_eps(eps))
    b0 = -math.log(a0)
    k = math.log1p(-e) - math.log(e)
    vT = _reduced_vT(b0, k)

    def integrand(v):
        a = _reduced_alpha(v, b0)
        dl = a * v
        return 1.0 / (a * ((1.0 - e) * special.expit(-(k + dl)) + e * special.expit(k - dl)))

    # The integrand falls from 1/(alpha0 phi(0)) over a width ~ sqrt(2/b0): give quad that break point.
    width = math.sqrt(2.0 / b0)
    points = [width] if width < vT else None
    T, _ = integrate.quad(integrand, 0.0, vT, points=points, limit=200, epsabs=0.0, epsrel=1e-10)
    return float(T)


def theta_law(alpha0):
    """Shape of Prop. 4's law T = Theta(1/(alpha0 log(1/alpha0))), without the constant. Vectorised."""
    a0 = _alpha(alpha0, "alpha0")
    return _out(1.0 / (a0 * -np.log(a0)))


def lambda0_from_alpha0(alpha0, Delta):
    """lambda0 = log(log(1/alpha0) / Delta): the log-rate whose retention at distance Delta is alpha0 (protocol §2.2)."""
    a0 = _alpha(alpha0, "alpha0")
    D = _check("Delta", Delta, lambda x: (x > 0) & np.isfinite(x), "> 0 (and finite)")
    return _out(np.log(-np.log(a0) / D))


def alpha_from_lambda(lam, Delta):
    """alpha_Delta = exp(-Delta e^lambda), the retention at distance Delta for log-rate lambda (protocol §2.2)."""
    lm = _check("lam", lam, np.isfinite, "finite")
    D = _check("Delta", Delta, lambda x: (x > 0) & np.isfinite(x), "> 0 (and finite)")
    return _out(np.exp(-D * np.exp(lm)))


# --------------------------------------------------------------------------------------------------
# Long context (protocol §2.4; P1 §2.2, App. B.5-B.6)
# --------------------------------------------------------------------------------------------------

def retention(j, tau):
    """alpha_j = exp(-j / tau), retention at distance j for tau = e^{-lambda} (protocol §2.4). Vectorised."""
    jj = _check("j", j, lambda x: (x >= 0) & np.isfinite(x), ">= 0 (and finite)")
    return _out(np.exp(-jj / _tau(tau)))


def _s2(n, tau):
    """S2 = sum_{j=1..n} e^{-2j/tau} = e^{-2/tau}(1 - e^{-2n/tau}) / (1 - e^{-2/tau}); 0 for n = 0.

    Written with expm1 so that no factor cancels: for tau >> n it is n - O(n^2/tau) to full precision,
    for tiny tau it underflows gracefully to 0 (never inf/inf)."""
    return np.exp(-2.0 / tau) * -np.expm1(-2.0 * n / tau) / -np.expm1(-2.0 / tau)


def s2(ell, tau):
    """S2(ell, tau) = sum_{j=1..ell} alpha_j^2 = e^{-2/tau}(1 - e^{-2 ell/tau}) / (1 - e^{-2/tau}) (Lemma 7).

    Evaluated with expm1 (no cancellation for large tau: tau = 1e6 gives ell - O(ell^2/tau) exactly).
    Vectorised over ell and tau.
    """
    return _out(_s2(_ell(ell), _tau(tau)))


def _noise_to_signal(tau, Delta, ell):
    """(S2 - alpha_Delta^2) / alpha_Delta^2 = sum_{k=1..Delta-1} e^{2k/tau} + S2(ell - Delta).

    Both terms are non-negative sums, so nothing cancels; the first overflows to inf for tiny tau and
    large Delta, which correctly gives SNR 0 (accuracy 1/2). 0 only for ell = Delta = 1."""
    with np.errstate(over="ignore"):
        before = np.expm1(2.0 * (Delta - 1.0) / tau) / -np.expm1(-2.0 / tau)
    return before + _s2(ell - Delta, tau)


def _snr(tau, Delta, d, ell):
    """SNR at ||x_q|| = 1: alpha_Delta sqrt(d / (S2 - alpha_Delta^2)) (Lemma 6)."""
    with np.errstate(divide="ignore"):
        return np.sqrt(d / _noise_to_signal(tau, Delta, ell))


def _long_args(tau, Delta, d, ell):
    ell_a = _ell(ell)
    return _tau(tau), _Delta(Delta, ell_a), _d(d), ell_a


def _xq_norm(xq_norm):
    return _check("xq_norm", xq_norm, lambda x: (x > 0) & np.isfinite(x), "> 0 (and finite)")


def bayes_error(tau, Delta, d, ell, xq_norm=1.0):
    """Label-coordinate Bayes error p = Phi(-alpha_Delta ||x_q|| sqrt(d / (S2 - alpha_Delta^2))) (Lemma 6).

    Error of sign(g) for g = alpha_Delta ||x_q||^2 y_q + sum_{t != t*} alpha_{ell-t+1} (x_q.x_t) y_t
    (w_x = 0, v = 1); S2 - alpha_Delta^2 = sum_{j != Delta} alpha_j^2 is summed without cancellation.
    Broadcasts over tau, Delta, d, ell and xq_norm.
    """
    t, D, dd, l = _long_args(tau, Delta, d, ell)
    return _out(special.ndtr(-_xq_norm(xq_norm) * _snr(t, D, dd, l)))


def bayes_accuracy(tau, Delta, d, ell, average=False, xq_norm=1.0):
    """1 - `bayes_error` (Lemma 6). With average=True, the expectation over ||x_q|| with d ||x_q||^2 ~ chi^2_d:

        E[Phi(s ||x_q||)] = P(Z <= s ||x_q||) = P(Z / ||x_q|| <= s) = F_{t_d}(s),  s = alpha_Delta sqrt(d / (S2 - alpha_Delta^2)),

    i.e. exactly the Student-t CDF with d degrees of freedom (no quadrature needed; the tests check
    it against quadrature). At d = 128 it differs from the ||x_q|| = 1 value by at most 0.0013.
    xq_norm must stay 1.0 when average=True. Broadcasts over tau, Delta, d, ell.
    """
    t, D, dd, l = _long_args(tau, Delta, d, ell)
    s = _snr(t, D, dd, l)
    if average:
        if np.any(_array("xq_norm", xq_norm) != 1.0):
            raise ValueError(f"xq_norm must be 1.0 (the default) when average=True, got {xq_norm!r}")
        return _out(special.stdtr(dd, s))
    return _out(special.ndtr(_xq_norm(xq_norm) * s))


def no_decay_accuracy(d, ell, average=False):
    """No-decay limit (tau -> inf) of the Bayes accuracy: Phi(||x_q|| sqrt(d / (ell - 1))) (Prop. 8, appendix form; protocol §10.1).

    ||x_q|| = 1, or with average=True the chi^2_d average (Student-t CDF, see `bayes_accuracy`).
    d = 128, ell = 1024: 0.6382 and 0.6379. Requires ell >= 2.
    """
    dd, l = _d(d), _ell(ell, minimum=2)
    s = np.sqrt(dd / (l - 1.0))
    return _out(special.stdtr(dd, s) if average else special.ndtr(s))


def delta_max(tau, d, ell, accuracy, average=False):
    """Exact finite-ell locality contour (Prop. 9, protocol §2.4): the largest integer Delta in [1, ell] with
    bayes_accuracy(tau, Delta, d, ell, average) >= accuracy, or 0 if no Delta qualifies.

    For finite tau the Bayes accuracy is strictly decreasing in Delta (alpha_Delta^2 falls while
    S2 - alpha_Delta^2 grows), so the qualifying Delta form the prefix {1, ..., Delta_max}; for
    tau -> inf it is flat. Vectorised over tau (returns int or an int array of tau's shape).
    d = 128, ell = 512, acc >= 0.8: tau = 1, 2, 4, ..., 512 -> 3, 5, 9, 15, 25, 39, 56, 67, 47, 0.
    """
    t, dd, l = _tau(tau), _d(d), _ell(ell)
    if dd.ndim or l.ndim:
        raise ValueError(f"d and ell must be scalars for delta_max, got shapes {dd.shape} and {l.shape}")
    acc = float(_check("accuracy", accuracy, lambda a: (a > 0) & (a < 1), "in (0, 1)"))
    deltas = np.arange(1, int(l) + 1, dtype=np.float64)
    s = _snr(t[..., None], deltas, dd, l)
    a = special.stdtr(dd, s) if average else special.ndtr(s)
    ok = a >= acc
    last = np.where(ok.any(axis=-1), l - np.argmax(ok[..., ::-1], axis=-1), 0).astype(int)
    return int(last) if last.ndim == 0 else last


def tau_log_d_over_tau(tau, d):
    """tau log(d / tau), the shape of the Prop. 9 contour Delta_max = Theta(tau log(d / tau)) (tau = o(d)). Vectorised.

    d = 128: tau = 1, 2, 4, 8, 16, 32, 64 -> 4.9, 8.3, 13.9, 22.2, 33.3, 44.4, 44.4.
    """
    t = _tau(tau)
    dd = _check("d", d, lambda x: (x >= 1) & np.isfinite(x), ">= 1 (and finite)")
    return _out(t * np.log(dd / t))
