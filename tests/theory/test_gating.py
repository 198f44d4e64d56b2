"""protocol §2.3-2.4 formulas of ssmgate.theory.gating against the the protocol's reference values and §9 checks C7-C9."""
import math

import numpy as np
import pytest
from scipy import integrate, optimize, special, stats

from ssmgate.theory import gating as g

P, EPS = 32, 0.1
KAPPA = math.log(9.0)
ALPHA0S = [1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 1e-5]


# ------------------------------------------------------------------------------------------------
# Short context: Prop. 1, Lemma 2, plateau flow
# ------------------------------------------------------------------------------------------------

def test_kappa():
    assert g.kappa(EPS) == pytest.approx(KAPPA, rel=1e-15)
    assert g.kappa(0.25) == pytest.approx(math.log(3.0), rel=1e-15)


def test_critical_scales():
    assert g.alpha_star(P, EPS) == pytest.approx(0.158, abs=1e-3)
    a_eq = g.equal_rate_alpha(P, EPS)
    assert a_eq == pytest.approx(0.1878, abs=1e-4)
    assert g.initial_rate_ratio(a_eq, P, EPS) == pytest.approx(1.0, rel=1e-12)
    # alpha* is only the small-alpha approximation of the equal-rate point: there the ratio is < 1.
    assert g.initial_rate_ratio(g.alpha_star(P, EPS), P, EPS) < 0.8


def test_initial_rate_ratio_matches_initial_rates():
    alpha = np.array([0.01, 0.05, 0.1, 0.1878, 0.2, 0.4, 0.9])
    rates = g.initial_rates(alpha, P, EPS)
    ratio = g.initial_rate_ratio(alpha, P, EPS)
    assert isinstance(ratio, np.ndarray) and ratio.shape == alpha.shape
    np.testing.assert_allclose(rates["delta_r_dot"] / rates["delta_m_dot"], ratio, rtol=1e-13)
    np.testing.assert_allclose(rates["delta_m_dot"], (1 + alpha) * rates["u_dot"], rtol=1e-15)
    np.testing.assert_allclose(rates["delta_r_dot"], alpha * rates["v_dot"], rtol=1e-15)
    # Above the equal-rate point retrieval grows faster, below memorisation does.
    assert np.all((ratio > 1) == (alpha > g.equal_rate_alpha(P, EPS)))


@pytest.mark.parametrize("alpha", [0.02, 0.15, 0.3])
def test_flow_rhs_at_zero_reproduces_initial_rates(alpha):
    rates = g.initial_rates(alpha, P, EPS)
    rhs = g.flow_rhs(0.0, [0.0, 0.0, alpha], P, EPS)
    np.testing.assert_allclose(rhs, [rates["u_dot"], rates["v_dot"], 0.0], rtol=1e-14, atol=1e-300)
    # Finite differences of the integrated margins: delta(h) / h -> delta'(0).
    h = 1e-4
    dm, dr = g.flow_margins(alpha, P, EPS, h)
    assert dm / h == pytest.approx(rates["delta_m_dot"], rel=1e-3)
    assert dr / h == pytest.approx(rates["delta_r_dot"], rel=1e-3)
    # ... and the chain rule on flow_rhs itself (central difference along the flow direction).
    y0 = np.array([0.0, 0.0, alpha])
    f = g.flow_rhs(0.0, y0, P, EPS)
    margins = lambda y: np.array([(1 + y[2]) * y[0], y[2] * y[1]])
    fd = (margins(y0 + 1e-7 * f) - margins(y0 - 1e-7 * f)) / 2e-7
    np.testing.assert_allclose(fd, [rates["delta_m_dot"], rates["delta_r_dot"]], rtol=1e-6)


def _avg_loss(dm, eps=EPS):
    """The eps-averaged v = 0 loss (1 - eps) softplus(-delta_m) + eps softplus(delta_m)."""
    return (1 - eps) * np.logaddexp(0.0, -dm) + eps * np.logaddexp(0.0, dm)


