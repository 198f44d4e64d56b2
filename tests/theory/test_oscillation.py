"""protocol §1.5-1.8 formulas of ssmgate.theory.oscillation, and §9 checks C4 (App. C.2/C.3) and C5 (App. A, Table 8)."""
import itertools
import math

import numpy as np
import pytest
from scipy import linalg

from ssmgate.theory import oscillation as o

# protocol §9 C3's grid.
C3_A = (0.1, 1.0, 3.0)
C3_KAPPA = (-4.0, -0.3, 0.0, 0.2, 0.81)
C3_DT = (0.01, 0.7, 5.0)
C3_GRID = list(itertools.product(C3_DT, C3_A, C3_KAPPA))
DRAWS = 1000
REAL_MODELS = ("linear_attention", "deltanet", "gated_deltanet", "kda")
COMPLEX_MODELS = ("complex_kda", "momentum_deltanet")


def _expm_transition(dt, a, kappa):
    return linalg.expm(dt * o.continuous_generator(a, kappa))


# ------------------------------------------------------------------------------------------------
# Second-order view of one block (protocol §1.5, §1.7 "Rates")
# ------------------------------------------------------------------------------------------------

def test_damping_ratio_and_natural_frequency():
    assert o.natural_frequency(3.0, 4.0) == pytest.approx(5.0, rel=1e-15)
    assert o.damping_ratio(3.0, 4.0) == pytest.approx(0.6, rel=1e-15)
    assert o.damping_ratio(3.0, -4.0) == o.damping_ratio(3.0, 4.0)  # signed frequency, same damping
    assert o.damping_ratio(2.0, 0.0) == 1.0
    a, nu = np.array([0.1, 1.0, 3.0]), np.array([2.0, 0.5, 0.01])
    zeta = o.damping_ratio(a, nu)
    np.testing.assert_allclose(zeta, a / o.natural_frequency(a, nu), rtol=1e-15)
    np.testing.assert_allclose(o.damping_ratio(0.7 * a, 0.7 * nu), zeta, rtol=1e-15)  # scale-free (dt cancels)
    assert np.all((zeta > 0) & (zeta < 1))
    with pytest.raises(ValueError, match=r"^a must be > 0"):
        o.damping_ratio(-1.0, 1.0)


def test_regime_classification():
    a = 2.0
    assert o.regime(-1.0, a) == "under"
    assert o.regime(0.0, a) == "critical"
    assert o.regime(3.9, a) == "over"
    assert o.regime(1e-13, a) == "critical" and o.regime(-1e-13, a) == "critical"  # inside the default tol
    assert o.regime(1e-13, a, tol=0.0) == "over" and o.regime(-1e-13, a, tol=0.0) == "under"
    assert o.regime(0.05, a, tol=0.1) == "critical"
    names = o.regime(np.array([-4.0, 0.0, 0.2, 0.81]), 1.0)
    assert list(names) == ["under", "critical", "over", "over"]
    with pytest.raises(ValueError, match=r"^kappa must be finite and < a\*\*2.*got 4"):
        o.regime(4.0, a)
    with pytest.raises(ValueError, match=r"^tol must be >= 0"):
        o.regime(0.0, a, tol=-1.0)


@pytest.mark.parametrize("regime_name", o.REGIMES)
def test_core_kappa_lands_in_its_regime(regime_name):
    a = np.array([0.1, 1.0, 3.0])
    nu = np.array([-1.5, 0.3, 2.0])
    assert list(o.regime(o.core_kappa(regime_name, a, nu), a)) == [regime_name] * 3
    assert o.core_kappa("over", 1.0, 50.0, overdamped_c=0.9) == pytest.approx(0.81, rel=1e-12)
    with pytest.raises(ValueError, match=r"^overdamped_c must be in \(0, 1\), got 1"):
        o.core_kappa("over", 1.0, 1.0, overdamped_c=1.0)
    with pytest.raises(ValueError, match="regime_name must be one of"):
        o.core_kappa("damped", 1.0, 1.0)


