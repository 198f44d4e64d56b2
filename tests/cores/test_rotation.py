"""rotation (protocol §1.3, Mamba-3 SISO): the RoPE-trick identities of protocol §1.3.1, the trapezoid's
limits and long sequences. The properties it shares with scalar_decay are in test_recurrences.py."""
import chex
import numpy as np
import pytest

from tests.cores import checks
from tests.cores import common as cm
from tests.cores import reference as ref

CORE = "rotation"
# chunked with r = 0 vs zero angles: the same sums over state channels in another order.
CHUNKED_SPLIT_TOL = 1e-6
ALGS = cm.EXPLICIT[CORE]


# ----------------------------------------------------------------------------- protocol §1.3.1 identities

def _zero_angle_inputs(r):
    """PLAIN (Euler, no D, A per head, zero initial state) rotation inputs with r zero angles."""
    inp = dict(cm.case_inputs(CORE, cm.PLAIN))
    case = cm.PLAIN
    inp["theta"] = np.zeros((case.b, case.t, case.h, r), np.float32)
    return inp


@pytest.mark.parametrize("sd_algorithm", ["sequential", "chunked"])
@pytest.mark.parametrize("algorithm", ALGS)
def test_zero_angles_equal_scalar_decay(algorithm, sd_algorithm):
    case = cm.PLAIN
    inp = _zero_angle_inputs(case.r)
    sd_inp = {k: inp[k] for k in ("x", "dt", "A", "B", "C", "D", "init")}
    y, state = cm.run(CORE, inp, algorithm, case)
    y_sd, h_sd = cm.run("scalar_decay", sd_inp, sd_algorithm, case)
    # fp32 rounding-level agreement (different summation orders across algorithms)
    assert cm.rel_err(y, y_sd) <= 2e-6
    assert cm.rel_err(state.h, h_sd) <= 2e-6
    assert not np.any(np.asarray(state.phase))
    # and both are right
    y_ref, h_ref = ref.scalar_decay(*(sd_inp[k] for k in ("x", "dt", "A", "B", "C", "D")))
    assert cm.rel_err(y, y_ref) <= checks.REF_TOL and cm.rel_err(state.h, h_ref) <= checks.REF_TOL


@pytest.mark.parametrize("algorithm", ALGS)
def test_equals_explicit_state_rotation(algorithm):
    """protocol §1.3.1: rotating B and C by the cumulative phase (RoPE trick) == rotating the state by
    R(-dt theta) every token and reading it with the unrotated C."""
    case = cm.PLAIN
    inp = cm.case_inputs(CORE, case)
    y, _ = cm.run(CORE, inp, algorithm, case)
    want = ref.explicit_rotation(*(inp[k] for k in ("x", "dt", "A", "B", "C", "theta")))
    assert cm.rel_err(y, want) <= checks.REF_TOL
    # the angles matter: without them the outputs differ by far more than the tolerance
    assert cm.rel_err(cm.run(CORE, _zero_angle_inputs(case.r), algorithm, case)[0], want) > 1e-2


@pytest.mark.parametrize("algorithm", ALGS)
def test_no_pairs_equals_zero_angles_exactly(algorithm):
    """r = 0 (theta of shape (b, t, h, 0), rope_fraction 0) is bit-identical to zero angles for the
    scans. `chunked` splits the state channels into a per-head rotated block and a grouped block
    when r > 0, so its C B^T and readout sums run in another order: equal to float32 rounding only
    (docs/cores.md)."""
    case = cm.PLAIN
    y0, s0 = cm.run(CORE, _zero_angle_inputs(0), algorithm, case)
    yz, sz = cm.run(CORE, _zero_angle_inputs(case.r), algorithm, case)
    chex.assert_shape(s0.phase, (case.b, case.h, 0))
    if algorithm == "chunked":
        assert cm.rel_err(y0, yz) <= CHUNKED_SPLIT_TOL
        for name in ("h", "B_prev", "x_prev"):
            assert cm.rel_err(getattr(s0, name), getattr(sz, name)) <= CHUNKED_SPLIT_TOL, name
        return
    np.testing.assert_array_equal(np.asarray(y0), np.asarray(yz))
    for name in ("h", "B_prev", "x_prev"):
        np.testing.assert_array_equal(np.asarray(getattr(s0, name)), np.asarray(getattr(sz, name)), err_msg=name)


