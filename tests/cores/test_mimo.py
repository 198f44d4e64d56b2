"""rotation_mimo (protocol §1.3.3, Mamba-3 MIMO of rank R): every algorithm against the float64
reference (outputs, final states, gradients vs sequential), odd lengths and chunk sizes, split runs,
the step loop, R = 1 against the SISO `rotation`, the superposition of SISO runs it is, bad shapes,
half-precision inputs and `auto`.

Compilation dominates on a 2-core CPU: every jitted function is built once per static
configuration (lru_cache) and the cases share shapes wherever they can.
"""
from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssmgate import cores
from ssmgate.cores import auto, mimo
from tests.cores import checks
from tests.cores import common as cm
from tests.cores import reference as ref

CORE = "rotation_mimo"
ALGS = ("sequential", "associative", "chunked")
PARALLEL = ("associative", "chunked")
FIELDS = cores.MimoState._fields
SISO_TOL = 1e-6  # R = 1 vs rotation: the same sums, in another order at most


@dataclasses.dataclass(frozen=True)
class Case:
    """b, t, h, R, p, g, n, r: axes (R the rank, r the rotated pairs). D, A_per_token, trap, init:
    whether D is given, A is (b, t, h), the trapezoid weight is given and a random initial state is
    given. chunk: chunk_size of `chunked` (None: the default max(8, 64 // R))."""

    name: str
    b: int
    t: int
    h: int
    R: int
    p: int
    g: int
    n: int
    r: int
    D: bool = True
    A_per_token: bool = True
    trap: bool = True
    init: bool = True
    chunk: int | None = 4


FULL = Case("full13", b=2, t=13, h=4, R=3, p=3, g=2, n=8, r=2)  # 3 chunks + 1 token; 1 < g < h
ONE = dataclasses.replace(FULL, name="full1", t=1)
# Every option off: g = 1, no D, A per head, Euler, zero initial state; chunk 3 does not divide t.
PLAIN = Case("plain10", b=2, t=10, h=4, R=2, p=3, g=1, n=8, r=2, D=False, A_per_token=False, trap=False,
             init=False, chunk=3)
# The default chunk (R = 4: 16 tokens) over 3 chunks, the last one partial; g == h, half the pairs rotated.
DEFAULT = Case("default37", b=1, t=37, h=2, R=4, p=2, g=2, n=8, r=2)
REF_CASES = (FULL, ONE, PLAIN, DEFAULT)
SPLIT_POINTS = (1, 12)  # pieces 1 + 12 and 12 + 1 of FULL: the 12 after the split chunk the whole run as 1+4+4+4


def make_inputs(case: Case, rng: np.random.Generator, dtype=np.float32) -> dict:
    """Random inputs in the ranges of tests/cores/common.py: dt log-uniform in [1e-3, 1],
    A = -exp(U(-1, 1.5)), theta = pi tanh(normal), trap = sigmoid(normal)."""
    b, t, h, R, p, g, n, r = case.b, case.t, case.h, case.R, case.p, case.g, case.n, case.r
    inp = {
        "x": rng.standard_normal((b, t, h, R, p)),
        "dt": np.exp(rng.uniform(np.log(1e-3), 0.0, (b, t, h))),
        "A": -np.exp(rng.uniform(-1.0, 1.5, (b, t, h) if case.A_per_token else (h,))),
        "B": rng.standard_normal((b, t, g, R, n)),
        "C": rng.standard_normal((b, t, g, R, n)),
        "theta": np.pi * np.tanh(rng.standard_normal((b, t, h, r))),
        "D": rng.standard_normal(h) if case.D else None,
        "trap": 1.0 / (1.0 + np.exp(-rng.standard_normal((b, t, h)))) if case.trap else None,
    }
    inp = {k: None if v is None else np.asarray(v, dtype) for k, v in inp.items()}
    inp["init"] = None
    if case.init:
        inp["init"] = cores.MimoState(*(np.asarray(a, dtype) for a in (
            rng.uniform(0.0, cm.TWO_PI, (b, h, r)), rng.standard_normal((b, h, p, n)),
            rng.standard_normal((b, h, R, n)), rng.standard_normal((b, h, R, p)))))
    return inp


@functools.lru_cache(maxsize=None)
def case_inputs(case: Case, seed: int = 0) -> dict:
    return make_inputs(case, np.random.default_rng(cm.seed_of(CORE, case, seed)))


