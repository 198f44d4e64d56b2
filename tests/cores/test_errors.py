"""Bad input raises before any computation, with a message that names the offending argument."""
import numpy as np
import pytest

from ssmgate import cores
from ssmgate.cores.damped import transition
from tests.cores import common as cm

CASE = cm.Case("err", b=1, t=3, h=4, p=2, g=2, n=4, r=1)


def _inputs(core):
    return dict(cm.make_inputs(core, CASE, np.random.default_rng(0)))


def _call(core, inp, **kw):
    kw.setdefault("algorithm", "sequential")
    if core == "damped":
        kw.setdefault("regime", "under")
    return cm.call_core(core, inp, **kw)


# (argument named in the message, replacement inputs); shapes relative to CASE (b, t, h, p, g, n, r) =
# (1, 3, 4, 2, 2, 4, 1).
SHAPE_ERRORS = {
    "x": {"x": (1, 3, 4)},
    "dt": {"dt": (1, 3, 2)},
    "dt ": {"dt": (1, 4, 4)},
    "A": {"A": (3,)},
    "A ": {"A": (1, 3, 3)},
    "B": {"B": (1, 3, 2)},
    "B ": {"B": (1, 2, 2, 4), "C": (1, 2, 2, 4)},
    "C": {"C": (1, 3, 2, 5)},
    "C ": {"C": (1, 3, 1, 4)},
    "D": {"D": (3,)},
    "D ": {"D": (1, 4)},
}


@pytest.mark.parametrize("core", cm.CORES)
@pytest.mark.parametrize("arg", SHAPE_ERRORS)
def test_shape_mismatch_names_argument(core, arg):
    inp = _inputs(core)
    inp.update({k: np.zeros(v, np.float32) for k, v in SHAPE_ERRORS[arg].items()})
    name = arg.strip()
    if core == "damped" and name == "A":
        name = "a"  # the damped core calls the damping rate 'a'
    with pytest.raises(ValueError, match=f"argument '{name}'"):
        _call(core, inp)


@pytest.mark.parametrize("core", cm.CORES)
def test_empty_sequence(core):
    inp = _inputs(core)
    inp = cm.time_slice(inp, 0, 0, inp["init"])
    with pytest.raises(ValueError, match="argument 'x'.*t >= 1"):
        _call(core, inp)


@pytest.mark.parametrize("core", cm.CORES)
def test_heads_not_divisible_by_groups(core):
    inp = _inputs(core)
    inp["B"] = np.zeros((1, 3, 3, 4), np.float32)
    inp["C"] = np.zeros((1, 3, 3, 4), np.float32)
    with pytest.raises(ValueError, match=r"B/C have g = 3.*h = 4.*h % g == 0"):
        _call(core, inp)


@pytest.mark.parametrize("core", ["rotation", "damped"])
def test_too_many_pairs(core):
    inp = _inputs(core)
    inp["theta"] = np.zeros((1, 3, 4, 3), np.float32)  # r = 3 > n / 2 = 2
    name = "theta" if core == "rotation" else "nu"
    with pytest.raises(ValueError, match=f"argument '{name}'.*r <= n/2"):
        _call(core, inp)
    inp["theta"] = np.zeros((1, 3, 2, 1), np.float32)  # wrong heads
    with pytest.raises(ValueError, match=f"argument '{name}'"):
        _call(core, inp)


@pytest.mark.parametrize("core", ["rotation", "damped"])
def test_bad_trap(core):
    inp = _inputs(core)
    inp["trap"] = np.zeros((1, 3), np.float32)
    with pytest.raises(ValueError, match="argument 'trap'"):
        _call(core, inp)
    inp["trap"] = np.zeros((1, 3, 4), np.int32)
    with pytest.raises(TypeError, match="argument 'trap'"):
        _call(core, inp)


INT_ARGS = {"scalar_decay": ("x", "dt", "A", "B", "C", "D"),
            "rotation": ("x", "dt", "A", "B", "C", "theta", "D"),
            "damped": ("x", "dt", "A", "theta", "B", "C", "D")}
PUBLIC_NAME = {"damped": {"A": "a", "theta": "nu"}}


@pytest.mark.parametrize("core,arg", [(c, a) for c in cm.CORES for a in INT_ARGS[c]])
def test_integer_dtype_is_a_type_error(core, arg):
    inp = _inputs(core)
    inp[arg] = inp[arg].astype(np.int32)
    name = PUBLIC_NAME.get(core, {}).get(arg, arg)
    with pytest.raises(TypeError, match=f"argument '{name}'.*int32"):
        _call(core, inp)


@pytest.mark.parametrize("core", cm.CORES)
def test_python_list_is_a_type_error(core):
    inp = _inputs(core)
    inp["dt"] = inp["dt"].tolist()
    with pytest.raises(TypeError, match="argument 'dt'"):
        _call(core, inp)


@pytest.mark.parametrize("core", cm.CORES)
@pytest.mark.parametrize("algorithm", ["pallas_typo", "Sequential", ""])
def test_unknown_algorithm(core, algorithm):
    with pytest.raises(ValueError, match="unknown algorithm"):
        _call(core, _inputs(core), algorithm=algorithm)


@pytest.mark.parametrize("core", cm.CORES)
@pytest.mark.parametrize("chunk", [0, -4, 2.5, "16"])
def test_bad_chunk_size(core, chunk):
    with pytest.raises(ValueError, match="argument 'chunk_size'"):
        _call(core, _inputs(core), algorithm="chunked", chunk_size=chunk)


