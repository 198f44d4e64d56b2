"""A non-finite input at position s leaves every output before s clean, in every algorithm.

The sequential recurrence carries a NaN forward through its state and never backward; the chunked
matmul forms multiplied the future positions of a chunk by exact zeros, and 0 * NaN = NaN made
the outputs from the start of s's chunk non-finite (ssmgate/cores/_finite.py); the damped scan
form, which folds token s+1's trapezoid weight into token s's write, reached one position back.
Every algorithm must give the step function's (the recurrence itself, token by token) pattern of
non-finite outputs and final state exactly, with the same values before s.
"""
import jax
import numpy as np
import pytest

from tests.cores import common as cm
from tests.cores import test_mimo as mimo_tests

CASE = cm.Case("nan40", b=1, t=40, h=4, p=2, g=2, n=4, r=1, chunk=16)
BAD_POS, BAD_HEAD = 37, 1  # in the last of three chunks, after 5 clean positions of it
PALLAS_CORES = ("scalar_decay", "rotation")


def _poisoned(inp: dict, name: str) -> dict:
    out = dict(inp)
    arr = np.array(inp[name])
    # B/C are (b, t, g, n): head 1 reads group 0 (h = 4, g = 2)
    index = (0, BAD_POS, 0) if name in ("B", "C") else (0, BAD_POS, BAD_HEAD)
    arr[index] = np.nan
    out[name] = arr
    return out


def _bad_heads(state) -> np.ndarray:
    """(b, h): whether any leaf of the final state is non-finite for that head."""
    return np.any([~np.isfinite(np.asarray(leaf)).reshape(*np.shape(leaf)[:2], -1).all(-1)
                   for leaf in jax.tree.leaves(state)], axis=0)


def _assert_like_sequential(got, want, label: str) -> None:
    (y, final), (y_ref, final_ref) = got, want
    y, y_ref = np.asarray(y), np.asarray(y_ref)
    np.testing.assert_array_equal(np.isfinite(y), np.isfinite(y_ref), err_msg=f"{label}: non-finite outputs")
    assert np.isfinite(y[:, :BAD_POS]).all(), f"{label}: an output before the bad position is non-finite"
    np.testing.assert_allclose(y[:, :BAD_POS], y_ref[:, :BAD_POS], rtol=2e-4, atol=2e-5, err_msg=label)
    np.testing.assert_array_equal(_bad_heads(final), _bad_heads(final_ref), err_msg=f"{label}: final state")


def _inputs(core):
    inp = dict(cm.case_inputs(core, CASE))
    inp["init"] = None
    return inp


def _poisonable(core):
    names = ["x", "dt", "A", "B", "C"]
    if core in ("rotation", "damped"):
        names += ["theta", "trap"]
    return names


@pytest.mark.parametrize("core", cm.CORES)
def test_every_algorithm_keeps_the_past_clean(core):
    regime = "under" if core == "damped" else None
    algorithms = cm.EXPLICIT[core] + (("pallas",) if core in PALLAS_CORES else ())
    for name in _poisonable(core):
        inp = _poisoned(_inputs(core), name)
        want = cm.run_steps(core, inp, regime=regime)
        assert not np.isfinite(np.asarray(want[0])).all(), "the poisoned input changed nothing"
        for algorithm in algorithms:
            got = cm.run(core, inp, algorithm, CASE, regime=regime)
            _assert_like_sequential(got, want, f"{core}/{algorithm}, NaN in {name}")


def test_mimo_chunked_keeps_the_past_clean():
    case = mimo_tests.DEFAULT  # t = 37, chunks of 16
    for name in ("x", "dt", "B", "theta"):
        inp = dict(mimo_tests.case_inputs(case))
        arr = np.array(inp[name])
        arr[(0, 33, 0) if name == "B" else (0, 33, 1)] = np.nan
        inp[name] = arr
        want = mimo_tests.runner("sequential")(inp)  # lax.scan over rotation_mimo_step
        for got in (mimo_tests.runner("associative")(inp), mimo_tests.runner("chunked", case.chunk)(inp)):
            y, y_ref = np.asarray(got[0]), np.asarray(want[0])
            np.testing.assert_array_equal(np.isfinite(y), np.isfinite(y_ref), err_msg=f"mimo, NaN in {name}")
            assert np.isfinite(y[:, :33]).all()


@pytest.mark.parametrize("core", cm.CORES)
def test_finite_inputs_are_unchanged_by_the_guard(core):
    """The guard's where/cummax must not move a single bit of a clean run: the chunked form with the
    guard equals the bare chunked form."""
    import importlib

    module = importlib.import_module(f"ssmgate.cores.{core}")
    regime = "under" if core == "damped" else None
    inp = _inputs(core)
    guarded = cm.run(core, inp, "chunked", CASE, regime=regime)
    args = _module_args(core, inp)
    kw = {"regime": regime, "c": 0.9} if core == "damped" else {}
    bare = jax.jit(lambda *a: module._run_form("chunked", CASE.chunk, *a, **kw))(*args)
    np.testing.assert_array_equal(np.asarray(guarded[0]), np.asarray(bare[0]).astype(np.float32))


def _module_args(core, inp):
    """The positional arguments of the core's `_run_form` (zero initial state, as CASE has none)."""
    import jax.numpy as jnp

    from ssmgate import cores
    from ssmgate.cores._ssd import per_token

    b, t, h, p = inp["x"].shape
    n = inp["B"].shape[-1]
    A = per_token(jnp.asarray(inp["A"]), b, t, h)
    if core == "scalar_decay":
        return (inp["x"], inp["dt"], A, inp["B"], inp["C"], inp["D"], jnp.zeros((b, h, p, n)))
    if core == "rotation":
        state0 = cores.RotationState.zeros(b, h, p, n, inp["theta"].shape[-1])
        return (inp["x"], inp["dt"], A, inp["B"], inp["C"], inp["theta"], inp["trap"], inp["D"], state0)
    return (inp["x"], inp["dt"], A, inp["theta"], inp["B"], inp["C"], inp["trap"], inp["D"],
            cores.DampedState.zeros(b, h, p, n))