def test_continuous_generator_spectrum():
    for a, kappa in itertools.product(C3_A, C3_KAPPA):
        lam = np.sort_complex(np.linalg.eigvals(o.continuous_generator(a, kappa)))
        root = np.sqrt(complex(kappa))
        np.testing.assert_allclose(lam, np.sort_complex(np.array([-a - root, -a + root])), atol=2e-7)
    batch = o.continuous_generator(np.array([1.0, 2.0]), np.array([0.0, -1.0]))
    np.testing.assert_array_equal(batch[1], [[0.0, 1.0], [-5.0, -4.0]])


@pytest.mark.parametrize("dt,a,kappa", C3_GRID)
def test_closed_form_matches_expm_on_c3_grid(dt, a, kappa):
    closed = o.discrete_transition(dt, a, kappa)
    ref = _expm_transition(dt, a, kappa)
    assert np.max(np.abs(closed - ref)) <= 1e-12 * np.max(np.abs(ref))
    # eig(Abar) = e^{dt(-a +- sqrt(kappa))}: trace and determinant (well-conditioned even for the
    # critical Jordan block), and the eigenvalues themselves where they are simple.
    root = np.sqrt(complex(kappa))
    want = np.exp(dt * np.array([-a - root, -a + root]))
    assert np.trace(closed) == pytest.approx(np.sum(want).real, rel=1e-12)
    assert np.linalg.det(closed) == pytest.approx(math.exp(-2 * a * dt), rel=1e-12)
    if kappa != 0:
        got = np.sort_complex(np.linalg.eigvals(closed).astype(complex))
        np.testing.assert_allclose(got, np.sort_complex(want), rtol=1e-12, atol=1e-12 * np.max(np.abs(want)))


def test_closed_form_vectorised_and_underdamped_rotation_form():
    dt, a, kappa = (np.array(v, dtype=float) for v in zip(*C3_GRID))
    batch = o.discrete_transition(dt, a, kappa)
    assert batch.shape == (len(C3_GRID), 2, 2)
    for i, args in enumerate(C3_GRID):
        np.testing.assert_array_equal(batch[i], o.discrete_transition(*args))
    # Underdamped: Abar = M e^{-a dt} R(nu dt) M^{-1}  (protocol §1.5, C3).
    for dt_, a_, nu in itertools.product(C3_DT, C3_A, (2.0, -0.5477)):
        m = o.companion_from_rotation(a_, nu)
        c, s = math.cos(nu * dt_), math.sin(nu * dt_)
        rotated = m @ (math.exp(-a_ * dt_) * np.array([[c, -s], [s, c]])) @ np.linalg.inv(m)
        np.testing.assert_allclose(o.discrete_transition(dt_, a_, -nu * nu), rotated, rtol=1e-11, atol=1e-15)
        np.testing.assert_allclose(linalg.expm(dt_ * o.rotation_generator(a_, nu)),
                                   math.exp(-a_ * dt_) * np.array([[c, -s], [s, c]]), rtol=1e-12, atol=1e-17)


@pytest.mark.parametrize("dt", [0.01, 1.0, 5.0])
def test_series_branch_for_small_kappa(dt):
    edge = 1e-6 / dt ** 2  # |kappa| dt^2 = 1e-6: where the series branch hands over
    for kappa in (1e-300, 1e-12 / dt ** 2, edge * (1 - 1e-9), edge * (1 + 1e-9)):
        for sign in (1.0, -1.0):
            closed = o.discrete_transition(dt, 0.5, sign * kappa)
            ref = _expm_transition(dt, 0.5, sign * kappa)
            np.testing.assert_allclose(closed, ref, rtol=1e-13, atol=1e-15 * np.max(np.abs(ref)))
    below = o.discrete_transition(dt, 0.5, edge * (1 - 1e-12))
    above = o.discrete_transition(dt, 0.5, edge * (1 + 1e-12))
    np.testing.assert_allclose(below, above, rtol=1e-12)  # no seam at the hand-over