def call(inp, *, algorithm, chunk_size=None):
    return cores.rotation_mimo(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], inp["theta"], inp["D"],
                               trap=inp["trap"], initial_state=inp["init"], algorithm=algorithm,
                               chunk_size=chunk_size)


@functools.lru_cache(maxsize=None)
def runner(algorithm, chunk_size=None):
    return jax.jit(functools.partial(call, algorithm=algorithm, chunk_size=chunk_size))


def run(inp, algorithm, case: Case):
    return runner(algorithm, case.chunk if algorithm == "chunked" else None)(inp)


def reference(inp):
    return ref.rotation_mimo(*(inp[k] for k in ("x", "dt", "A", "B", "C", "theta", "D")), trap=inp["trap"],
                             state=inp["init"])


@functools.lru_cache(maxsize=None)
def case_reference(case: Case):
    return reference(case_inputs(case))


def errors(got, want) -> dict:
    """Relative errors of y and every state field (phases modulo 2 pi)."""
    out = {"y": cm.rel_err(got[0], want[0])}
    for name, g, w in zip(FIELDS, got[1], want[1]):
        out[f"state.{name}"] = cm.rel_err(g, w, angle=(name == "phase"))
    return out


def assert_close(got, want, tol, what):
    errs = errors(got, want)
    bad = {k: v for k, v in errs.items() if not v <= tol}
    assert not bad, f"{what}: relative errors above {tol:g}: {bad} (all: {errs})"


def time_slice(inp, lo, hi, init):
    out = {k: v if k in ("D", "init") or v is None or (k == "A" and v.ndim == 1) else v[:, lo:hi]
           for k, v in inp.items()}
    out["init"] = init
    return out


# ----------------------------------------------------------------------------- against the reference

