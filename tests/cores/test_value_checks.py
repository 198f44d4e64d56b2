"""The cores' optional value checks: dt >= 0, every decay <= 1, the trapezoid weight in [0, 1].

Off by default (they read the data); `check_values=True` or SSMGATE_CHECK_CORE_VALUES=1 turns them on.
A bad value is named with its index, eagerly as a ValueError and under jit through JAX's runtime error.
"""
import jax
import numpy as np
import pytest

from ssmgate import cores
from ssmgate.cores import _checks
from tests.cores import common as cm
from tests.cores import test_mimo as mimo_tests

CASE = cm.Case("values", b=1, t=5, h=2, p=2, g=1, n=4, r=1, chunk=4, init=False)
SEQUENCE_CORES = {
    "scalar_decay": lambda inp, **kw: cores.scalar_decay(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], **kw),
    "scalar_decay_state": lambda inp, **kw: cores.scalar_decay_state(inp["x"], inp["dt"], inp["A"], inp["B"], **kw),
    "rotation": lambda inp, **kw: cores.rotation(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], inp["theta"],
                                                 trap=inp["trap"], **kw),
    "damped": lambda inp, **kw: cores.damped(inp["x"], inp["dt"], inp["A"], inp["theta"], inp["B"], inp["C"],
                                             regime="under", trap=inp["trap"], **kw),
}
STEP_CORES = {
    "scalar_decay_step": lambda tok, **kw: cores.scalar_decay_step(None, tok["x"], tok["dt"], tok["A"], tok["B"],
                                                                   tok["C"], **kw),
    "rotation_step": lambda tok, **kw: cores.rotation_step(None, tok["x"], tok["dt"], tok["A"], tok["B"], tok["C"],
                                                           tok["theta"], trap=tok["trap"], **kw),
    "damped_step": lambda tok, **kw: cores.damped_step(None, tok["x"], tok["dt"], tok["A"], tok["theta"], tok["B"],
                                                       tok["C"], regime="under", trap=tok["trap"], **kw),
}


def _inputs(name):
    base = name.replace("_state", "").replace("_step", "")
    return dict(cm.case_inputs("damped" if base == "damped" else ("rotation" if base == "rotation" else
                                                                   "scalar_decay"), CASE))


def _at(index) -> str:
    return r"at index \(" + ", ".join(map(str, index)) + r"\)"


def _bad_cases(name, step: bool):
    """(argument, index in the sequence inputs, value, pattern of the expected message); a step core
    sees token index[1], so its message names (b, h)."""
    rate = "a" if name.startswith("damped") else "A"
    cases = [("dt", (0, 3, 1), -0.25, "'dt' has value -0.25 {at}; expected finite and >= 0"),
             ("dt", (0, 1, 0), np.inf, "'dt' has value inf {at}"),
             ("A", (0, 2, 1), 0.5 if rate == "A" else -0.5, f"'{rate}' has value -?0.5 {{at}}")]
    if not name.startswith("scalar_decay"):
        cases.append(("trap", (0, 4, 0), 1.5, r"'trap' has value 1.5 {at}; expected in \[0, 1\]"))
    return [(arg, index, value, f"{name}: argument " + message.format(at=_at(index[:1] + index[2:] if step else index)))
            for arg, index, value, message in cases]


def _with(inp, arg, index, value, step: bool):
    arr = np.array(inp[arg])
    arr[index] = value
    out = dict(inp, **{arg: arr})
    return cm.token(out, index[1]) if step else out


def _call(name, inp, **kw):
    fn = SEQUENCE_CORES.get(name) or STEP_CORES[name]
    return fn(inp, **kw)


ALL = tuple(SEQUENCE_CORES) + tuple(STEP_CORES)


@pytest.mark.parametrize("name", ALL)
def test_bad_values_are_named_when_checks_are_on(name):
    step = name in STEP_CORES
    for arg, index, value, message in _bad_cases(name, step):
        inp = _with(_inputs(name), arg, index, value, step)
        with pytest.raises(ValueError, match=message):
            _call(name, inp, check_values=True)
        _call(name, inp, check_values=False)  # off: computed, whatever comes out


@pytest.mark.parametrize("name", ("scalar_decay", "rotation"))
def test_bad_values_raise_under_jit_and_vmap(name):
    inp = _inputs(name)
    good_dt = inp["dt"]
    bad_dt = np.array(good_dt)
    bad_dt[0, 3, 1] = -0.25

    def run(dt):
        return _call(name, dict(inp, dt=dt), check_values=True)[0]

    jax.block_until_ready(jax.jit(run)(good_dt))  # clean inputs pass
    with pytest.raises(Exception, match=r"'dt' has value -0.25 at index \(0, 3, 1\)"):
        jax.block_until_ready(jax.jit(run)(bad_dt))
    with pytest.raises(Exception, match=r"'dt' has value -0.25 at index \(0, 3, 1\)"):
        jax.block_until_ready(jax.vmap(run)(np.stack([good_dt, bad_dt])))


def test_checks_are_off_by_default_and_the_environment_turns_them_on(monkeypatch):
    inp = _with(_inputs("scalar_decay"), "dt", (0, 3, 1), -0.25, step=False)
    monkeypatch.delenv(_checks.VALUE_CHECKS_ENV, raising=False)
    _call("scalar_decay", inp)  # a negative step size is the caller's business unless asked
    monkeypatch.setenv(_checks.VALUE_CHECKS_ENV, "1")
    with pytest.raises(ValueError, match="'dt' has value -0.25"):
        _call("scalar_decay", inp)
    _call("scalar_decay", inp, check_values=False)  # the argument wins over the environment


def test_mimo_checks_its_values():
    inp = dict(mimo_tests.case_inputs(mimo_tests.PLAIN))
    A = np.array(inp["A"])
    A[1] = 0.3
    with pytest.raises(ValueError, match=r"rotation_mimo: argument 'A' has value 0.3.* at index \(1,\)"):
        cores.rotation_mimo(inp["x"], inp["dt"], A, inp["B"], inp["C"], inp["theta"], check_values=True)
    tok = {k: (v if k in ("A", "D", "init") or v is None else v[:, 0]) for k, v in inp.items()}
    with pytest.raises(ValueError, match="rotation_mimo_step: argument 'A'"):
        cores.rotation_mimo_step(None, tok["x"], tok["dt"], A, tok["B"], tok["C"], tok["theta"], check_values=True)