@pytest.mark.parametrize("eps", [0.05, 0.1, 0.3])
def test_lemma2_plateau_minimises_v0_loss(eps):
    k = g.kappa(eps)
    h = 1e-5
    deriv = lambda x: (_avg_loss(x + h, eps) - _avg_loss(x - h, eps)) / (2 * h)
    assert abs(deriv(k)) < 1e-9
    assert deriv(k - 0.3) < -1e-3 and deriv(k + 0.3) > 1e-3  # a minimum, and only there
    for alpha in (0.05, 0.5):
        u_star = g.plateau_u(alpha, eps)
        assert (1 + alpha) * u_star == pytest.approx(k, rel=1e-14)
        res = optimize.minimize_scalar(lambda u: _avg_loss((1 + alpha) * u, eps), bounds=(0, 10),
                                       method="bounded", options={"xatol": 1e-10})
        assert res.x == pytest.approx(u_star, abs=1e-6)


def test_phi_psi():
    assert g.phi(0.0, EPS) == pytest.approx(2 * EPS * (1 - EPS), rel=1e-14)
    assert g.phi(0.0, EPS) == pytest.approx(0.18, rel=1e-14)
    assert g.psi(0.0, EPS) == pytest.approx(0.0, abs=1e-16)
    d = np.linspace(0.0, KAPPA, 7)
    ph, ps = g.phi(d, EPS), g.psi(d, EPS)
    assert ph.shape == ps.shape == d.shape
    assert np.all(ps[1:] < 0)                       # retrieval margin pushes u back down (psi < 0)
    assert np.all(np.abs(ps[1:]) <= 0.5 * d[1:])    # Lemma 3: |psi(delta)| <= C |delta|
    # Lemma 3: c <= phi <= C on [0, kappa]; phi falls from 2 eps (1 - eps) to phi(kappa).
    assert np.all(np.diff(ph) < 0) and np.all(ph <= 0.18 + 1e-15)
    assert ph[-1] == pytest.approx((1 - EPS) * special.expit(-2 * KAPPA) + EPS / 2, rel=1e-14)


@pytest.mark.parametrize("alpha,v", [(1e-3, 0.5), (0.05, 2.0), (0.4, 1.0)])
def test_flow_rhs_on_plateau_is_plateau_flow(alpha, v):
    """At u = u*(alpha) the 3-D flow's v and alpha rates are the plateau-flow formulas (B.2)."""
    u = g.plateau_u(alpha, EPS)
    du, dv, da = g.flow_rhs(0.0, [u, v, alpha], P, EPS)
    dr = alpha * v
    assert dv == pytest.approx(alpha * g.phi(dr, EPS), rel=1e-13)
    expected = (alpha * math.log(alpha)) ** 2 * (v * g.phi(dr, EPS) + u * g.psi(dr, EPS))
    assert da == pytest.approx(expected, rel=1e-12)
    assert du == pytest.approx((1 + alpha) * g.psi(dr, EPS) / P, rel=1e-12, abs=1e-300)


# ------------------------------------------------------------------------------------------------
# Reduced dynamics (Prop. 4, C7) and the 3-D flow (C8 ODE part, Fig. 1a/1b references)
# ------------------------------------------------------------------------------------------------

REDUCED_T = {1e-1: 66.1, 3e-2: 115.1, 1e-2: 219.7, 3e-3: 510.1, 1e-3: 1201, 1e-4: 8406, 1e-5: 6.54e4}
FLOW_T = dict(zip(ALPHA0S, [10.6, 29.2, 58.5, 118.9, 234.5, 664, 3979, 5.91e4]))


def test_c7_reduced_escape_constant():
    targets = {1e-2: 10.12, 1e-3: 8.29, 1e-4: 7.74, 1e-5: 7.53}
    consts = []
    for a0, c in targets.items():
        got = g.reduced_escape_time(a0, EPS) * a0 * math.log(1 / a0)
        assert got == pytest.approx(c, rel=0.02), a0
        consts.append(got)
    assert all(a > b for a, b in zip(consts, consts[1:]))


