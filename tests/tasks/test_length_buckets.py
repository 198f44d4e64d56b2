"""Shared length buckets (ssmgate.tasks.length_buckets): cover, exactly uniform marginal, the host-side
step draw and named errors."""
from fractions import Fraction

import numpy as np
import pytest

from ssmgate.tasks import length_buckets as lb

CASES = [(1, 512, 8), (1, 512, 5), (1, 512, 1), (1, 7, 7), (1, 100, 3), (3, 29, 5), (1, 8, 4), (7, 7, 1), (0, 9, 4)]


@pytest.mark.parametrize("lo, hi, n_buckets", CASES)
def test_equal_buckets_cover_contiguously_with_near_equal_widths(lo, hi, n_buckets):
    bounds = lb.equal_buckets(lo, hi, n_buckets)
    assert len(bounds) == n_buckets and bounds[0][0] == lo and bounds[-1][1] == hi
    assert [v for a, b in bounds for v in range(a, b + 1)] == list(range(lo, hi + 1))  # contiguous, disjoint
    widths = [b - a + 1 for a, b in bounds]
    assert min(widths) >= 1 and max(widths) - min(widths) <= 1
    assert all(type(x) is int for pair in bounds for x in pair)
    assert lb.check_bounds(bounds, lo, hi) == bounds


def test_equal_buckets_examples():
    assert lb.equal_buckets(1, 32, 4) == ((1, 8), (9, 16), (17, 24), (25, 32))
    assert lb.equal_buckets(1, 64, 2) == ((1, 32), (33, 64))
    assert lb.equal_buckets(1, 10, 3) == ((1, 4), (5, 7), (8, 10))
    assert lb.equal_buckets(5, 5, 1) == ((5, 5),)


@pytest.mark.parametrize("lo, hi, n_buckets", CASES)
def test_bucket_then_uniform_inside_is_exactly_uniform(lo, hi, n_buckets):
    bounds = lb.equal_buckets(lo, hi, n_buckets)
    probs = lb.bucket_probs(bounds, lo, hi)
    assert all(isinstance(p, Fraction) for p in probs) and sum(probs) == 1
    assert probs == tuple(Fraction(b - a + 1, hi - lo + 1) for a, b in bounds)
    for v in range(lo, hi + 1):  # P(v) = sum_i P(bucket i) P(v | bucket i), in exact arithmetic
        pv = sum(p * Fraction(int(a <= v <= b), b - a + 1) for p, (a, b) in zip(probs, bounds))
        assert pv == Fraction(1, hi - lo + 1)


def test_uneven_hand_made_bounds_are_exactly_uniform_too():
    bounds = ((2, 2), (3, 9), (10, 11))
    probs = lb.bucket_probs(bounds, 2, 11)
    assert probs == (Fraction(1, 10), Fraction(7, 10), Fraction(2, 10))
    for v in range(2, 12):
        assert sum(p * Fraction(int(a <= v <= b), b - a + 1) for p, (a, b) in zip(probs, bounds)) == Fraction(1, 10)


def test_bucket_for_step_is_a_function_of_seed_step_and_salt():
    bounds = lb.equal_buckets(1, 512, 4)
    draws = [lb.bucket_for_step(bounds, 3, k) for k in range(500)]
    assert draws == [lb.bucket_for_step(bounds, 3, k) for k in range(500)]
    assert draws == [lb.bucket_for_step(bounds, 3, k, salt=0) for k in range(500)]
    assert draws != [lb.bucket_for_step(bounds, 4, k) for k in range(500)]
    assert draws != [lb.bucket_for_step(bounds, 3, k, salt=0x6B76) for k in range(500)]
    assert set(draws) <= set(bounds) and all(type(x) is int for d in draws for x in d)
    # The documented draw: v ~ U{lo..hi} from default_rng([seed, step, salt]), then v's bucket.
    for k in range(50):
        v = np.random.default_rng([3, k, 7]).integers(1, 513)
        a, b = lb.bucket_for_step(bounds, 3, k, salt=7)
        assert a <= v <= b
    assert lb.bucket_for_step(((5, 5),), 0, 0) == (5, 5)
    assert lb.bucket_for_step(lb.equal_buckets(1, 8, 4), np.int64(2), np.int32(9)) == \
        lb.bucket_for_step(lb.equal_buckets(1, 8, 4), 2, 9)


