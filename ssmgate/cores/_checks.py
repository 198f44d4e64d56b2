"""Argument checks shared by the cores.

Every check runs on static shapes and dtypes, so it costs nothing under `jit` and fails before
tracing with a message that names the argument, what it was and what was expected. The value checks
at the end (dt >= 0, decays <= 1, trapezoid weights in [0, 1]) read the data, so they are off unless
a core's `check_values=True` or SSMGATE_CHECK_CORE_VALUES=1 turns them on.
"""
from __future__ import annotations

import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

FLOAT_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32, jnp.float64)
ALGORITHMS = ("auto", "sequential", "associative", "chunked")
# scalar_decay and rotation also run as a Pallas kernel (ssmgate/cores/pallas/)
KERNEL_ALGORITHMS = ALGORITHMS + ("pallas",)


def _dtype_names() -> str:
    return ", ".join(np.dtype(d).name for d in FLOAT_DTYPES)


def check_float(core: str, name: str, arr: Any) -> None:
    dtype = getattr(arr, "dtype", None)
    if dtype is None or not any(np.dtype(dtype) == np.dtype(d) for d in FLOAT_DTYPES):
        got = "a Python scalar/list" if dtype is None else np.dtype(dtype).name
        raise TypeError(
            f"{core}: argument '{name}' has dtype {got}; expected an array of a floating dtype "
            f"({_dtype_names()})"
        )


def check_shape(core: str, name: str, arr: Any, expected: tuple, axes: str, context: str = "") -> None:
    """Checks `arr.shape == expected`; `axes` names the axes, e.g. '(b, t, h)'."""
    if tuple(arr.shape) != tuple(expected):
        ctx = f" {context}" if context else ""
        raise ValueError(
            f"{core}: argument '{name}' has shape {tuple(arr.shape)}; expected {axes} = "
            f"{tuple(expected)}{ctx}"
        )


def check_ndim(core: str, name: str, arr: Any, axes: str) -> None:
    ndim = axes.count(",") + 1
    if arr.ndim != ndim:
        raise ValueError(
            f"{core}: argument '{name}' has shape {tuple(arr.shape)} ({arr.ndim} axes); "
            f"expected {ndim} axes {axes}"
        )


def check_algorithm(core: str, algorithm: str, allowed: tuple[str, ...] = ALGORITHMS) -> None:
    if algorithm not in allowed:
        raise ValueError(
            f"{core}: unknown algorithm {algorithm!r}; expected one of {', '.join(map(repr, allowed))}"
        )


def check_chunk_size(core: str, chunk_size: Any) -> None:
    if chunk_size is not None and (not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1):
        raise ValueError(f"{core}: argument 'chunk_size' is {chunk_size!r}; expected None or an integer >= 1")


def compute_dtype(*arrays: Any) -> jnp.dtype:
    """float32 whatever the inputs, float64 when any input is float64 (x64 mode, used by tests)."""
    if any(a is not None and a.dtype == jnp.float64 for a in arrays):
        return jnp.dtype(jnp.float64)
    return jnp.dtype(jnp.float32)