def test_closed_form_semigroup_and_extreme_arguments():
    for a, kappa in [(1.0, -4.0), (1.0, 0.0), (3.0, 0.81)]:
        np.testing.assert_allclose(o.discrete_transition(0.3, a, kappa) @ o.discrete_transition(0.4, a, kappa),
                                   o.discrete_transition(0.7, a, kappa), rtol=1e-13, atol=1e-16)
    np.testing.assert_array_equal(o.discrete_transition(0.0, 2.0, 0.5), np.eye(2))
    huge = o.discrete_transition(1e3, 1.0, 0.81)  # cosh(900) overflows; the mode form does not
    assert np.all(np.isfinite(huge)) and np.max(np.abs(huge)) < 1e-40
    with pytest.raises(ValueError, match=r"^dt must be >= 0"):
        o.discrete_transition(-0.1, 1.0, 0.0)


def test_rates_from_eigenvalues_round_trip():
    dt = 0.7
    for a, nu in [(0.1, 2.0), (1.0, 0.3), (3.0, 4.0)]:
        lam = np.linalg.eigvals(o.discrete_transition(dt, a, -nu * nu))
        upper = lam[np.imag(lam) > 0][0]
        got_a, got_nu = o.rates_from_complex_pair(abs(upper), np.angle(upper), dt)
        assert got_a == pytest.approx(a, rel=1e-12) and got_nu == pytest.approx(nu, rel=1e-12)
        assert o.damping_ratio(-math.log(abs(upper)), np.angle(upper)) == pytest.approx(o.damping_ratio(a, nu), rel=1e-12)
    a, kappa = 3.0, 0.81
    mus = np.sort(np.linalg.eigvals(o.discrete_transition(dt, a, kappa)).real)
    np.testing.assert_allclose(o.rate_from_real_eigenvalue(mus, dt), [a + 0.9, a - 0.9], rtol=1e-12)
    assert o.rate_from_real_eigenvalue(1.0, dt) == 0.0
    with pytest.raises(ValueError, match=r"^mu must be in \(0, 1\], got 1.5"):
        o.rate_from_real_eigenvalue(1.5, dt)


@pytest.mark.parametrize("regime_name", o.REGIMES)
def test_damped_core_transition_agrees_with_theory(regime_name):
    import jax.numpy as jnp

    from ssmgate.cores.damped import transition

    dt, a, nu = (v.ravel() for v in np.meshgrid(np.array(C3_DT), np.array(C3_A), np.array([-2.0, -0.3, 0.4, 1.5]),
                                                  indexing="ij"))
    f32 = lambda v: jnp.asarray(v, jnp.float32)
    entries = transition(f32(dt), f32(a), f32(nu[:, None]), regime=regime_name)
    assert all(e.dtype == jnp.float32 for e in entries)
    core = np.stack([np.asarray(e, np.float64)[:, 0] for e in entries], axis=-1).reshape(-1, 2, 2)
    theory = o.discrete_transition(dt, a, o.core_kappa(regime_name, a, nu))
    np.testing.assert_allclose(core, theory, rtol=1e-5, atol=1e-30)


# ------------------------------------------------------------------------------------------------
# Modal persistence (protocol §1.6) and C4
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("omega0", [0.5, 1.0, 2.0])
def test_c4_critical_scaled_propagator_tends_to_n(omega0):
    n = o.critical_limit(omega0)
    np.testing.assert_allclose(n @ n, 0.0, atol=1e-15)
    assert np.linalg.matrix_rank(n) == 1
    assert n == pytest.approx(o.continuous_generator(omega0, 0.0) + omega0 * np.eye(2))
    far = o.critical_scaled_propagator(omega0, 1e3)
    # C4: within 1e-3 of N at t = 1e3 (relative, spectral norm; the remainder is exactly I/t).
    assert np.linalg.norm(far - n, 2) / np.linalg.norm(n, 2) <= 1e-3
    np.testing.assert_allclose(far - n, np.eye(2) / 1e3, atol=1e-8)
    near = o.critical_scaled_propagator(omega0, 10.0)
    assert np.linalg.norm(near - n, 2) / np.linalg.norm(n, 2) > 1e-2  # not yet there: the limit is slow


