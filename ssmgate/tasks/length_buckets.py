"""Length buckets: variable-length training batches with an exactly uniform length and few compiles.

A task whose training length (pairs, pool clauses, ..) is v ~ U{lo..hi} per example cuts lo..hi into
contiguous buckets. A batch first draws its bucket with probability = the bucket's share of U{lo..hi}
(`bucket_probs`), then every example draws its length uniformly inside the bucket, so each example's
length is marginally exactly U{lo..hi} while the batch is padded only to its bucket's top. Bucket bounds
are static shapes, so a jitted sampler compiles once per bucket.

`bucket_for_step` makes the bucket draw on the host (numpy, no device sync) as a function of
(seed, step, salt) only: it draws v ~ U{lo..hi} and returns the bucket holding v, which has exactly
the bucket's probability. Bounds are tuples of (lo, hi) pairs, inclusive at both ends.
"""
from __future__ import annotations

import bisect
from fractions import Fraction

import numpy as np


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def equal_buckets(lo: int, hi: int, n_buckets: int) -> tuple[tuple[int, int], ...]:
    """n_buckets contiguous (lo_i, hi_i) ranges covering lo..hi, widths differing by at most 1 (the
    wider ones first). For a uniform length, equal widths minimise the expected padded length
    sum_i P(i) hi_i for a given number of compiled shapes."""
    for name, v in (("lo", lo), ("hi", hi), ("n_buckets", n_buckets)):
        if not _is_int(v):
            raise ValueError(f"{name}={v!r}: expected an int")
    if lo > hi:
        raise ValueError(f"(lo, hi)=({lo}, {hi}): expected lo <= hi")
    count = int(hi) - int(lo) + 1
    if not 1 <= n_buckets <= count:
        raise ValueError(f"n_buckets={n_buckets}: expected an int in 1..{count} "
                         f"(the number of values in lo..hi = {lo}..{hi})")
    width, extra = divmod(count, int(n_buckets))
    bounds, start = [], int(lo)
    for i in range(int(n_buckets)):
        end = start + width + (i < extra) - 1
        bounds.append((start, end))
        start = end + 1
    return tuple(bounds)


def check_bounds(bounds, lo=None, hi=None) -> tuple[tuple[int, int], ...]:
    """bounds as a tuple of (int, int) pairs; ValueError unless they are non-empty, contiguous, each
    lo_i <= hi_i, and (when lo, hi are given) cover exactly lo..hi."""
    want = f"contiguous (lo, hi) ranges covering {lo}..{hi}" if lo is not None else "contiguous (lo, hi) ranges"
    try:
        out = tuple((int(a), int(b)) for a, b in bounds)
        ints = all(_is_int(a) and _is_int(b) for a, b in bounds)
    except (TypeError, ValueError):
        out, ints = (), False
    ok = (ints and len(out) > 0 and all(a <= b for a, b in out)
          and all(b1 + 1 == a2 for (_, b1), (a2, _) in zip(out, out[1:]))
          and (lo is None or (out[0][0] == lo and out[-1][1] == hi)))
    if not ok:
        raise ValueError(f"bounds={bounds!r}: expected {want}, each lo <= hi, as int pairs")
    return out


def bucket_probs(bounds, lo: int, hi: int) -> tuple[Fraction, ...]:
    """Each bucket's exact share of U{lo..hi}: (hi_i - lo_i + 1) / (hi - lo + 1). Checks that the
    bounds are contiguous and cover lo..hi exactly."""
    for name, v in (("lo", lo), ("hi", hi)):
        if not _is_int(v):
            raise ValueError(f"{name}={v!r}: expected an int")
    bounds = check_bounds(bounds, lo, hi)
    count = int(hi) - int(lo) + 1
    return tuple(Fraction(b - a + 1, count) for a, b in bounds)


def bucket_for_step(bounds, seed: int, step: int, salt: int = 0) -> tuple[int, int]:
    """The (lo_i, hi_i) bucket of training step `step`, host-side and a function of (seed, step, salt)
    only: v ~ U{lo..hi} from `np.random.default_rng([seed, step, salt])`, then the bucket holding v.
    A task passes its own salt so this draw is independent of its other host draws from (seed, step)."""
    if not all(_is_int(v) and v >= 0 for v in (seed, step, salt)):
        raise ValueError(f"(seed, step, salt)=({seed!r}, {step!r}, {salt!r}): expected ints >= 0")
    bounds = check_bounds(bounds)
    v = int(np.random.default_rng([int(seed), int(step), int(salt)]).integers(bounds[0][0], bounds[-1][1] + 1))
    return bounds[bisect.bisect_right([a for a, _ in bounds], v) - 1]