def check_ssm_inputs(core: str, x, dt, A, B, C, D, *, A_name: str = "A") -> tuple[int, int, int, int, int, int]:
    """Checks the mamba_ssm-convention arguments shared by all cores; returns (b, t, h, p, g, n)."""
    for name, arr in (("x", x), ("dt", dt), (A_name, A), ("B", B), ("C", C)):
        check_float(core, name, arr)
    if D is not None:
        check_float(core, "D", D)
    check_ndim(core, "x", x, "(b, t, h, p)")
    b, t, h, p = x.shape
    if t < 1:
        raise ValueError(f"{core}: argument 'x' has shape {tuple(x.shape)}; expected a sequence length t >= 1")
    check_shape(core, "dt", dt, (b, t, h), "(b, t, h)", f"to match x of shape {tuple(x.shape)}")
    if A.ndim == 1:
        check_shape(core, A_name, A, (h,), "(h,)", f"(or (b, t, h) = {(b, t, h)}) to match x of shape {tuple(x.shape)}")
    else:
        check_shape(core, A_name, A, (b, t, h), "(b, t, h)", f"(or (h,) = {(h,)}) to match x of shape {tuple(x.shape)}")
    check_ndim(core, "B", B, "(b, t, g, n)")
    g, n = B.shape[2], B.shape[3]
    check_shape(core, "B", B, (b, t, g, n), "(b, t, g, n)", f"with (b, t) from x of shape {tuple(x.shape)}")
    check_shape(core, "C", C, B.shape, "(b, t, g, n)", f"to match B of shape {tuple(B.shape)}")
    if g < 1 or h % g != 0:
        raise ValueError(
            f"{core}: B/C have g = {g} groups (shape {tuple(B.shape)}) but x has h = {h} heads; "
            f"expected h % g == 0"
        )
    if D is not None:
        check_shape(core, "D", D, (h,), "(h,)", f"to match x of shape {tuple(x.shape)}")
    return b, t, h, p, g, n


def check_trap(core: str, trap, lead: tuple, axes: str = "(b, t, h)") -> None:
    """trap: the trapezoid weight lambda in [0, 1] per (b, t, h) (per (b, h) for a step), or None."""
    if trap is not None:
        check_float(core, "trap", trap)
        check_shape(core, "trap", trap, lead, axes, "(trapezoid weight lambda in [0, 1])")


def check_pairs(core: str, name: str, arr, lead: tuple, n: int, axes: str = "(b, t, h, r)") -> int:
    """Checks a per-pair angle/frequency argument of shape lead + (r,) with r <= n/2; returns r."""
    check_float(core, name, arr)
    check_ndim(core, name, arr, axes)
    r = arr.shape[-1]
    check_shape(core, name, arr, (*lead, r), axes, "with the leading axes from x")
    if 2 * r > n:
        raise ValueError(
            f"{core}: argument '{name}' has r = {r} pairs (shape {tuple(arr.shape)}) but the state has "
            f"n = {n} channels; expected r <= n/2 = {n // 2}"
        )
    return r


def check_state_array(core: str, name: str, arr, expected: tuple, axes: str) -> None:
    check_float(core, name, arr)
    check_shape(core, name, arr, expected, axes)


def check_step_inputs(core: str, x, dt, A, B, C, D, *, A_name: str = "A") -> tuple[int, int, int, int, int]:
    """Checks one-token arguments x (b, h, p), dt (b, h), A (h,) or (b, h), B/C (b, g, n); returns (b, h, p, g, n)."""
    for name, arr in (("x", x), ("dt", dt), (A_name, A), ("B", B), ("C", C)):
        check_float(core, name, arr)
    if D is not None:
        check_float(core, "D", D)
    check_ndim(core, "x", x, "(b, h, p)")
    b, h, p = x.shape
    check_shape(core, "dt", dt, (b, h), "(b, h)", f"to match x of shape {tuple(x.shape)}")
    if A.ndim == 1:
        check_shape(core, A_name, A, (h,), "(h,)", f"(or (b, h) = {(b, h)})")
    else:
        check_shape(core, A_name, A, (b, h), "(b, h)", f"(or (h,) = {(h,)})")
    check_ndim(core, "B", B, "(b, g, n)")
    g, n = B.shape[1], B.shape[2]
    check_shape(core, "B", B, (b, g, n), "(b, g, n)", f"with b from x of shape {tuple(x.shape)}")
    check_shape(core, "C", C, B.shape, "(b, g, n)", f"to match B of shape {tuple(B.shape)}")
    if g < 1 or h % g != 0:
        raise ValueError(f"{core}: B/C have g = {g} groups but x has h = {h} heads; expected h % g == 0")
    if D is not None:
        check_shape(core, "D", D, (h,), "(h,)", f"to match x of shape {tuple(x.shape)}")
    return b, h, p, g, n


