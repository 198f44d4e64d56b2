"""Shared machinery for the core tests: input factories, cached jitted runners, comparisons.

Compilation dominates the cost of these tests on a 2-core CPU, so every jitted function is built
once per (core, algorithm, static options) by `runner` / `grad_runner` / `step_runner` (lru_cache)
and the tests reuse the same case shapes wherever they can: jax.jit then compiles each
(function, shapes, None-pattern) once per session, however many tests call it.

Cases (`Case`) are named shape/option bundles. A case's random inputs depend only on
(core, case, regime, seed), so the float64 reference of a case is computed once too.
"""
from __future__ import annotations

import dataclasses
import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from ssmgate import cores
from tests.cores import reference as ref

TWO_PI = 2.0 * np.pi
CORES = ("scalar_decay", "rotation", "damped")
PARALLEL = {"scalar_decay": ("associative", "chunked"), "rotation": ("associative", "chunked"),
            "damped": ("associative", "chunked")}
EXPLICIT = {k: ("sequential",) + v for k, v in PARALLEL.items()}  # every algorithm but 'auto'
REGIMES = ("under", "critical", "over")
CHUNKED = ("chunked", "pallas")  # the algorithms that take a chunk_size (pallas rounds it up to 2^k >= 16)
AUTO_WARNING = "ignore:ssmgate.cores. no measured auto table"  # for pytest.mark.filterwarnings


@dataclasses.dataclass(frozen=True)
class Case:
    """b, t, h, p, g, n: mamba_ssm axes; r: rotated pairs (theta/nu width).
    D, A_per_token, trap, init: whether D is given, A is (b, t, h) instead of (h,), the trapezoid
    weight is given (rotation/damped) and a random initial_state is given. chunk: chunk_size."""

    name: str
    b: int
    t: int
    h: int
    p: int
    g: int
    n: int
    r: int
    D: bool = True
    A_per_token: bool = True
    trap: bool = True
    init: bool = True
    chunk: int = 16


def full(t: int) -> Case:
    """Every option on: grouped B/C (1 < g < h), D, data-dependent A, trapezoid, initial state."""
    return Case(f"full{t}", b=2, t=t, h=4, p=3, g=2, n=8, r=2)


FULL_LENGTHS = (1, 63, 64, 65)
# t = 1000 with tiny dims (the float64 reference is python loops); g == h (per-head B/C).
LONG = Case("long1000", b=1, t=1000, h=2, p=2, g=2, n=4, r=1, chunk=64)
# Every option off: g = 1, no D, A per head, Euler, zero initial state; odd chunk not dividing t.
PLAIN = Case("plain48", b=2, t=48, h=4, p=3, g=1, n=8, r=2, D=False, A_per_token=False, trap=False,
             init=False, chunk=7)
REF_CASES = tuple(full(t) for t in FULL_LENGTHS) + (LONG, PLAIN)
SPLIT_CASE = full(65)
SPLIT_POINTS = (1, 2, 63, 64)  # the pieces have lengths 1, 2, 63, 64: compiled once for REF_CASES
TINY = Case("tiny9", b=2, t=9, h=2, p=2, g=1, n=4, r=1, chunk=4)  # vmap tests


def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _log_uniform(rng, lo, hi, shape):
    return np.exp(rng.uniform(np.log(lo), np.log(hi), shape))


def make_inputs(core: str, case: Case, rng: np.random.Generator, dtype=np.float32) -> dict:
    """Random inputs in realistic ranges: dt log-uniform in [1e-3, 1], A = -exp(U(-1, 1.5))
    (damped: a = exp(U(-1, 1.5))), theta/nu = pi tanh(normal), trap = sigmoid(normal).
    Returns a dict of numpy arrays in `dtype`; absent options are None."""
    b, t, h, p, g, n, r = case.b, case.t, case.h, case.p, case.g, case.n, case.r
    cast = lambda a: None if a is None else np.asarray(a, dtype=dtype)  # noqa: E731
    rate = np.exp(rng.uniform(-1.0, 1.5, (b, t, h) if case.A_per_token else (h,)))
    inp = {
        "x": rng.standard_normal((b, t, h, p)),
        "dt": _log_uniform(rng, 1e-3, 1.0, (b, t, h)),
        "A": rate if core == "damped" else -rate,
        "B": rng.standard_normal((b, t, g, n)),
        "C": rng.standard_normal((b, t, g, n)),
        "D": rng.standard_normal(h) if case.D else None,
    }
    if core in ("rotation", "damped"):
        inp["theta"] = np.pi * np.tanh(rng.standard_normal((b, t, h, r)))
        inp["trap"] = 1.0 / (1.0 + np.exp(-rng.standard_normal((b, t, h)))) if case.trap else None
    init = None
    if case.init:
        hs = rng.standard_normal((b, h, p, n))
        if core == "scalar_decay":
            init = hs
        elif core == "rotation":
            init = cores.RotationState(rng.uniform(0.0, TWO_PI, (b, h, r)), hs,
                                       rng.standard_normal((b, h, n)), rng.standard_normal((b, h, p)))
        else:
            init = cores.DampedState(hs, rng.standard_normal((b, h, n)), rng.standard_normal((b, h, p)))
    inp = {k: cast(v) for k, v in inp.items()}
    inp["init"] = None if init is None else jax.tree.map(cast, init)
    return inp