@pytest.mark.parametrize("algorithm", ALGS)
def test_trapezoid_one_equals_euler(algorithm):
    """lambda = 1 everywhere is the Euler rule (trap=None), whatever the carried B_prev/x_prev."""
    case = cm.full(65)
    inp = dict(cm.case_inputs(CORE, case))
    inp["trap"] = np.ones_like(inp["trap"])
    euler = dict(inp, trap=None)
    got, want = cm.run(CORE, inp, algorithm, case), cm.run(CORE, euler, algorithm, case)
    cm.assert_close(CORE, got, want, 1e-6, "trap=1 vs Euler")


# ----------------------------------------------------------------------------- long sequences: phases

def _long_phase_inputs(t):
    """Fast, steady rotation (dt*theta ~ 2 rad per token): phases wrap every ~3 tokens, so a
    plain cumulative sum would reach ~2t rad and lose its float32 digits."""
    case = cm.Case(f"phase{t}", b=1, t=t, h=1, p=1, g=1, n=2, r=1, D=False, A_per_token=False, init=False,
                   chunk=64)
    rng = np.random.default_rng(t)
    inp = cm.make_inputs(CORE, case, rng)
    inp["dt"] = rng.uniform(0.5, 1.0, inp["dt"].shape).astype(np.float32)
    inp["theta"] = (np.pi * rng.uniform(0.8, 0.95, inp["theta"].shape)).astype(np.float32)
    inp["A"] = np.full((1,), -0.05, np.float32)
    return case, inp


@pytest.mark.parametrize("algorithm", ALGS)
def test_long_sequence_outputs(algorithm):
    """t = 4096 with ~2 rad per token: y stays within 1e-5 of the float64 reference (y depends on
    phase differences only, so this holds whenever the cumulative phase is reduced as it goes)."""
    case, inp = _long_phase_inputs(4096)
    y, _ = cm.run(CORE, inp, algorithm, case)
    want, _ = cm.reference_run(CORE, inp)
    assert cm.rel_err(y, want) <= checks.REF_TOL


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALGS)
def test_long_sequence_phase_accuracy(algorithm):
    """t = 16384 at ~2 rad per token (~4,600 wraps). y stays within 1e-5 of the float64 reference.
    The final phase drifts from the exact-2pi reference only by the documented 1.7e-7 rad per turn
    of the float32 modulus (ssmgate/cores/rotation.py), plus rounding; the state h, in rotated-B
    coordinates, is the reference's h rotated by that same offset."""
    case, inp = _long_phase_inputs(16384)
    got = cm.run(CORE, inp, algorithm, case)
    want = cm.reference_run(CORE, inp)
    assert cm.rel_err(got[0], want[0]) <= checks.REF_TOL
    turns = np.sum(inp["dt"].astype(np.float64)[..., None] * inp["theta"]) / cm.TWO_PI
    modulus_excess = float(np.float32(cm.TWO_PI)) - cm.TWO_PI
    offset = np.mod(np.asarray(got[1].phase, np.float64) - want[1][0] + np.pi, cm.TWO_PI) - np.pi
    expected = -turns * modulus_excess
    # rounding adds a random walk of ~1e-7 rad per token on top: ~2e-5 rad after 16384 tokens
    assert abs(float(offset.ravel()[0]) - expected) <= 1e-4, (offset, expected)
    # h (one rotated pair) equals the reference's h rotated by the offset
    c, s_ = np.cos(offset.ravel()[0]), np.sin(offset.ravel()[0])
    h_ref = want[1][1].reshape(2)
    h_rot = np.array([c * h_ref[0] - s_ * h_ref[1], s_ * h_ref[0] + c * h_ref[1]])
    assert cm.rel_err(np.asarray(got[1].h).reshape(2), h_rot) <= 1e-4