@pytest.mark.parametrize("case", REF_CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("algorithm", ALGS)
def test_matches_reference(algorithm, case):
    got = run(case_inputs(case), algorithm, case)
    chex.assert_shape(got[0], (case.b, case.t, case.h, case.R, case.p))
    assert_close(got, case_reference(case), checks.REF_TOL, f"{algorithm} on {case.name} vs float64 reference")


@pytest.mark.parametrize("k", SPLIT_POINTS)
@pytest.mark.parametrize("algorithm", ALGS)
def test_split_equals_whole(algorithm, k):
    """run(0..k), then run(k..t) from its final state == run(0..t): the carried (phase, h, B~_T, x_T)."""
    inp = case_inputs(FULL)
    whole = run(inp, algorithm, FULL)
    y1, s1 = run(time_slice(inp, 0, k, inp["init"]), algorithm, FULL)
    y2, s2 = run(time_slice(inp, k, FULL.t, s1), algorithm, FULL)
    split = (jnp.concatenate([y1, y2], axis=1), s2)
    assert_close(split, whole, checks.REF_TOL, f"{algorithm} split at {k}")
    assert_close(split, case_reference(FULL), checks.REF_TOL, f"{algorithm} split at {k} vs reference")


@pytest.mark.parametrize("case", [FULL, PLAIN], ids=lambda c: c.name)
def test_step_loop_equals_sequence(case):
    inp = case_inputs(case)
    step = jax.jit(lambda state, tok: cores.rotation_mimo_step(
        state, tok["x"], tok["dt"], tok["A"], tok["B"], tok["C"], tok["theta"], tok["D"], trap=tok["trap"]))
    state, ys = inp["init"], []
    for k in range(case.t):
        y, state = step(state, cm.token(inp, k))
        ys.append(y)
    stepped = (jnp.stack(ys, axis=1), state)
    assert_close(stepped, case_reference(case), checks.REF_TOL, "step loop vs reference")
    for algorithm in PARALLEL:
        assert_close(stepped, run(inp, algorithm, case), checks.PAIR_TOL, f"step loop vs {algorithm}")


# ----------------------------------------------------------------------------- gradients

def _loss(algorithm, chunk, inp, proj):
    y, final = call(inp, algorithm=algorithm, chunk_size=chunk)
    total = jnp.sum(y * proj["y"])
    for leaf, w in zip(final, proj["state"]):
        total = total + jnp.sum(leaf * w)
    return total, (y, final)


@functools.lru_cache(maxsize=None)
def grad_runner(algorithm, chunk=None):
    return jax.jit(jax.grad(functools.partial(_loss, algorithm, chunk), has_aux=True))


def _grad_inputs(rng, extreme=False):
    inp = make_inputs(FULL, rng)
    if extreme:  # dt |A| log-uniform in [1e-6, 50], both ends present
        prod = np.exp(rng.uniform(np.log(1e-6), np.log(50.0), inp["dt"].shape))
        prod[:, 0], prod[:, 1], prod[:, -2], prod[:, -1] = 1e-6, 50.0, 1e-6, 50.0
        inp["A"] = (-prod / inp["dt"]).astype(np.float32)
    proj = cm.projection_weights((FULL.b, FULL.t, FULL.h, FULL.R, FULL.p), inp["init"], rng)
    return inp, proj


def _leaves(grads):
    return {jax.tree_util.keystr(path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(grads)[0]}


@pytest.mark.parametrize("extreme", [False, True], ids=["normal", "extreme_decays"])
@pytest.mark.parametrize("algorithm", PARALLEL)
def test_gradients_match_sequential(algorithm, extreme, rng):
    """Gradients w.r.t. every input (x, dt, A, B, C, theta, D, trap, every initial_state field) of a
    random projection of y and the final state. extreme: dt |A| over [1e-6, 50], everything finite."""
    inp, proj = _grad_inputs(rng, extreme)
    want, (y_seq, _) = grad_runner("sequential")(inp, proj)
    got, (y, final) = grad_runner(algorithm, FULL.chunk if algorithm == "chunked" else None)(inp, proj)
    cm.assert_all_finite((got, y, final), f"{algorithm} gradients and outputs")
    assert cm.rel_err(y, y_seq) <= checks.PAIR_TOL
    if extreme:
        assert_close((y, final), reference(inp), checks.REF_TOL, "extreme decays vs reference")
    want, got = _leaves(want), _leaves(got)
    expected = {f"['{k}']" for k in ("x", "dt", "A", "B", "C", "theta", "D", "trap")}
    assert expected <= set(want), f"missing gradients: {expected - set(want)}"
    assert len([k for k in want if k.startswith("['init']")]) == len(FIELDS)
    errs = {}
    for name, w in want.items():
        assert np.max(np.abs(w)) > 0, f"sequential gradient of {name} is identically zero"
        errs[name] = cm.rel_err(got[name], w)
    bad = {k: v for k, v in errs.items() if not v <= checks.GRAD_TOL}
    assert not bad, f"{algorithm}: gradient errors vs sequential above {checks.GRAD_TOL}: {bad}"


# ----------------------------------------------------------------------------- against SISO rotation

def _siso(inp):
    """The rank axis of size 1 dropped: rotation's inputs and initial state."""
    out = dict(inp, x=inp["x"][:, :, :, 0], B=inp["B"][:, :, :, 0], C=inp["C"][:, :, :, 0])
    s = inp["init"]
    out["init"] = cores.RotationState(s.phase, s.h, s.B_prev[:, :, 0], s.x_prev[:, :, 0])
    return out


@pytest.mark.parametrize("algorithm", ALGS)
def test_rank_one_equals_rotation(algorithm):
    """R = 1 (every option on) is the SISO core: y, every state field and the step, to 1e-6."""
    case = dataclasses.replace(FULL, name="rank1", R=1)
    inp = case_inputs(case)
    siso = _siso(inp)
    y, s = run(inp, algorithm, case)
    chunk = case.chunk if algorithm == "chunked" else None
    y1, s1 = cm.runner("rotation", algorithm, chunk)(siso)
    got = (y[:, :, :, 0], cores.RotationState(s.phase, s.h, s.B_prev[:, :, 0], s.x_prev[:, :, 0]))
    cm.assert_close("rotation", got, (y1, s1), SISO_TOL, f"{algorithm}: R = 1 vs rotation")
    # the default chunk at R = 1 is rotation's 64
    assert mimo.default_chunk_size(1) == 64
    if algorithm == "sequential":
        tok = cm.token(inp, 0)
        ym, sm = cores.rotation_mimo_step(inp["init"], *(tok[k] for k in ("x", "dt", "A", "B", "C", "theta", "D")),
                                          trap=tok["trap"])
        ys, ss = cm.call_step("rotation", siso["init"], cm.token(siso, 0))
        assert cm.rel_err(ym[:, :, 0], ys) <= SISO_TOL and cm.rel_err(sm.h, ss.h) <= SISO_TOL


def test_superposition_of_siso_runs():
    """The state is linear in the writes, so y_{k'} = sum_k (SISO run writing x_k B_k, reading C_k')
    + D x_{k'}: R^2 rotation runs (trapezoid included, zero initial state) give the MIMO outputs."""
    case = dataclasses.replace(PLAIN, name="superpose", trap=True, D=True)
    inp = case_inputs(case)
    y, _ = run(inp, "sequential", case)
    siso = cm.runner("rotation", "sequential")
    want = np.zeros(y.shape, np.float64)
    for k_read in range(case.R):
        for k_write in range(case.R):
            part = dict(inp, x=inp["x"][:, :, :, k_write], B=inp["B"][:, :, :, k_write],
                        C=inp["C"][:, :, :, k_read], D=None)
            want[:, :, :, k_read] += np.asarray(siso(part)[0], np.float64)
        want[:, :, :, k_read] += inp["D"][:, None] * inp["x"][:, :, :, k_read]
    assert cm.rel_err(y, want) <= checks.PAIR_TOL
    # and the ranks do mix: dropping the cross terms (k != k') changes y by far more
    diag = sum(np.asarray(siso(dict(inp, x=inp["x"][:, :, :, k], B=inp["B"][:, :, :, k],
                                    C=inp["C"][:, :, :, k], D=None))[0]) for k in range(case.R))
    assert cm.rel_err(np.asarray(y).sum(3) - (inp["D"][:, None] * inp["x"].sum(3)), diag) > 1e-2


# ----------------------------------------------------------------------------- dtypes and auto

@pytest.mark.parametrize("algorithm", ALGS)
def test_bf16_inputs_float32_state(algorithm):
    """bf16 inputs: y in bf16, the final state in float32, close to the fp32 run on the same inputs."""
    inp32 = case_inputs(FULL)
    inp = jax.tree.map(lambda a: np.asarray(a).astype(jnp.bfloat16), inp32)
    y, final = run(inp, algorithm, FULL)
    assert y.dtype == jnp.bfloat16
    for name, leaf in zip(FIELDS, final):
        assert leaf.dtype == jnp.float32, f"final_state.{name} has dtype {leaf.dtype}"
    eps = float(jnp.finfo(jnp.bfloat16).eps)
    assert_close((y, final), run(inp32, algorithm, FULL), 4 * eps, "bf16 vs fp32 run")
    # exactly what float32 gives on the rounded inputs: the state to REF_TOL, y to its output rounding
    want_y, want_state = reference(jax.tree.map(lambda a: np.asarray(a, np.float32), inp))
    assert cm.rel_err(y, want_y) <= eps / 2 + checks.REF_TOL
    assert_close((want_y, final), (want_y, want_state), checks.REF_TOL, "bf16 state vs reference")


def test_auto_without_measurements_runs_chunked_default(monkeypatch):
    """No measured 'rotation_mimo' entry for the backend: auto is chunked at max(8, 64 // R)."""
    monkeypatch.setattr(auto, "load_table", lambda: {})
    assert not mimo.auto_is_measured()
    inp = case_inputs(FULL)
    got = runner("auto")(inp)
    want = runner("chunked", None)(inp)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    assert_close(got, case_reference(FULL), checks.REF_TOL, "auto vs reference")


def test_auto_uses_measured_choices(monkeypatch, rng):
    """Once measured, auto goes through auto.run_auto: forward by its forward choice (sequential
    here, bit-identical), gradients by its training choice (chunked)."""
    monkeypatch.setattr(mimo, "auto_is_measured", lambda backend=None: True)
    monkeypatch.setattr(auto, "choose", lambda c, t, state_size=None, backend=None:
                        (("sequential", None), ("chunked", FULL.chunk)))
    inp, proj = _grad_inputs(rng)
    y_auto, _ = jax.jit(functools.partial(call, algorithm="auto"))(inp)
    np.testing.assert_array_equal(np.asarray(y_auto), np.asarray(runner("sequential")(inp)[0]))
    g_auto, _ = jax.jit(jax.grad(functools.partial(_loss, "auto", None), has_aux=True))(inp, proj)
    g_chunk, _ = grad_runner("chunked", FULL.chunk)(inp, proj)
    chex.assert_trees_all_close(g_auto, g_chunk, rtol=1e-6, atol=1e-6)  # names the leaf that differs


# ----------------------------------------------------------------------------- errors

ERR = Case("err", b=1, t=3, h=4, R=2, p=2, g=2, n=4, r=1)
# (argument named in the message, replacement shapes), relative to ERR (b, t, h, R, p, g, n, r) =
# (1, 3, 4, 2, 2, 2, 4, 1).
SHAPE_ERRORS = {
    "x": {"x": (1, 3, 4, 2)},                 # the rank axis missing
    "dt": {"dt": (1, 3, 2)},
    "A": {"A": (3,)},
    "A ": {"A": (1, 3, 3)},
    "B": {"B": (1, 3, 2, 4)},                 # SISO-shaped B
    "B ": {"B": (1, 3, 2, 3, 4)},             # rank 3 vs x's 2
    "C": {"C": (1, 3, 2, 2, 5)},
    "D": {"D": (3,)},
    "theta": {"theta": (1, 3, 4, 3)},         # r = 3 > n / 2
    "trap": {"trap": (1, 3)},
}


def _err_inputs():
    return make_inputs(ERR, np.random.default_rng(0))


@pytest.mark.parametrize("arg", SHAPE_ERRORS)
def test_bad_shape_names_argument(arg):
    inp = _err_inputs()
    inp.update({k: np.zeros(v, np.float32) for k, v in SHAPE_ERRORS[arg].items()})
    with pytest.raises(ValueError, match=f"argument '{arg.strip()}'"):
        call(inp, algorithm="sequential")


def test_bad_arguments_messages():
    inp = _err_inputs()
    with pytest.raises(ValueError, match=r"argument 'B' has shape \(1, 3, 2, 3, 4\); expected \(b, t, g, R, n\) = "
                                         r"\(1, 3, 2, 2, 4\)"):
        call(dict(inp, B=np.zeros((1, 3, 2, 3, 4), np.float32)), algorithm="chunked")
    with pytest.raises(ValueError, match=r"B/C have g = 3.*h = 4.*h % g == 0"):
        call(dict(inp, B=np.zeros((1, 3, 3, 2, 4), np.float32), C=np.zeros((1, 3, 3, 2, 4), np.float32)),
             algorithm="chunked")
    with pytest.raises(ValueError, match="argument 'x'.*t >= 1"):
        call(time_slice(inp, 0, 0, inp["init"]), algorithm="sequential")
    with pytest.raises(ValueError, match="argument 'x'.*R >= 1"):
        call(dict(inp, x=np.zeros((1, 3, 4, 0, 2), np.float32)), algorithm="sequential")
    with pytest.raises(TypeError, match="argument 'x'.*int32"):
        call(dict(inp, x=inp["x"].astype(np.int32)), algorithm="sequential")
    with pytest.raises(ValueError, match="unknown algorithm"):
        call(inp, algorithm="pallas_typo")
    with pytest.raises(ValueError, match="argument 'chunk_size'"):
        call(inp, algorithm="chunked", chunk_size=0)


def test_bad_states_name_the_state():
    inp = _err_inputs()
    s = inp["init"]
    siso = cores.RotationState(s.phase, s.h, s.B_prev[:, :, 0], s.x_prev[:, :, 0])
    with pytest.raises(TypeError, match="argument 'initial_state' is a RotationState; expected a MimoState"):
        call(dict(inp, init=siso), algorithm="sequential")
    for field in FIELDS:
        leaf = getattr(s, field)
        bad = s._replace(**{field: np.zeros(leaf.shape[:-1] + (leaf.shape[-1] + 1,), np.float32)})
        with pytest.raises(ValueError, match=f"argument 'initial_state.{field}'"):
            call(dict(inp, init=bad), algorithm="sequential")
    tok = cm.token(inp, 0)
    args = [tok[k] for k in ("x", "dt", "A", "B", "C", "theta", "D")]
    with pytest.raises(TypeError, match="argument 'state' is a RotationState"):
        cores.rotation_mimo_step(siso, *args, trap=tok["trap"])
    bad = s._replace(B_prev=np.zeros((1, 4, 3, 4), np.float32))
    with pytest.raises(ValueError, match=r"argument 'state.B_prev' has shape \(1, 4, 3, 4\); expected \(b, h, R, n\)"):
        cores.rotation_mimo_step(bad, *args, trap=tok["trap"])
    for arg, shape in (("x", (1, 4, 2)), ("dt", (1, 3)), ("B", (1, 2, 4)), ("C", (1, 2, 2, 5)), ("D", (2,)),
                       ("theta", (1, 4, 3)), ("trap", (1, 3))):
        new = dict(tok, **{arg: np.zeros(shape, np.float32)})
        with pytest.raises(ValueError, match=f"argument '{arg}'"):
            cores.rotation_mimo_step(None, *(new[k] for k in ("x", "dt", "A", "B", "C", "theta", "D")),
                                     trap=new["trap"])