@pytest.mark.parametrize("lo, hi, n_buckets, salt", [(1, 512, 4, 0), (3, 29, 5, 0x6B76), (1, 100, 3, 1)])
def test_bucket_frequencies_match_bucket_probs(lo, hi, n_buckets, salt):
    bounds = lb.equal_buckets(lo, hi, n_buckets)
    probs = np.array([float(p) for p in lb.bucket_probs(bounds, lo, hi)])
    n = 4000
    draws = [lb.bucket_for_step(bounds, 11, k, salt=salt) for k in range(n)]
    freq = np.array([draws.count(b) for b in bounds]) / n   # sd <= 0.008 each
    assert np.abs(freq - probs).max() < 0.035, (freq, probs)


@pytest.mark.parametrize("args, match", [
    ((1, 512, 0), r"n_buckets=0: expected an int in 1\.\.512 \(the number of values in lo\.\.hi = 1\.\.512\)"),
    ((1, 7, 8), r"n_buckets=8: expected an int in 1\.\.7"),
    ((1, 512, 2.0), r"n_buckets=2\.0: expected an int"),
    ((1, 512, True), r"n_buckets=True: expected an int"),
    ((1.0, 512, 2), r"lo=1\.0: expected an int"),
    ((1, "8", 2), r"hi='8': expected an int"),
    ((9, 8, 1), r"\(lo, hi\)=\(9, 8\): expected lo <= hi"),
])
def test_equal_buckets_bad_arguments_raise_named_errors(args, match):
    with pytest.raises(ValueError, match=match):
        lb.equal_buckets(*args)


@pytest.mark.parametrize("bounds", [((1, 100), (102, 512)),   # gap
                                    ((1, 100), (100, 512)),   # overlap
                                    ((1, 100), (101, 500)),   # short of hi
                                    ((2, 100), (101, 512)),   # starts after lo
                                    ((1, 100), (101, 600)),   # past hi
                                    ((1, 300), (301, 200), (201, 512)),  # an inverted range
                                    ((1, 100.0), (101, 512)),  # not ints
                                    (), None, ((1, 2, 3),)])
def test_bucket_probs_rejects_bounds_not_covering_lo_hi(bounds):
    with pytest.raises(ValueError, match=r"bounds=.*: expected contiguous \(lo, hi\) ranges covering 1\.\.512"):
        lb.bucket_probs(bounds, 1, 512)


def test_bucket_probs_and_bucket_for_step_bad_arguments_raise_named_errors():
    with pytest.raises(ValueError, match=r"lo=1\.0: expected an int"):
        lb.bucket_probs(((1, 512),), 1.0, 512)
    for seed, step, salt in ((-1, 0, 0), (0, -1, 0), (0, 0, -2), (1.0, 0, 0), (0, True, 0)):
        with pytest.raises(ValueError, match=rf"\(seed, step, salt\)=\({seed!r}, {step!r}, {salt!r}\): "
                                             r"expected ints >= 0"):
            lb.bucket_for_step(((1, 512),), seed, step, salt)
    with pytest.raises(ValueError, match=r"bounds=\(\(1, 4\), \(6, 8\)\): expected contiguous \(lo, hi\) ranges, "
                                         r"each lo <= hi"):
        lb.bucket_for_step(((1, 4), (6, 8)), 0, 0)
    with pytest.raises(ValueError, match=r"bounds=\(\): expected contiguous"):
        lb.bucket_for_step((), 0, 0)