@pytest.mark.parametrize("a0", list(REDUCED_T))
def test_reduced_escape_time_table(a0):
    assert g.reduced_escape_time(a0, EPS) == pytest.approx(REDUCED_T[a0], rel=0.02)
    vT = g.reduced_escape_v(a0, EPS)
    assert 2.77 <= vT <= 2.82
    alpha_T = math.exp(-1 / (1 / math.log(1 / a0) + vT ** 2 / 2))
    assert alpha_T * vT == pytest.approx(KAPPA, rel=1e-12)


@pytest.mark.parametrize("a0", [1e-1, 1e-3])
def test_reduced_quadrature_equals_reduced_ode(a0):
    """The v-clock quadrature against a direct integration of v' = a phi(a v), a' = (a log a)^2 v phi(a v)."""
    def rhs(t, y):
        v, a = y
        ph = g.phi(a * v, EPS)
        return [a * ph, (a * math.log(a)) ** 2 * v * ph]

    ev = lambda t, y: y[1] * y[0] - KAPPA
    ev.terminal, ev.direction = True, 1
    sol = integrate.solve_ivp(rhs, (0, 1e6), [0.0, a0], method="LSODA", rtol=1e-10, atol=1e-14, events=ev)
    assert g.reduced_escape_time(a0, EPS) == pytest.approx(sol.t_events[0][0], rel=1e-6)
    assert g.reduced_escape_v(a0, EPS) == pytest.approx(sol.y_events[0][0][0], rel=1e-6)


@pytest.mark.parametrize("a0", ALPHA0S)
def test_flow_escape_time_table(a0):
    assert g.flow_escape_time(a0, P, EPS) == pytest.approx(FLOW_T[a0], rel=0.02)


def test_flow_escape_is_first_crossing():
    a0 = 1e-3
    T = g.flow_escape_time(a0, P, EPS)
    for frac in (0.01, 0.3, 0.9, 0.995):
        dm, dr = g.flow_margins(a0, P, EPS, frac * T)
        assert dr < dm, frac
    dm, dr = g.flow_margins(a0, P, EPS, 1.005 * T)
    assert dr > dm
    dm, dr = g.flow_margins(a0, P, EPS, T)
    assert dr == pytest.approx(dm, rel=1e-5)


def test_flow_escape_edge_cases():
    assert g.flow_escape_time(0.2, P, EPS) == 0.0  # 0.2 > 0.1878: retrieval leads from the start
    assert g.flow_escape_time(0.18, P, EPS) > 0.0
    assert g.flow_escape_time(1e-3, P, EPS, t_max=100.0) == math.inf
    times = [g.flow_escape_time(a0, P, EPS) for a0 in (0.18, 0.1, 0.03)]
    assert times[0] < times[1] < times[2]


def test_full_vs_reduced_ratio():
    """protocol §9.1: full / reduced escape time ~ 0.2 (1e-3), 0.5 (1e-4), 0.9 (1e-5); the full flow is faster."""
    for a0, ratio in ((1e-3, 0.2), (1e-4, 0.5), (1e-5, 0.9)):
        r = g.flow_escape_time(a0, P, EPS) / g.reduced_escape_time(a0, EPS)
        assert r == pytest.approx(ratio, abs=0.05), a0


def test_flow_crossing_alpha0_fig1a():
    a_c = g.flow_crossing_alpha0(P, EPS, 2.5)
    assert a_c == pytest.approx(0.177, abs=0.005)
    dm, dr = g.flow_margins(a_c, P, EPS, 2.5)
    assert dr == pytest.approx(dm, rel=1e-6)
    assert g.alpha_star(P, EPS) < a_c < g.equal_rate_alpha(P, EPS)
    dm, dr = g.flow_margins(0.15, P, EPS, 2.5)
    assert dr < dm
    dm, dr = g.flow_margins(0.2, P, EPS, 2.5)
    assert dr > dm
    with pytest.raises(ValueError, match="bracket"):
        g.flow_crossing_alpha0(P, EPS, 2.5, bracket=(0.01, 0.1))