@pytest.mark.parametrize("a", [1.05, 1.5, 3.0])
def test_c4_overdamped_direction_collapses_onto_slow_mode(a):
    omega0 = 1.0
    slow, fast = o.overdamped_rates(omega0, a)
    fast_vec = np.array([1.0, -fast]) / math.hypot(1.0, fast)
    z0 = fast_vec + 0.01 * o.slow_eigenvector(omega0, a)  # starts almost on the fast mode
    times = np.linspace(0.0, 60.0, 121)
    cos = o.overdamped_direction_cosine(omega0, a, z0, times)
    assert cos[0] < 0.99
    assert cos[-1] > 0.999  # C4
    assert np.all(np.diff(cos) >= -1e-12)  # the direction moves monotonically onto the slow mode
    # The slow vector is an eigenvector of A(kappa) with eigenvalue -(a - r).
    gen = o.continuous_generator(a, o.kappa_from_natural_frequency(omega0, a))
    v = o.slow_eigenvector(omega0, a)
    np.testing.assert_allclose(gen @ v, -slow * v, atol=1e-14)


@pytest.mark.parametrize("a", [1.05, 1.5, 3.0])
def test_overdamped_dominant_rate(a):
    omega0 = 1.0
    slow, fast = o.overdamped_rates(omega0, a)
    r = math.sqrt(a * a - omega0 ** 2)
    assert slow == pytest.approx(a - r, rel=1e-12) and fast == pytest.approx(a + r, rel=1e-15)
    assert slow == pytest.approx(omega0 ** 2 / (a + r), rel=1e-15) and slow < omega0
    # The measured late-time decay rate of an unshifted trajectory is a - r.
    gen = o.continuous_generator(a, a * a - omega0 ** 2)
    traj = o.propagate(gen, [1.0, 0.0], [40.0, 50.0])
    measured = -math.log(np.linalg.norm(traj[1]) / np.linalg.norm(traj[0])) / 10.0
    assert measured == pytest.approx(slow, rel=1e-9)


def test_critical_damping_decays_fastest():
    omega0 = 1.3
    grid = np.linspace(0.05, 5.0, 991)
    rates = o.asymptotic_decay_rate(omega0, grid)
    assert grid[np.argmax(rates)] == pytest.approx(omega0, abs=5e-3)
    assert o.asymptotic_decay_rate(omega0, omega0) == pytest.approx(omega0, rel=1e-15)
    under = grid < omega0
    np.testing.assert_allclose(rates[under], grid[under], rtol=1e-15)  # underdamped rate a < omega0
    assert np.all(rates[grid > omega0] < omega0)


@pytest.mark.parametrize("a", [0.1, 0.5, 0.9])
def test_c4_underdamped_angle_preserved_in_rotation_coordinates(a):
    omega0 = 1.0
    rng = np.random.default_rng(3)
    z0, z1 = rng.standard_normal(2), rng.standard_normal(2)
    times = np.linspace(0.0, 50.0, 101)
    angles = o.underdamped_angles(omega0, a, z0, z1, times)
    assert angles[0] == pytest.approx(o.angle_between(z0, z1), abs=1e-15)
    assert np.max(np.abs(angles - angles[0])) <= 1e-9  # C4
    # ... and norms shrink uniformly: e^{-a t} for every trajectory.
    nu = math.sqrt(omega0 ** 2 - a * a)
    traj = o.propagate(o.rotation_generator(a, nu), z0, times)
    np.testing.assert_allclose(np.linalg.norm(traj, axis=1), np.exp(-a * times) * np.linalg.norm(z0), rtol=1e-10)
    # In companion coordinates (H, H') the same motions do not keep their angle.
    companion = o.underdamped_angles(omega0, a, z0, z1, times, coordinates="companion")
    assert np.max(np.abs(companion - companion[0])) > 1e-3


