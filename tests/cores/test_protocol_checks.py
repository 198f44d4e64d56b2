"""protocol §9 rows C1-C3 at their stated sizes (T=256, H=2, P=8, N=16), fp32 (MIMO is out of scope)."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from ssmgate.cores.damped import transition
from tests.cores import common as cm
from tests.cores import reference as ref

T, H, P, N = 256, 2, 8, 16
Q = 32
SPEC_CASE = cm.Case("spec256", b=1, t=T, h=H, p=P, g=1, n=N, r=N // 4, chunk=Q)
SD_CASE = cm.Case("spec256", b=1, t=T, h=H, p=P, g=1, n=N, r=0, A_per_token=False, init=False, trap=False,
                  chunk=Q)


def _carry(core, inp, algorithm, case, regime=None):
    """run(0..T/2) -> run(T/2..T) from the first final state."""
    y1, s1 = cm.run(core, cm.time_slice(inp, 0, T // 2, inp["init"]), algorithm, case, regime)
    y2, s2 = cm.run(core, cm.time_slice(inp, T // 2, T, s1), algorithm, case, regime)
    return jnp.concatenate([y1, y2], axis=1), s2


def test_c1_scalar_decay_algorithms_and_state_carry():
    inp = cm.case_inputs("scalar_decay", SD_CASE)
    want = cm.case_reference("scalar_decay", SD_CASE)
    outs = {alg: cm.run("scalar_decay", inp, alg, SD_CASE) for alg in cm.EXPLICIT["scalar_decay"]}
    for alg, out in outs.items():
        cm.assert_close("scalar_decay", out, want, 1e-5, f"C1 {alg} vs float64 reference")
    for a1, a2 in itertools.combinations(outs, 2):
        cm.assert_close("scalar_decay", outs[a1], outs[a2], 1e-5, f"C1 {a1} vs {a2}")
    for alg, out in outs.items():
        cm.assert_close("scalar_decay", _carry("scalar_decay", inp, alg, SD_CASE), out, 1e-5,
                        f"C1 state carry at T/2, {alg}")


def test_c2_rotation_step_vs_chunked():
    """Step recurrence (with the trapezoid) vs the chunked form: <= 1e-4 (protocol §1.3, C2)."""
    inp = cm.case_inputs("rotation", SPEC_CASE)
    stepped = cm.run_steps("rotation", inp)
    chunked = cm.run("rotation", inp, "chunked", SPEC_CASE)
    cm.assert_close("rotation", chunked, stepped, 1e-4, "C2 chunked vs step")
    cm.assert_close("rotation", chunked, cm.case_reference("rotation", SPEC_CASE), 1e-5, "C2 chunked vs reference")
    cm.assert_close("rotation", _carry("rotation", inp, "chunked", SPEC_CASE), chunked, 1e-5, "C2 state carry")


def _euler(inp, r=None):
    """Euler rule, zero initial state and no D (the explicit-rotation reference has none)."""
    inp = dict(inp, trap=None, init=None, D=None)
    if r is not None:
        inp["theta"] = np.zeros(inp["theta"].shape[:-1] + (r,), np.float32)
    return inp


@pytest.mark.parametrize("algorithm", ["sequential", "chunked"])
def test_c2_explicit_rotation_vs_rope_trick(algorithm):
    inp = _euler(cm.case_inputs("rotation", SPEC_CASE))
    y, _ = cm.run("rotation", inp, algorithm, SPEC_CASE)
    want = ref.explicit_rotation(*(inp[k] for k in ("x", "dt", "A", "B", "C", "theta")))
    assert cm.rel_err(y, want) <= 1e-5


@pytest.mark.parametrize("algorithm", ["sequential", "chunked"])
def test_c2_rope_fraction_zero_equals_zero_angles_exactly(algorithm):
    """Exact for the scan; chunked to float32 rounding (its state channels split into a rotated and
    an unrotated block when r > 0, which reorders the sums; see test_rotation.py)."""
    base = cm.case_inputs("rotation", SPEC_CASE)
    y0, s0 = cm.run("rotation", _euler(base, 0), algorithm, SPEC_CASE)
    yz, sz = cm.run("rotation", _euler(base, SPEC_CASE.r), algorithm, SPEC_CASE)
    if algorithm == "chunked":
        assert cm.rel_err(y0, yz) <= 1e-6 and cm.rel_err(s0.h, sz.h) <= 1e-6
        return
    np.testing.assert_array_equal(np.asarray(y0), np.asarray(yz))
    np.testing.assert_array_equal(np.asarray(s0.h), np.asarray(sz.h))


# ----------------------------------------------------------------------------- C3

A_GRID = (0.1, 1.0, 3.0)
KAPPA_GRID = (-4.0, -0.3, 0.0, 0.2, 0.81)
DT_GRID = (0.01, 0.7, 5.0)


def _c3_points():
    """(a, kappa, dt, regime, nu, c) realising kappa in each regime's parameterisation:
    under: nu = +-sqrt(-kappa); critical: kappa = 0 (and under/over with nu = 0); over: kappa =
    (c a tanh nu)^2 needs sqrt(kappa) < c a < a, so (a = 0.1, kappa in {0.2, 0.81}) has no
    overdamped realisation (its slow mode would grow) and is not generated."""
    points = []
    for a, kappa, dt in itertools.product(A_GRID, KAPPA_GRID, DT_GRID):
        if kappa < 0:
            for sign in (1.0, -1.0):
                points.append((a, kappa, dt, "under", sign * np.sqrt(-kappa), 0.9))
        elif kappa == 0:
            points += [(a, 0.0, dt, "critical", 0.7, 0.9), (a, 0.0, dt, "under", 0.0, 0.9),
                       (a, 0.0, dt, "over", 0.0, 0.9)]
        elif np.sqrt(kappa) < a:
            c = 0.9 if np.sqrt(kappa) < 0.8 * a else 0.5 * (1.0 + np.sqrt(kappa) / a)
            points.append((a, kappa, dt, "over", np.arctanh(np.sqrt(kappa) / (c * a)), c))
    return points


C3_POINTS = _c3_points()


def _closed_form(points, dtype):
    """The cores' transition at every grid point, as (k, 2, 2) float64 matrices."""
    out = []
    for a, kappa, dt, regime, nu, c in points:
        m = transition(jnp.asarray([dt], dtype), jnp.asarray([a], dtype), jnp.asarray([[nu]], dtype),
                       regime=regime, overdamped_c=c)
        out.append(np.array([[m[0][0, 0], m[1][0, 0]], [m[2][0, 0], m[3][0, 0]]], np.float64))
    return np.stack(out)