@pytest.mark.parametrize("regime", ["underdamped", "Over", None])
def test_unknown_regime(regime):
    with pytest.raises(ValueError, match="unknown regime"):
        _call("damped", _inputs("damped"), regime=regime)
    inp = _inputs("damped")
    with pytest.raises(ValueError, match="unknown regime"):
        cores.damped_step(None, *(cm.token(inp, 0)[k] for k in ("x", "dt", "A", "theta", "B", "C", "D")),
                          regime=regime)
    with pytest.raises(ValueError, match="unknown regime"):
        transition(inp["dt"], inp["A"], inp["theta"], regime=regime)


@pytest.mark.parametrize("c", [0.0, 1.0, 1.5, -0.2])
def test_overdamped_c_outside_open_unit_interval(c):
    with pytest.raises(ValueError, match="argument 'overdamped_c'"):
        _call("damped", _inputs("damped"), regime="over", c=c)
    inp = _inputs("damped")
    with pytest.raises(ValueError, match="argument 'overdamped_c'"):
        cores.damped_step(None, *(cm.token(inp, 0)[k] for k in ("x", "dt", "A", "theta", "B", "C", "D")),
                          regime="over", overdamped_c=c)


def _wrong_state_types(core, inp):
    b, h, p, n, r = CASE.b, CASE.h, CASE.p, CASE.n, CASE.r
    others = {"scalar_decay": [cores.RotationState.zeros(b, h, p, n, r), (np.zeros((b, h, p, n), np.float32),)],
              "rotation": [np.zeros((b, h, p, n), np.float32), cores.DampedState.zeros(b, h, p, n),
                           tuple(inp["init"])],
              "damped": [np.zeros((b, h, p, n), np.float32), cores.RotationState.zeros(b, h, p, n, r),
                         tuple(inp["init"])]}
    return others[core]


@pytest.mark.parametrize("core", cm.CORES)
def test_wrong_initial_state_type(core):
    inp = _inputs(core)
    for bad in _wrong_state_types(core, inp):
        with pytest.raises((TypeError, ValueError), match="argument 'initial_state"):
            _call(core, dict(inp, init=bad))


@pytest.mark.parametrize("core,field", [("scalar_decay", None)]
                         + [("rotation", f) for f in cores.RotationState._fields]
                         + [("damped", f) for f in cores.DampedState._fields])
def test_wrong_initial_state_shape_or_dtype(core, field):
    inp = _inputs(core)
    state = inp["init"]
    leaf = state if field is None else getattr(state, field)
    name = "initial_state" if field is None else f"initial_state.{field}"
    wrong_shape = np.zeros(leaf.shape[:-1] + (leaf.shape[-1] + 1,), np.float32)
    wrong_dtype = leaf.astype(np.int32)
    for bad, err in ((wrong_shape, ValueError), (wrong_dtype, TypeError)):
        new = bad if field is None else state._replace(**{field: bad})
        with pytest.raises(err, match=f"argument '{name}'"):
            _call(core, dict(inp, init=new))


# ----------------------------------------------------------------------------- step functions

@pytest.mark.parametrize("core", cm.CORES)
def test_step_shape_errors(core):
    inp = _inputs(core)
    tok = cm.token(inp, 0)
    step = lambda state, t: cm.call_step(core, state, t, regime="under")  # noqa: E731
    for arg, shape in (("x", (1, 4)), ("dt", (1, 3)), ("B", (2, 2, 4)), ("B", (1, 2)), ("C", (1, 2, 5)),
                       ("D", (2,))):
        with pytest.raises(ValueError, match=f"argument '{arg}'"):
            step(None, dict(tok, **{arg: np.zeros(shape, np.float32)}))
    with pytest.raises(TypeError, match="argument 'x'"):
        step(None, dict(tok, x=tok["x"].astype(np.int32)))
    with pytest.raises(ValueError, match=r"h % g == 0"):
        step(None, dict(tok, B=np.zeros((1, 3, 4), np.float32), C=np.zeros((1, 3, 4), np.float32)))
    if core != "scalar_decay":
        name = "theta" if core == "rotation" else "nu"
        with pytest.raises(ValueError, match=f"argument '{name}'.*r <= n/2"):
            step(None, dict(tok, theta=np.zeros((1, 4, 3), np.float32)))
        with pytest.raises(ValueError, match="argument 'trap'"):
            step(None, dict(tok, trap=np.zeros((1, 3), np.float32)))


@pytest.mark.parametrize("core", cm.CORES)
def test_step_wrong_state_names_state(core):
    """The step functions call their state argument `state`; errors about it must say so."""
    inp = _inputs(core)
    tok = cm.token(inp, 0)
    step = lambda state: cm.call_step(core, state, tok, regime="under")  # noqa: E731
    for bad in _wrong_state_types(core, inp):
        with pytest.raises((TypeError, ValueError), match="argument 'state"):
            step(bad)
    leaves = cm.state_leaves(core, inp["init"])
    first = leaves[0]
    bad_leaf = np.zeros(first.shape[:-1] + (first.shape[-1] + 1,), np.float32)
    bad = bad_leaf if core == "scalar_decay" else inp["init"]._replace(**{inp["init"]._fields[0]: bad_leaf})
    with pytest.raises(ValueError, match="argument 'state"):
        step(bad)