def test_c4_steady_state_gain_simulation():
    steps = 5000
    assert o.simulated_gain(0.99, 0.0, steps) == pytest.approx(100.0, abs=0.1)
    assert o.simulated_gain(0.99, math.pi / 2, steps) == pytest.approx(0.7107, abs=1e-3)
    assert o.steady_state_gain(0.99, math.pi / 2) == pytest.approx(1 / math.sqrt(1 + 0.99 ** 2), rel=1e-14)
    assert o.steady_state_gain(0.99, 0.0) == pytest.approx(100.0, rel=1e-13)


def test_gain_closed_forms():
    rho = np.array([0.0, 0.5, 0.9, 0.99])[:, None]
    theta = np.array([0.0, 1e-6, 0.3, math.pi / 2, math.pi, -2.0])[None, :]
    gain = o.steady_state_gain(rho, theta, u=2.0)
    np.testing.assert_allclose(gain, 2.0 / np.abs(1.0 - rho * np.exp(1j * theta)), rtol=1e-12)
    np.testing.assert_allclose(o.simulated_gain(rho, theta, 37, u=2.0 - 1j), o.transient_gain(rho, theta, 37, u=2.0 - 1j),
                               rtol=1e-12)
    # Rotation lowers constant-write accumulation at the same radial retention.
    assert np.all(gain[1:, 2:] < gain[1:, :1])
    assert np.all(np.diff(o.steady_state_gain(0.95, np.linspace(0.0, math.pi, 50))) < 0)
    with pytest.raises(ValueError, match=r"^rho must be in \[0, 1\), got 1"):
        o.steady_state_gain(1.0, 0.0)


# ------------------------------------------------------------------------------------------------
# Frozen-transition spectra (protocol §1.7, Table 8) and C5
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def draws():
    """Per model: (params, eigenvalues) of DRAWS random draws."""
    out = {}
    for i, model in enumerate(o.MODELS):
        params = o.random_draws(model, DRAWS, np.random.default_rng(100 + i))
        out[model] = [(p, o.spectrum(model, p)) for p in params]
    return out


@pytest.mark.parametrize("model", list(o.MODELS))
def test_c5_eigen_type_matches_stated_condition(model, draws):
    stated = np.array([o.stated_complex(model, p) for p, _ in draws[model]])
    found = np.array([o.eigen_type(lam) == "complex" for _, lam in draws[model]])
    assert np.array_equal(stated, found)  # 100% agreement
    if model in COMPLEX_MODELS:
        assert 0.05 < stated.mean() < 0.95  # both sides of the condition are exercised
    else:
        assert not stated.any()


@pytest.mark.parametrize("model", list(o.MODELS))
def test_c5_damping_ratio_formulas_match_eigenvalues(model, draws):
    for p, lam in draws[model]:
        table = o.table_damping_ratios(model, p)
        spectral = o.spectral_damping_ratios(model, lam)
        assert table.shape == spectral.shape
        np.testing.assert_array_equal(np.isnan(table), np.isnan(spectral))
        if o.eigen_type(lam) == "complex":
            # C5: -log rho / sqrt(log^2 rho + phi^2) within 1e-9, and underdamped.
            assert np.max(np.abs(table - spectral)) <= 1e-9
            assert np.all((table > 0) & (table < 1))
        else:
            # Real rates give zeta in [1, inf]; compare 1/zeta (in [0, 1]), which is well-conditioned
            # even when a rate is tiny and zeta huge.
            ok = ~np.isnan(table)
            with np.errstate(divide="ignore"):
                assert np.max(np.abs(1 / table[ok] - 1 / spectral[ok]), initial=0.0) <= 1e-9
            assert np.all(table[ok] >= 1 - 1e-12)
    if model == "linear_attention":
        assert all(np.isnan(o.table_damping_ratios(model, p)).all() for p, _ in draws[model])
    if model == "deltanet":
        assert all(np.isinf(o.table_damping_ratios(model, p)).all() for p, _ in draws[model])
    if model in ("gated_deltanet", "kda"):
        assert all(np.all(o.table_damping_ratios(model, p) > 1) for p, _ in draws[model])