def test_flow_solution_start_and_growth():
    assert g.flow_solution(0.05, P, EPS, 0.0) == (0.0, 0.0, 0.05)
    u, v, a = g.flow_solution(1e-2, P, EPS, 500.0)
    assert a > 1e-2 and v > 0 and u > 0
    # Before escape u sits near the plateau kappa / (1 + alpha) (Lemma 2).
    u, v, a = g.flow_solution(1e-4, P, EPS, 2000.0)
    assert u == pytest.approx(g.plateau_u(a, EPS), rel=0.02)


def test_theta_law_and_lambda_maps():
    a0 = np.array([1e-1, 1e-3, 1e-5])
    np.testing.assert_allclose(g.theta_law(a0), 1 / (a0 * np.log(1 / a0)), rtol=1e-15)
    for Delta in (1, 4):
        lam = g.lambda0_from_alpha0(a0, Delta)
        np.testing.assert_allclose(g.alpha_from_lambda(lam, Delta), a0, rtol=1e-12)
    assert g.lambda0_from_alpha0(math.exp(-4.0), 4) == pytest.approx(0.0, abs=1e-15)


# ------------------------------------------------------------------------------------------------
# Long context: Lemma 6, Lemma 7, Prop. 8, Prop. 9
# ------------------------------------------------------------------------------------------------

BAYES_DELTAS = [1, 4, 16, 64, 256]
BAYES_TABLE = {  # d = 128, ell = 1024, ||x_q|| = 1 (protocol §2.4)
    1: [1.000, 0.700, 0.500, 0.500, 0.500],
    4: [1.000, 1.000, 0.566, 0.500, 0.500],
    16: [1.000, 1.000, 0.937, 0.530, 0.500],
    64: [0.978, 0.973, 0.944, 0.771, 0.515],
    128: [0.922, 0.917, 0.896, 0.806, 0.576],
    256: [0.842, 0.839, 0.828, 0.783, 0.644],
    1e3: [0.706, 0.706, 0.703, 0.695, 0.663],
    1e4: [0.645, 0.645, 0.645, 0.644, 0.642],
    1e6: [0.638, 0.638, 0.638, 0.638, 0.638],
}


def test_bayes_table():
    taus = np.array(list(BAYES_TABLE), dtype=float)
    acc = g.bayes_accuracy(taus[:, None], np.array(BAYES_DELTAS)[None, :], 128, 1024)
    assert acc.shape == (len(taus), len(BAYES_DELTAS))
    np.testing.assert_allclose(acc, np.array(list(BAYES_TABLE.values())), atol=1e-3, rtol=0)
    err = g.bayes_error(taus[:, None], np.array(BAYES_DELTAS)[None, :], 128, 1024)
    np.testing.assert_allclose(acc + err, 1.0, atol=1e-15)


def test_bayes_matches_direct_formula():
    """Lemma 6 written naively (explicit sums) at moderate tau, where nothing cancels."""
    d, ell = 128, 1024
    j = np.arange(1, ell + 1)
    for tau, Delta, xq in ((3.0, 2, 1.0), (40.0, 30, 0.8), (300.0, 700, 1.3)):
        a = np.exp(-j / tau)
        var = math.fsum(a ** 2) - a[Delta - 1] ** 2
        expected = special.ndtr(-a[Delta - 1] * xq * math.sqrt(d / var))
        assert g.bayes_error(tau, Delta, d, ell, xq_norm=xq) == pytest.approx(expected, rel=1e-10)


