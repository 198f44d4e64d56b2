"""Argument checks and result shapes shared by the theory modules (float64 numpy).

A bad argument raises ValueError "`name` must be `allowed`, got `value`" (with its index for
arrays); NaN always fails.
"""
from __future__ import annotations

import numpy as np


def _array(name, value):
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number or array of real numbers, got {value!r}") from None
    return arr


def _fmt(x):
    x = float(x)
    return repr(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def _check(name, value, ok, allowed):
    """Returns `value` as a float64 array; raises ValueError unless `ok(arr)` holds everywhere.

    The message reads "`name` must be `allowed`, got `first offending value`" (plus its index for
    arrays). NaN always fails.
    """
    arr = _array(name, value)
    with np.errstate(invalid="ignore"):
        good = np.asarray(ok(arr)) & ~np.isnan(arr)
    if not np.all(good):
        shape = np.broadcast_shapes(arr.shape, good.shape)  # ok() may broadcast against another argument
        vals, good = np.broadcast_to(arr, shape), np.broadcast_to(good, shape)
        if vals.ndim == 0:
            raise ValueError(f"{name} must be {allowed}, got {_fmt(vals)}")
        idx = tuple(int(i) for i in np.argwhere(~good)[0])
        where = idx[0] if len(idx) == 1 else idx
        raise ValueError(f"{name} must be {allowed}, got {_fmt(vals[idx])} (at index {where})")
    return arr


def _out(arr):
    """0-d results as Python floats, arrays unchanged."""
    arr = np.asarray(arr)
    return float(arr) if arr.ndim == 0 else arr