def test_c5_complex_kda_boundary_is_a_repeated_eigenvalue():
    for alpha in (-0.9, -0.5, -0.1, -0.01):
        boundary = o.complex_kda_boundary_cos(alpha)
        for theta in (math.acos(boundary), math.pi - math.acos(boundary)):
            t = o.complex_kda_block(alpha, theta)
            lam = np.linalg.eigvals(t)
            assert abs(lam[0] - lam[1]) <= 1e-6  # double eigenvalue (sqrt(eps)-conditioned)
            double = np.trace(t) / 2
            assert abs(abs(double) - math.sqrt(-alpha)) <= 1e-14
            shifted = t - double * np.eye(2)
            assert np.max(np.abs(shifted @ shifted)) <= 1e-14 and np.max(np.abs(shifted)) > 1e-2  # a Jordan block
            for step, kind in ((+1e-4, "complex"), (-1e-4, "real")):  # into / out of the complex region
                nudged = theta + step if theta < math.pi / 2 else theta - step
                assert o.complex_kda_is_complex(alpha, nudged) == (kind == "complex")
                assert o.eigen_type(np.linalg.eigvals(o.complex_kda_block(alpha, nudged))) == kind


def test_table8_spectra_and_moduli():
    rng = np.random.default_rng(7)
    k = rng.standard_normal(5)
    k /= np.linalg.norm(k)
    np.testing.assert_array_equal(o.frozen_transition("linear_attention", {"d": 5}), np.eye(5))
    np.testing.assert_allclose(np.sort(o.spectrum("deltanet", {"k": k, "beta": 0.3}).real), [0.7, 1, 1, 1, 1], atol=1e-14)
    np.testing.assert_allclose(np.sort(o.spectrum("gated_deltanet", {"k": k, "beta": 0.3, "alpha": 0.5}).real),
                               [0.35, 0.5, 0.5, 0.5, 0.5], atol=1e-14)
    gates = rng.uniform(0.05, 0.95, 5)
    sym = o.kda_symmetrized(k, 0.6, gates)
    np.testing.assert_array_equal(sym, sym.T)
    mus = np.linalg.eigvalsh(sym)
    assert np.all((mus > 0) & (mus < 1))
    np.testing.assert_allclose(np.sort(o.spectrum("kda", {"k": k, "beta": 0.6, "alpha": gates}).real), mus, atol=1e-13)
    t = o.complex_kda_block(-0.49, 1.2)
    assert np.trace(t) == pytest.approx(1.49 * math.cos(1.2), rel=1e-14)
    assert np.linalg.det(t) == pytest.approx(0.49, rel=1e-14)
    np.testing.assert_allclose(np.abs(np.linalg.eigvals(t)), [0.7, 0.7], rtol=1e-14)
    b = o.momentum_deltanet_block(0.8, 0.5, 0.4, 0.6)
    assert np.trace(b) == pytest.approx(0.8 * 0.8 + 0.6, rel=1e-15) and np.linalg.det(b) == pytest.approx(0.48, rel=1e-14)
    assert o.momentum_deltanet_is_complex(0.8, 0.5, 0.4, 0.6) == (1.24 ** 2 < 4 * 0.48)
    np.testing.assert_allclose(np.abs(np.linalg.eigvals(b)), math.sqrt(0.48), rtol=1e-14)
    assert not o.momentum_deltanet_is_complex(0.9, 0.1, 0.1, 0.1)
    assert o.eigen_type(np.linalg.eigvals(o.momentum_deltanet_block(0.9, 0.1, 0.1, 0.1))) == "real"