def test_bayes_average_is_chi_average():
    d, ell = 128, 1024
    diffs = []
    for tau, Delta in ((1.0, 4), (16.0, 16), (64.0, 16), (128.0, 64), (1e6, 1)):
        f = lambda x: g.bayes_accuracy(tau, Delta, d, ell, xq_norm=math.sqrt(x / d)) * stats.chi2.pdf(x, d)
        quad, _ = integrate.quad(f, 0, np.inf, limit=200)
        avg = g.bayes_accuracy(tau, Delta, d, ell, average=True)
        assert avg == pytest.approx(quad, abs=1e-8)
        diffs.append(abs(avg - g.bayes_accuracy(tau, Delta, d, ell)))
    # protocol §2.6: averaging changes the ||x_q|| = 1 value by about 0.001 at d = 128 (at most 0.0013).
    assert max(diffs) <= 1.5e-3
    with pytest.raises(ValueError, match="xq_norm"):
        g.bayes_accuracy(16.0, 4, d, ell, average=True, xq_norm=0.5)


def test_no_decay_limit():
    assert g.no_decay_accuracy(128, 1024) == pytest.approx(0.6382, abs=2e-4)
    assert g.no_decay_accuracy(128, 1024, average=True) == pytest.approx(0.6379, abs=2e-4)
    Deltas = np.array([1, 7, 512, 1024])
    for avg in (False, True):
        limit = g.no_decay_accuracy(128, 1024, average=avg)
        np.testing.assert_allclose(g.bayes_accuracy(1e12, Deltas, 128, 1024, average=avg), limit, atol=1e-8)
        assert abs(g.bayes_accuracy(1e6, 1, 128, 1024, average=avg) - limit) < 1e-3


@pytest.mark.parametrize("ell,tau", [(1, 1.0), (8, 0.5), (64, 3.0), (1024, 16.0), (1024, 1e3), (512, 1e6),
                                     (1024, 1e6), (100, 1e9), (5, 0.01)])
def test_s2_closed_form(ell, tau):
    explicit = math.fsum(math.exp(-2 * j / tau) for j in range(1, ell + 1))
    assert g.s2(ell, tau) == pytest.approx(explicit, rel=1e-12)


def test_s2_large_tau_no_cancellation():
    ell, tau = 1024, 1e6
    # S2 = ell - (ell (ell + 1) / tau) + O(ell^3 / tau^2): the first correction is resolved exactly.
    assert (ell - g.s2(ell, tau)) / (ell * (ell + 1) / tau) == pytest.approx(1.0, rel=1e-3)
    np.testing.assert_allclose(g.s2(np.array([10, 100]), np.array([[1.0], [2.0]])).shape, (2, 2))


def test_retention():
    np.testing.assert_allclose(g.retention(np.array([0, 1, 5]), 2.0), np.exp(-np.array([0, 1, 5]) / 2.0), rtol=1e-15)


DMAX_TAUS = 2.0 ** np.arange(10)
DMAX_09 = [3, 4, 7, 12, 18, 26, 29, 13, 0, 0]
DMAX_08 = [3, 5, 9, 15, 25, 39, 56, 67, 47, 0]


def test_delta_max_table():
    np.testing.assert_array_equal(g.delta_max(DMAX_TAUS, 128, 512, 0.9), DMAX_09)
    np.testing.assert_array_equal(g.delta_max(DMAX_TAUS, 128, 512, 0.8), DMAX_08)
    assert g.delta_max(4.0, 128, 512, 0.8) == 9 and isinstance(g.delta_max(4.0, 128, 512, 0.8), int)
    assert g.delta_max(64.0, 128, 512, 0.4) == 512  # every Delta reaches chance level 0.5


def test_delta_max_is_a_contour():
    """Bayes accuracy is strictly decreasing in Delta, so the qualifying Delta are exactly 1..Delta_max."""
    Deltas = np.arange(1, 513)
    for tau in DMAX_TAUS:
        for avg in (False, True):
            acc = g.bayes_accuracy(tau, Deltas, 128, 512, average=avg)
            assert np.all(np.diff(acc) <= 0)
            dm = g.delta_max(tau, 128, 512, 0.8, average=avg)
            np.testing.assert_array_equal(acc >= 0.8, Deltas <= dm)


