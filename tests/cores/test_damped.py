"""damped (protocol §1.5): every algorithm and regime against the float64 reference (scipy expm per
pair and token), gradients, step, split (with trapezoid), extreme decays, half-precision inputs,
vmap; the closed-form transition against expm, its eigenvalues and kappa -> 0 continuity."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from ssmgate.cores.damped import transition
from tests.cores import checks
from tests.cores import common as cm
from tests.cores import reference as ref

CORE = "damped"
ALGS = cm.EXPLICIT[CORE]
REGIMES = cm.REGIMES

# Every length in the underdamped regime; the other two at t = 65 (chunk boundaries, a ragged last
# chunk, an initial state), t = 1000 and the all-options-off case. The regimes differ only in the
# closed-form transition, which test_transition_matches_expm checks for all three on its own.
REF_PARAMS = (
    [(cm.full(t), "under") for t in cm.FULL_LENGTHS]
    + [(cm.full(65), "critical"), (cm.full(65), "over")]
    + [(cm.LONG, "under"), (cm.LONG, "over"), (cm.PLAIN, "under"), (cm.PLAIN, "critical")]
)
# Every split point underdamped; one (pieces of 64 and 1 tokens, compiled by REF_PARAMS) for the others.
SPLIT_PARAMS = [(k, "under") for k in cm.SPLIT_POINTS] + [(64, "critical"), (64, "over")]


@pytest.mark.parametrize("case,regime", REF_PARAMS, ids=[f"{c.name}-{r}" for c, r in REF_PARAMS])
@pytest.mark.parametrize("algorithm", ALGS)
def test_matches_reference(algorithm, case, regime):
    checks.check_reference(CORE, case, algorithm, regime)


@pytest.mark.filterwarnings(cm.AUTO_WARNING)
@pytest.mark.parametrize("case,regime", [(cm.full(65), "under"), (cm.PLAIN, "critical")], ids=["full65", "plain48"])
def test_auto_matches_reference(case, regime):
    checks.check_reference(CORE, case, "auto", regime)


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("algorithm", cm.PARALLEL[CORE])
def test_gradients_match_sequential(algorithm, regime, rng):
    checks.check_gradients(CORE, algorithm, regime, rng)


@pytest.mark.parametrize("case,regime", [(cm.full(65), r) for r in REGIMES] + [(cm.PLAIN, "under")],
                         ids=[f"full65-{r}" for r in REGIMES] + ["plain48-under"])
def test_step_equals_parallel(case, regime):
    checks.check_step(CORE, case, regime)


@pytest.mark.parametrize("k,regime", SPLIT_PARAMS, ids=[f"{k}-{r}" for k, r in SPLIT_PARAMS])
@pytest.mark.parametrize("algorithm", ALGS)
def test_split_equals_whole(algorithm, k, regime):
    checks.check_split(CORE, algorithm, k, regime)


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("algorithm", ALGS)
def test_extreme_decays_finite(algorithm, regime, rng):
    checks.check_extreme(CORE, algorithm, regime, rng)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, np.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("algorithm", ALGS)
def test_half_precision_inputs(algorithm, dtype):
    checks.check_half(CORE, algorithm, dtype, "under")


@pytest.mark.parametrize("algorithm", ALGS)
def test_jit_vmap(algorithm):
    checks.check_vmap(CORE, algorithm, "over")


@pytest.mark.parametrize("algorithm", ALGS)
def test_trapezoid_one_equals_euler(algorithm):
    case = cm.full(65)
    inp = dict(cm.case_inputs(CORE, case, "under"))
    inp["trap"] = np.ones_like(inp["trap"])
    got = cm.run(CORE, inp, algorithm, case, "under")
    want = cm.run(CORE, dict(inp, trap=None), algorithm, case, "under")
    cm.assert_close(CORE, got, want, 1e-6, "trap=1 vs Euler")


# ----------------------------------------------------------------------------- the closed-form transition

def _matrices(m):
    """(m00, m01, m10, m11), each (...,), -> (..., 2, 2) float64."""
    m00, m01, m10, m11 = (np.asarray(e, np.float64) for e in m)
    return np.stack([np.stack([m00, m01], -1), np.stack([m10, m11], -1)], -2)


def _expm_of(dt, a, kappa):
    return np.stack([scipy.linalg.expm(d * ref.companion(x, k)) for d, x, k in zip(dt, a, kappa)])


def _matrix_rel_err(got, want):
    """Per matrix: max entry error / max entry; the worst over the batch."""
    return float(np.max(np.max(np.abs(got - want), axis=(-2, -1)) / np.max(np.abs(want), axis=(-2, -1))))


def _random_params(rng, size):
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(10.0), size))
    a = np.exp(rng.uniform(np.log(1e-3), np.log(10.0), size))
    nu = 3.0 * rng.standard_normal(size)
    return dt, a, nu


@pytest.mark.parametrize("c", [0.3, 0.9, 0.999])
@pytest.mark.parametrize("regime", REGIMES)
def test_transition_matches_expm(regime, c, rng):
    """float64: 1e-10 relative per matrix; float32: 1e-5 (nu*dt up to ~300 rad is rounded to float32
    before the cos/sin, an error of up to ~1e-5 rad)."""
    dt, a, nu = _random_params(rng, 200)
    kappa = np.array([ref.kappa_of(regime, x, v, c) for x, v in zip(a, nu)])
    want = _expm_of(dt, a, kappa)
    with jax.enable_x64():
        got64 = _matrices(transition(jnp.asarray(dt), jnp.asarray(a), jnp.asarray(nu)[:, None],
                                                regime=regime, overdamped_c=c))[:, 0]
    assert _matrix_rel_err(got64, want) <= 1e-10
    f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731
    m32 = transition(f32(dt), f32(a), f32(nu)[:, None], regime=regime, overdamped_c=c)
    assert all(e.dtype == jnp.float32 for e in m32)
    # the float64 reference of the float32-rounded parameters
    d32, a32, n32 = (np.asarray(f32(v), np.float64) for v in (dt, a, nu))
    want32 = _expm_of(d32, a32, [ref.kappa_of(regime, x, v, c) for x, v in zip(a32, n32)])
    assert _matrix_rel_err(_matrices(m32)[:, 0], want32) <= 1e-5


@pytest.mark.parametrize("regime", ["under", "over"])
def test_transition_series_branches(regime):
    """nu*dt (under) or r*dt (over) on both sides of the series-branch threshold and far below it."""
    args = np.array([1e-12, 1e-8, 1e-6, 9.9e-5, 1e-4, 1.01e-4, 1e-3, 1e-2, 1e-1])
    dt = np.array([0.01, 0.7, 5.0])
    a = np.array([0.1, 1.0, 3.0])
    grid = np.array(list(itertools.product(args, dt, a)))
    arg, d, x = grid.T
    if regime == "under":
        nu = arg / d
    else:
        nu = np.arctanh(np.minimum(arg / (d * 0.9 * x), 0.99))
    kappa = np.array([ref.kappa_of(regime, xx, v, 0.9) for xx, v in zip(x, nu)])
    want = _expm_of(d, x, kappa)
    with jax.enable_x64():
        got = _matrices(transition(jnp.asarray(d), jnp.asarray(x), jnp.asarray(nu)[:, None],
                                              regime=regime, overdamped_c=0.9))[:, 0]
    assert _matrix_rel_err(got, want) <= 1e-10


def test_transition_nu_zero_is_critical():
    """kappa = 0 from every regime (nu = 0) is the critical Jordan block."""
    dt, a = jnp.array([0.01, 0.7, 5.0, 0.3]), jnp.array([0.1, 1.0, 3.0, 1e-6])
    nu = jnp.zeros((4, 1))
    crit = _matrices(transition(dt, a, nu, regime="critical"))
    for regime in ("under", "over"):
        got = _matrices(transition(dt, a, nu, regime=regime))
        assert _matrix_rel_err(got, crit) <= 1e-7, regime
    # and the critical block is e^{-a dt} (I + dt N), N = A + aI nilpotent
    d, x = np.asarray(dt, np.float64), np.asarray(a, np.float64)
    N = np.stack([ref.companion(xx, 0.0) + xx * np.eye(2) for xx in x])
    want = np.exp(-x * d)[:, None, None] * (np.eye(2) + d[:, None, None] * N)
    assert _matrix_rel_err(crit[:, 0], want) <= 1e-6


@pytest.mark.parametrize("regime", ["under", "over"])
@pytest.mark.parametrize("algorithm", ALGS)
def test_kappa_to_zero_continuity(algorithm, regime):
    """Tiny nu (kappa -> 0) approaches the critical run; every nu agrees with the reference."""
    case = cm.full(65)
    base = cm.case_inputs(CORE, case, "critical")
    crit = cm.run(CORE, base, algorithm, case, "critical")
    sign = np.sign(base["theta"]) + (base["theta"] == 0)
    for eps in (1e-2, 1e-4, 1e-7):
        inp = dict(base, theta=(eps * sign).astype(np.float32))
        got = cm.run(CORE, inp, algorithm, case, regime)
        cm.assert_close(CORE, got, cm.reference_run(CORE, inp, regime), checks.REF_TOL, f"nu = {eps}")
        if eps <= 1e-4:
            cm.assert_close(CORE, got, crit, checks.REF_TOL, f"nu = {eps} vs critical")
