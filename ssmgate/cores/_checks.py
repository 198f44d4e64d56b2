"""Argument checks shared by the cores.

Every check runs on static shapes and dtypes, so it costs nothing under `jit` and fails before
tracing with a message that names the argument, what it was and what was expected.
"""
from __future__ import annotations

from typing import Any

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
