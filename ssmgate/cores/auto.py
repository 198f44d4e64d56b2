"""`algorithm="auto"`: the fastest algorithm per backend and size class, as measured.

The table `auto_table.json` beside this file is written by `python -m ssmgate.bench cores
--write-auto-table` on a machine of the backend it describes; nothing here times code at call
time. A size class is the sequence length t (the axis the algorithms differ on); each entry holds
the algorithm and chunk size that were fastest for forward+backward at that class's measured size.
A backend with no measurements falls back to FALLBACK (and warns once), so an unmeasured GPU or
TPU still runs, and the docs say how to measure it.
"""
from __future__ import annotations

import functools
import json
import pathlib
import warnings

import jax

TABLE_PATH = pathlib.Path(__file__).with_name("auto_table.json")
# Used only for a backend the table does not cover; see docs/benchmarks.md.
FALLBACK = {"scalar_decay": ("chunked", 64), "rotation": ("chunked", 64), "damped": ("associative", None)}


@functools.lru_cache(maxsize=None)
def load_table(path: str = str(TABLE_PATH)) -> dict:
    p = pathlib.Path(path)
    if not p.exists():
        return {}
    return json.loads(p.read_text())


@functools.lru_cache(maxsize=None)
def _warn_unmeasured(backend: str, core: str) -> None:
    algorithm, chunk = FALLBACK[core]
    warnings.warn(
        f"ssmgate.cores: no measured auto table for backend {backend!r} and core {core!r}; using "
        f"{algorithm!r} (chunk {chunk}). Run `python -m ssmgate.bench cores --write-auto-table` on this "
        f"machine to measure it.", stacklevel=3)


def choose(core: str, t: int, backend: str | None = None):
    """Returns (algorithm, chunk_size or None) for a call of `core` with sequence length t."""
    backend = backend or jax.default_backend()
    classes = load_table().get(backend, {}).get(core)
    if not classes:
        _warn_unmeasured(backend, core)
        return FALLBACK[core]
    for entry in classes:  # sorted by max_t; the last has max_t = null (no upper bound)
        if entry["max_t"] is None or t <= entry["max_t"]:
            return entry["algorithm"], entry.get("chunk_size")
    raise AssertionError(f"auto table for {backend}/{core} has no open-ended size class: {classes}")