def test_kda_equal_rates_are_diagonalisable_not_jordan():
    k = np.array([0.6, 0.8, 0.0])
    t = o.kda_transition(k, 0.5, np.full(3, 0.7))  # equal gates: T = 0.7 H, symmetric
    lam, vecs = np.linalg.eig(t)
    assert np.sum(np.isclose(lam, 0.7, atol=1e-14)) == 2  # repeated eigenvalue ...
    assert np.linalg.matrix_rank(vecs) == 3  # ... with a full eigenbasis
    assert o.pair_damping_ratio(0.3, 0.3) == 1.0


def test_gated_deltanet_ratio_formula_and_pair_ratio_limits():
    beta, alpha = 0.4, 0.6
    gamma, b = -math.log(alpha), -math.log(1 - beta)
    want = (2 * gamma + b) / (2 * math.sqrt(gamma * (gamma + b)))
    assert o.gated_deltanet_damping_ratio(beta, alpha) == pytest.approx(want, rel=1e-15)
    assert o.pair_damping_ratio(gamma, gamma + b) == pytest.approx(want, rel=1e-15)
    assert o.pair_damping_ratio(0.5, 0.0) == math.inf
    assert math.isnan(o.pair_damping_ratio(0.0, 0.0))
    assert o.block_damping_ratio(1.0, 0.16) == pytest.approx(o.pair_damping_ratio(-math.log(0.8), -math.log(0.2)), rel=1e-14)
    assert math.isnan(o.block_damping_ratio(-1.0, 0.16))  # negative real eigenvalues: no damped analogue


def test_random_draws_ranges_and_errors():
    rng = np.random.default_rng(0)
    for p in o.random_draws("complex_kda", 200, rng):
        assert -1 < p["alpha"] < 0 and -math.pi <= p["theta"] <= math.pi
    for p in o.random_draws("momentum_deltanet", 200, rng):
        assert all(0 < p[name] < 1 for name in ("alpha", "beta", "eta", "mu"))
    for p in o.random_draws("kda", 50, rng, d=6):
        assert p["k"].shape == (6,) and abs(np.linalg.norm(p["k"]) - 1) < 1e-14 and np.all((p["alpha"] > 0) & (p["alpha"] < 1))
    a = o.random_draws("gated_deltanet", 3, np.random.default_rng(5))
    b = o.random_draws("gated_deltanet", 3, np.random.default_rng(5))
    assert all(x["beta"] == y["beta"] and np.array_equal(x["k"], y["k"]) for x, y in zip(a, b))  # reproducible
    with pytest.raises(ValueError, match="model must be one of"):
        o.random_draws("mamba", 3, rng)
    with pytest.raises(ValueError, match=r"^k must be a unit vector"):
        o.deltanet_transition([1.0, 1.0], 0.5)
    with pytest.raises(ValueError, match=r"^beta must be in \(0, 1\), got 1.5"):
        o.deltanet_transition([1.0, 0.0], 1.5)
    with pytest.raises(ValueError, match=r"^alpha must be in \(-1, 0\), got 0.5"):
        o.complex_kda_block(0.5, 0.0)
    with pytest.raises(ValueError, match=r"^alpha must have the key's shape"):
        o.kda_transition([1.0, 0.0], 0.5, [0.5, 0.5, 0.5])


def test_plot_spectra_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    from ssmgate.theory import oscillation_plots

    path = oscillation_plots.plot_spectra(tmp_path / "spectra.png", n=20, seed=1)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