@functools.lru_cache(maxsize=None)
def case_inputs(core: str, case: Case, regime: str | None = None, seed: int = 0) -> dict:
    """Cached float32 inputs of a case (treat as read-only)."""
    return make_inputs(core, case, np.random.default_rng(seed_of(core, case, regime, seed)))


# ----------------------------------------------------------------------------- calling the cores

def call_core(core, inp, *, algorithm, chunk_size=None, regime=None, c=0.9):
    """The public core on an input dict (works on numpy arrays and on tracers)."""
    if core == "scalar_decay":
        return cores.scalar_decay(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], inp["D"],
                                  initial_state=inp["init"], algorithm=algorithm, chunk_size=chunk_size)
    if core == "rotation":
        return cores.rotation(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], inp["theta"], inp["D"],
                              trap=inp["trap"], initial_state=inp["init"], algorithm=algorithm,
                              chunk_size=chunk_size)
    return cores.damped(inp["x"], inp["dt"], inp["A"], inp["theta"], inp["B"], inp["C"], inp["D"],
                        regime=regime, overdamped_c=c, trap=inp["trap"], initial_state=inp["init"],
                        algorithm=algorithm, chunk_size=chunk_size)


@functools.lru_cache(maxsize=None)
def runner(core, algorithm, chunk_size=None, regime=None, c=0.9):
    """jax.jit of the core on an input dict, one object per static configuration."""
    return jax.jit(functools.partial(call_core, core, algorithm=algorithm, chunk_size=chunk_size,
                                     regime=regime, c=c))


def run(core, inp, algorithm, case: Case | None = None, regime=None, c=0.9, chunk_size=None):
    """Runs a case through the cached jitted runner; chunk_size defaults to the case's."""
    if chunk_size is None and algorithm in CHUNKED and case is not None:
        chunk_size = case.chunk
    if algorithm not in CHUNKED:
        chunk_size = None
    return runner(core, algorithm, chunk_size, regime if core == "damped" else None, c)(inp)


def projection_weights(y_shape, state, rng) -> dict:
    return {"y": rng.standard_normal(y_shape).astype(np.float32),
            "state": [rng.standard_normal(np.shape(leaf)).astype(np.float32) for leaf in jax.tree.leaves(state)]}


@functools.lru_cache(maxsize=None)
def grad_runner(core, algorithm, chunk_size=None, regime=None, c=0.9):
    """jit(grad) of <y, W_y> + sum_k <state_k, W_k> w.r.t. every input (a dict like the inputs);
    also returns (y, final_state) so one compiled function serves finiteness checks."""
    def loss(inp, proj):
        y, final = call_core(core, inp, algorithm=algorithm, chunk_size=chunk_size, regime=regime, c=c)
        total = jnp.sum(y * proj["y"])
        for leaf, w in zip(jax.tree.leaves(final), proj["state"]):
            total = total + jnp.sum(leaf * w)
        return total, (y, final)

    return jax.jit(jax.grad(loss, has_aux=True))


def call_step(core, state, tok, *, regime=None, c=0.9):
    if core == "scalar_decay":
        return cores.scalar_decay_step(state, tok["x"], tok["dt"], tok["A"], tok["B"], tok["C"], tok["D"])
    if core == "rotation":
        return cores.rotation_step(state, tok["x"], tok["dt"], tok["A"], tok["B"], tok["C"], tok["theta"],
                                   tok["D"], trap=tok["trap"])
    return cores.damped_step(state, tok["x"], tok["dt"], tok["A"], tok["theta"], tok["B"], tok["C"], tok["D"],
                             regime=regime, overdamped_c=c, trap=tok["trap"])