def matmul_dtype(x):
    """The operand dtype of the Pallas kernel's data matmuls: x's own for bf16/fp16 inputs
    (accumulated in float32), None (the compute dtype, full precision) otherwise."""
    return x.dtype if x.dtype in (jnp.bfloat16, jnp.float16) else None


def cast(arr: Any, dtype) -> Any:
    """jnp array in the compute dtype (None passes through); accepts numpy inputs too."""
    return None if arr is None else jnp.asarray(arr, dtype=dtype)


# ----------------------------------------------------------------------------- optional value checks

VALUE_CHECKS_ENV = "SSMGATE_CHECK_CORE_VALUES"


def value_checks_enabled(check_values: bool | None) -> bool:
    """A core's `check_values` argument; None takes the process default from the environment
    variable SSMGATE_CHECK_CORE_VALUES (1 on, unset or 0 off), read when the core is traced."""
    if check_values is not None:
        return bool(check_values)
    return os.environ.get(VALUE_CHECKS_ENV, "0").strip() not in ("", "0", "false", "False")


def _report(core: str, name: str, expected: str, bad_any, index, value, shape) -> None:
    bad_any = np.asarray(bad_any)
    if not bad_any.any():
        return
    # under vmap the callback sees a batch of (bad, index, value): report the first bad one
    k = int(np.argmax(bad_any.ravel()))
    i = int(np.ravel(index)[k])
    where = tuple(int(v) for v in np.unravel_index(i, shape))
    raise ValueError(f"{core}: argument '{name}' has value {float(np.ravel(value)[k])!r} at index {where}; "
                     f"expected {expected}")


def _check_value(core: str, name: str, arr, ok_fn, expected: str) -> None:
    if isinstance(arr, jax.core.Tracer):
        flat = jnp.ravel(arr)
        bad = ~ok_fn(jnp, flat)
        index = jnp.argmax(bad)
        jax.debug.callback(functools.partial(_report, core, name, expected, shape=tuple(arr.shape)),
                           bad.any(), index, flat[index])
    else:
        flat = np.ravel(np.asarray(arr, dtype=np.float64))
        bad = ~ok_fn(np, flat)  # numpy: jnp would trace a constant inside jit
        if bad.any():
            index = int(np.argmax(bad))
            _report(core, name, expected, True, index, flat[index], tuple(arr.shape))


def check_values(core: str, enabled: bool, *, dt, rate=None, rate_name: str = "A", rate_sign: int = -1,
                 trap=None) -> None:
    """The inputs' values, when `enabled`: dt finite and >= 0, the decay rate finite with the sign
    that keeps every decay exp(dt A) <= 1 (A <= 0; a >= 0 for the damped cores' a = -A), the
    trapezoid weight in [0, 1]. Concrete arrays fail here; traced ones through a callback when the
    computation runs (an error raised inside jit reaches the caller wrapped in JAX's runtime error,
    with this message in its text)."""
    if not enabled:
        return
    _check_value(core, "dt", dt, lambda xp, v: xp.isfinite(v) & (v >= 0), "finite and >= 0 (a step size)")
    if rate is not None:
        if rate_sign < 0:
            _check_value(core, rate_name, rate, lambda xp, v: xp.isfinite(v) & (v <= 0),
                         f"finite and <= 0 (so that every decay exp(dt {rate_name}) <= 1)")
        else:
            _check_value(core, rate_name, rate, lambda xp, v: xp.isfinite(v) & (v >= 0),
                         f"finite and >= 0 (so that every decay exp(-dt {rate_name}) <= 1)")
    if trap is not None:
        _check_value(core, "trap", trap, lambda xp, v: (v >= 0) & (v <= 1), "in [0, 1] (the trapezoid weight)")