def test_tau_log_d_over_tau():
    expected = [4.9, 8.3, 13.9, 22.2, 33.3, 44.4, 44.4]
    np.testing.assert_allclose(g.tau_log_d_over_tau(DMAX_TAUS[:7], 128), expected, atol=0.05)


# ------------------------------------------------------------------------------------------------
# C9: Monte-Carlo of the untrained retrieval readout (w_x = 0, v = 1) against Lemma 6
# ------------------------------------------------------------------------------------------------

C9_TAUS = [1.0, 16.0, 128.0, 1e6]
C9_DELTAS = [1, 16, 64]


def _mc_conditional(d, ell, n, seed, chunk=10_000):
    """Accuracy of sign(g) for every (tau, Delta) in C9, sampling the exact law given x_q.

    d ||x_q||^2 ~ chi^2_d; x_q . x_t | x_q ~ N(0, ||x_q||^2 / d) independent over t; labels +-1.
    Column j - 1 of a chunk is the key at distance j; the column at distance Delta is the query slot.
    """
    rng = np.random.default_rng(seed)
    dist = np.arange(1, ell + 1)
    correct = np.zeros((len(C9_TAUS), len(C9_DELTAS)))
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        r2 = rng.chisquare(d, m) / d
        dots = rng.standard_normal((m, ell)) * np.sqrt(r2 / d)[:, None]  # x_q . x_t
        labels = rng.choice([-1.0, 1.0], size=(m, ell))
        y_q = rng.choice([-1.0, 1.0], size=m)
        terms = dots * labels
        for i, tau in enumerate(C9_TAUS):
            a = np.exp(-dist / tau)
            total = terms @ a
            for k, Delta in enumerate(C9_DELTAS):
                noise = total - a[Delta - 1] * terms[:, Delta - 1]
                g_out = a[Delta - 1] * r2 * y_q + noise
                correct[i, k] += np.sum(np.sign(g_out) == y_q)
    return correct / n


def test_c9_conditional_monte_carlo():
    d, ell = 128, 1024
    acc = _mc_conditional(d, ell, n=50_000, seed=0)
    bayes = g.bayes_accuracy(np.array(C9_TAUS)[:, None], np.array(C9_DELTAS)[None, :], d, ell, average=True)
    np.testing.assert_allclose(acc, bayes, atol=0.01)
    np.testing.assert_allclose(acc[-1], 0.638, atol=0.01)


def _mc_full_vectors(d, ell, taus, deltas, n, seed, chunk, dtype=np.float64):
    """Literal simulation: keys x_t ~ N(0, I/d), labels +-1, query = x_{t*}, t* = ell - Delta + 1,
    g = sum_t exp(-(ell - t + 1)/tau) (x_q . x_t) y_t (this includes alpha_Delta ||x_q||^2 y_q)."""
    rng = np.random.default_rng(seed)
    w = np.exp(-np.arange(ell, 0, -1)[None, :] / np.asarray(taus, float)[:, None])  # (taus, ell), 0-based t
    correct = np.zeros((len(taus), len(deltas)))
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        X = rng.standard_normal((m, ell, d), dtype=dtype)
        X *= dtype(1.0 / math.sqrt(d))
        Y = rng.choice(np.array([-1.0, 1.0], dtype=dtype), size=(m, ell))
        for k, Delta in enumerate(deltas):
            q = ell - Delta  # 0-based t*
            s = np.matmul(X, X[:, q, :, None])[..., 0]  # x_q . x_t, (m, ell)
            g_out = (s * Y) @ w.T.astype(dtype)  # (m, taus)
            correct[:, k] += np.sum(np.sign(g_out) == Y[:, q][:, None], axis=0)
    return correct / n