@functools.lru_cache(maxsize=None)
def step_runner(core, regime=None, c=0.9):
    return jax.jit(functools.partial(call_step, core, regime=regime, c=c))


def token(inp: dict, k: int) -> dict:
    """The inputs of token k in the step functions' shapes (A/a per head stays (h,))."""
    out = {}
    for key, v in inp.items():
        if key in ("D", "init") or v is None or (key == "A" and v.ndim == 1):
            out[key] = v
        else:
            out[key] = v[:, k]
    return out


def run_steps(core, inp, regime=None, c=0.9):
    """Runs the one-token step function over the whole sequence; returns (y, final_state)."""
    step = step_runner(core, regime if core == "damped" else None, c)
    state, ys = inp["init"], []
    for k in range(inp["x"].shape[1]):
        y, state = step(state, token(inp, k))
        ys.append(y)
    return jnp.stack(ys, axis=1), state


def time_slice(inp: dict, lo: int, hi: int, init) -> dict:
    """Tokens lo..hi-1 of a sequence with a new initial state."""
    out = {}
    for key, v in inp.items():
        if key in ("D", "init") or v is None or (key == "A" and v.ndim == 1):
            out[key] = v
        else:
            out[key] = v[:, lo:hi]
    out["init"] = init
    return out


# ----------------------------------------------------------------------------- reference

def reference_run(core, inp, regime=None, c=0.9):
    """float64 reference of tests/cores/reference.py: (y, state tuple in the cores' field order)."""
    if core == "scalar_decay":
        y, S = ref.scalar_decay(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], inp["D"], h0=inp["init"])
        return y, S
    if core == "rotation":
        return ref.rotation(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], inp["theta"], inp["D"],
                            trap=inp["trap"], state=inp["init"])
    return ref.damped(inp["x"], inp["dt"], inp["A"], inp["theta"], inp["B"], inp["C"], inp["D"], regime=regime,
                      c=c, trap=inp["trap"], state=inp["init"])


@functools.lru_cache(maxsize=None)
def case_reference(core: str, case: Case, regime: str | None = None, seed: int = 0):
    return reference_run(core, case_inputs(core, case, regime, seed), regime)


# ----------------------------------------------------------------------------- comparisons

def rel_err(got, want, *, angle: bool = False) -> float:
    """max|got - want| / max|want| in float64 (max|got - want| where want is all zero);
    angle=True compares phases modulo 2 pi. NaN/inf in `got` give inf."""
    got = np.asarray(got).astype(np.float64)
    want = np.asarray(want).astype(np.float64)
    assert got.shape == want.shape, f"shape {got.shape} != reference shape {want.shape}"
    if want.size == 0:
        return 0.0
    if not np.all(np.isfinite(got)):
        return float("inf")
    diff = got - want
    if angle:
        diff = np.mod(diff + np.pi, TWO_PI) - np.pi
    scale = np.max(np.abs(want))
    err = np.max(np.abs(diff))
    return float(err / scale) if scale > 0 else float(err)


STATE_FIELDS = {"scalar_decay": ("h",), "rotation": cores.RotationState._fields,
                "damped": cores.DampedState._fields}


def state_leaves(core, state):
    return [state] if core == "scalar_decay" else list(state)


def assert_close(core, got, want, tol, what=""):
    """got/want: (y, final_state) pairs; checks y and every state field to `tol`."""
    y_err = rel_err(got[0], want[0])
    errors = {"y": y_err}
    for name, g, w in zip(STATE_FIELDS[core], state_leaves(core, got[1]), state_leaves(core, want[1])):
        errors[f"state.{name}"] = rel_err(g, w, angle=(core == "rotation" and name == "phase"))
    bad = {k: v for k, v in errors.items() if not v <= tol}
    assert not bad, f"{what}: relative errors above {tol:g}: {bad} (all: {errors})"
    return errors


def assert_all_finite(tree, what=""):
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        arr = np.asarray(leaf, dtype=np.float64) if leaf is not None else None
        assert arr is None or np.all(np.isfinite(arr)), f"{what}: non-finite values in {jax.tree_util.keystr(path)}"