def _rel(got, want):
    return np.max(np.abs(got - want)) / np.max(np.abs(want))


def test_c3_grid_covers_every_regime_and_kappa():
    regimes = {p[3] for p in C3_POINTS}
    kappas = {p[1] for p in C3_POINTS}
    assert regimes == {"under", "critical", "over"} and kappas == set(KAPPA_GRID)
    for a, kappa, dt, regime, nu, c in C3_POINTS:
        assert ref.kappa_of(regime, a, nu, c) == pytest.approx(kappa, abs=1e-12)
        assert 0 < c < 1


def test_c3_closed_form_vs_expm():
    """<= 1e-6 relative per matrix in float64 (protocol §9, check C3: 1e-6) and in float32 (rounding of the inputs
    taken into account by the float64 expm of the rounded parameters)."""
    with jax.enable_x64():
        got64 = _closed_form(C3_POINTS, jnp.float64)
    got32 = _closed_form(C3_POINTS, jnp.float32)
    for i, (a, kappa, dt, regime, nu, c) in enumerate(C3_POINTS):
        want = scipy.linalg.expm(dt * ref.companion(a, kappa))
        assert _rel(got64[i], want) <= 1e-6, (a, kappa, dt, regime)
        a32, dt32, nu32 = (float(np.float32(v)) for v in (a, dt, nu))
        want32 = scipy.linalg.expm(dt32 * ref.companion(a32, ref.kappa_of(regime, a32, nu32, c)))
        assert _rel(got32[i], want32) <= 1e-6, (a, kappa, dt, regime)


def test_c3_eigenvalues():
    """eig(Abar) = exp(dt (-a +- sqrt(kappa))): trace and determinant (well conditioned, also for
    the critical double root) to 1e-9, eigenvalues themselves for kappa != 0 to 1e-9."""
    with jax.enable_x64():
        mats = _closed_form(C3_POINTS, jnp.float64)
    for m, (a, kappa, dt, regime, nu, c) in zip(mats, C3_POINTS):
        root = np.sqrt(complex(kappa))
        lam = np.exp(dt * (-a + root)), np.exp(dt * (-a - root))
        scale = abs(lam[0])
        assert abs(np.trace(m) - (lam[0] + lam[1]).real) <= 1e-9 * scale
        assert abs(np.linalg.det(m) - (lam[0] * lam[1]).real) <= 1e-9 * scale ** 2
        if kappa != 0:
            got = np.sort_complex(np.linalg.eigvals(m))
            want = np.sort_complex(np.array(lam, complex))
            assert np.max(np.abs(got - want)) <= 1e-9 * scale, (a, kappa, dt, got, want)


def test_c3_underdamped_is_similar_to_a_rotation():
    """Abar = M e^{-a dt} R(nu dt) M^{-1}, M = [[1, 0], [-a, -nu]] (protocol §1.5)."""
    points = [p for p in C3_POINTS if p[3] == "under" and p[4] != 0]
    assert points
    with jax.enable_x64():
        mats = _closed_form(points, jnp.float64)
    for m, (a, kappa, dt, regime, nu, c) in zip(mats, points):
        M = np.array([[1.0, 0.0], [-a, -nu]])
        want = M @ (np.exp(-a * dt) * ref.rot2(nu * dt)) @ np.linalg.inv(M)
        assert _rel(m, want) <= 1e-9


@pytest.mark.parametrize("regime", cm.REGIMES)
def test_c3_associative_equals_sequential(regime):
    inp = cm.case_inputs("damped", SPEC_CASE, regime)
    seq = cm.run("damped", inp, "sequential", SPEC_CASE, regime)
    assoc = cm.run("damped", inp, "associative", SPEC_CASE, regime)
    cm.assert_close("damped", assoc, seq, 1e-5, "C3 associative vs sequential")
    cm.assert_close("damped", assoc, cm.case_reference("damped", SPEC_CASE, regime), 1e-5, "C3 vs reference")