def test_c9_full_vector_monte_carlo_small():
    d, ell, taus, deltas = 32, 64, [2.0, 8.0, 1e6], [1, 4, 16]
    acc = _mc_full_vectors(d, ell, taus, deltas, n=20_000, seed=1, chunk=2_500)
    bayes = g.bayes_accuracy(np.array(taus)[:, None], np.array(deltas)[None, :], d, ell, average=True)
    np.testing.assert_allclose(acc, bayes, atol=0.015)


@pytest.mark.slow
def test_c9_full_vector_monte_carlo():
    d, ell = 128, 1024
    acc = _mc_full_vectors(d, ell, C9_TAUS, C9_DELTAS, n=50_000, seed=2, chunk=500, dtype=np.float32)
    bayes = g.bayes_accuracy(np.array(C9_TAUS)[:, None], np.array(C9_DELTAS)[None, :], d, ell, average=True)
    np.testing.assert_allclose(acc, bayes, atol=0.01)
    np.testing.assert_allclose(acc[-1], 0.638, atol=0.01)


# ------------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------------

BAD = [
    ("eps", lambda: g.kappa(0.6)),
    ("eps", lambda: g.phi(0.0, 0.0)),
    ("alpha", lambda: g.initial_rate_ratio(np.array([0.1, 1.3]), P, EPS)),
    ("P", lambda: g.initial_rates(0.1, 0.5, EPS)),
    ("P", lambda: g.alpha_star(float("nan"), EPS)),
    ("alpha0", lambda: g.theta_law(1.5)),
    ("alpha0", lambda: g.flow_escape_time(0.0, P, EPS)),
    ("alpha0", lambda: g.reduced_escape_time(1.0, EPS)),
    ("t_end", lambda: g.flow_solution(0.1, P, EPS, -1.0)),
    ("t_max", lambda: g.flow_escape_time(0.1, P, EPS, t_max=1e-4)),
    ("t", lambda: g.flow_crossing_alpha0(P, EPS, 0.0)),
    ("delta", lambda: g.psi(np.inf, EPS)),
    ("y", lambda: g.flow_rhs(0.0, [0.0, 0.0], P, EPS)),
    ("Delta", lambda: g.bayes_error(1.0, 2000, 128, 1024)),
    ("Delta", lambda: g.bayes_accuracy(1.0, 0, 128, 1024)),
    ("Delta", lambda: g.bayes_accuracy(1.0, 2.5, 128, 1024)),
    ("Delta", lambda: g.lambda0_from_alpha0(0.1, 0.0)),
    ("d", lambda: g.bayes_error(1.0, 2, 0, 1024)),
    ("ell", lambda: g.s2(0, 1.0)),
    ("ell", lambda: g.no_decay_accuracy(128, 1)),
    ("tau", lambda: g.s2(10, -1.0)),
    ("tau", lambda: g.bayes_accuracy(np.inf, 1, 128, 1024)),
    ("xq_norm", lambda: g.bayes_error(1.0, 1, 128, 1024, xq_norm=0.0)),
    ("accuracy", lambda: g.delta_max(4.0, 128, 512, 1.2)),
    ("lam", lambda: g.alpha_from_lambda(np.nan, 1)),
    ("j", lambda: g.retention(-1, 1.0)),
]


@pytest.mark.parametrize("name,call", BAD, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD)])
def test_bad_input_names_argument(name, call):
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        call()


def test_bad_input_message_has_range_and_value():
    with pytest.raises(ValueError, match=r"^alpha must be in \(0, 1\), got 1\.3 \(at index 1\)$"):
        g.initial_rate_ratio(np.array([0.1, 1.3]), P, EPS)
    with pytest.raises(ValueError, match=r"^eps must be in \(0, 0\.5\), got 0\.6$"):
        g.kappa(0.6)
    with pytest.raises(ValueError, match=r"^Delta must be an integer in \[1, ell = 1024\], got 2000$"):
        g.bayes_error(1.0, 2000, 128, 1024)
