"""`algorithm="auto"`: the fastest algorithm per backend and size class, as measured.

The table `auto_table.json` beside this file is written by `python -m ssmgate.bench cores
--write_auto_table` on a machine of the backend it describes; nothing here times code at call
time. A size class is a range of the sequence length t (the axis the algorithms differ on) within a
width class, a range of the per-head state size p·n: the best chunk depends on both (on CPU a
16 x 16 state trains fastest with chunks of 16-32, a 64 x 64 state with 32-64). Each entry holds
two measured choices: `forward`, the fastest forward pass, and `train`, the fastest
forward+backward. They differ on CPU, where `sequential` is the fastest forward pass and the
slowest to differentiate. `run_auto` evaluates with the forward choice and, through a custom VJP,
differentiates with the training choice (whose own forward pass then runs instead), so inference
and training each get their fastest algorithm. A custom VJP has no forward-mode derivative: for
`jax.jvp`/`jax.jacfwd` pick an explicit algorithm.

A backend with no measurements uses ESTIMATED where it has a rule from the compiler's estimates
(TPU: the Pallas kernel, docs/benchmarks.md "auto on TPU"), else FALLBACK, and warns once either
way; docs/benchmarks.md says how to measure it. The choice is made when a core is traced, for
`jax.default_backend()`; code compiled ahead of time for another platform (TPU topologies on a
CPU host) traces inside `for_backend(...)` to get that platform's choice.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import pathlib
import warnings

import jax

TABLE_PATH = pathlib.Path(__file__).with_name("auto_table.json")
# Used only for a backend the table does not cover (forward choice, training choice).
FALLBACK = {"scalar_decay": (("chunked", 64), ("chunked", 64)),
            "rotation": (("chunked", 64), ("chunked", 64)),
            "damped": (("associative", None), ("associative", None))}
# Backends without measured rows whose choice comes from the compiler's estimates at the models'
# shapes, to be replaced by a measured table. On TPU the kernel moves a small fraction of the
# chunked form's HBM bytes for the same matmuls; a length whose kernel would not fit VMEM runs
# the chunked form with the same chunk (ssmgate/cores/pallas/tpu_vmem.py).
ESTIMATED = {"tpu": {"scalar_decay": (("pallas", 64), ("pallas", 64)),
                     "rotation": (("pallas", 64), ("pallas", 64))}}
_TARGET = contextvars.ContextVar("ssmgate_auto_backend", default=None)


@contextlib.contextmanager
def for_backend(backend: str):
    """Cores traced inside choose for `backend` instead of jax.default_backend()."""
    token = _TARGET.set(backend)
    try:
        yield
    finally:
        _TARGET.reset(token)


@functools.lru_cache(maxsize=None)
def load_table(path: str = str(TABLE_PATH)) -> dict:
    p = pathlib.Path(path)
    if not p.exists():
        return {}
    return json.loads(p.read_text())


@functools.lru_cache(maxsize=None)
def _warn_unmeasured(backend: str, core: str, using: str) -> None:
    warnings.warn(
        f"ssmgate.cores: no measured auto table for backend {backend!r} and core {core!r}; using {using}. Run "
        "`python -m ssmgate.bench cores --write_auto_table` on this machine to measure it.", stacklevel=4)


def _width_key(entry: dict):
    w = entry.get("max_state")   # absent (a table measured at one width) = no bound
    return (w is None, w or 0)


def choose(core: str, t: int, state_size: int | None = None, backend: str | None = None):
    """Returns ((forward algorithm, chunk), (training algorithm, chunk)) for sequence length t and
    per-head state size p·n (None: the widest class)."""
    backend = backend or _TARGET.get() or jax.default_backend()
    classes = load_table().get(backend, {}).get(core)
    if not classes:
        estimated = ESTIMATED.get(backend, {}).get(core)
        choice = estimated or FALLBACK[core]
        _warn_unmeasured(backend, core, f"the compiler-estimated choice {choice[1]} (docs/benchmarks.md)"
                         if estimated else str(choice[1]))
        return choice
    widths = sorted({_width_key(c) for c in classes})
    if not widths[-1][0]:
        raise ValueError(f"{TABLE_PATH}: the {backend}/{core} width classes end without an open-ended one "
                         "(max_state null)")
    width = next(w for w in widths if w[0] or (state_size is not None and state_size <= w[1]))
    # within the width class, sorted by max_t; the last has max_t = null (no upper bound)
    for entry in sorted((c for c in classes if _width_key(c) == width),
                        key=lambda c: (c["max_t"] is None, c["max_t"] or 0)):
        if entry["max_t"] is None or t <= entry["max_t"]:
            fwd, train = entry["forward"], entry["train"]
            return (fwd["algorithm"], fwd["chunk_size"]), (train["algorithm"], train["chunk_size"])
    raise ValueError(f"{TABLE_PATH}: the {backend}/{core} classes end without an open-ended one (max_t null)")


def _forward_with_training_vjp(forward, train, *args):
    """forward(*args), differentiated as train(*args) (same function, other algorithm)."""

    @jax.custom_vjp
    def run(*a):
        return forward(*a)

    def run_fwd(*a):
        return jax.vjp(train, *a)

    def run_bwd(vjp_fn, cotangent):
        return vjp_fn(cotangent)

    run.defvjp(run_fwd, run_bwd)
    return run(*args)


def run_auto(core: str, t: int, chunk_size, run, *args, state_size: int | None = None):
    """run(algorithm, chunk_size, *args) with the measured choices for length t and per-head state
    size p·n; an explicit chunk_size wins."""
    (f_alg, f_chunk), (t_alg, t_chunk) = choose(core, t, state_size)
    forward = functools.partial(run, f_alg, chunk_size or f_chunk)
    train = functools.partial(run, t_alg, chunk_size or t_chunk)
    if (f_alg, chunk_size or f_chunk) == (t_alg, chunk_size or t_chunk):
        return forward(*args)
    return _forward_with_training_vjp(forward, train, *args)
