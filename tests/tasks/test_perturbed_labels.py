"""The perturbed-label generators of protocol §2.1 / §2.4."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssmgate.tasks import perturbed_labels as pl


@pytest.fixture(scope="module")
def dictionary():
    return pl.make_fixed_keys(jax.random.key(0), d=64, P=16)


def test_fixed_keys_distribution(dictionary):
    big = pl.make_fixed_keys(jax.random.key(1), d=256, P=512)
    assert big.keys.shape == (512, 256) and big.labels.shape == (512,)
    # x_i ~ N(0, I/d): squared norms concentrate at 1, labels are +-1 and balanced.
    norms = np.sum(np.asarray(big.keys) ** 2, axis=1)
    assert abs(norms.mean() - 1) < 0.02
    assert set(np.unique(big.labels)) == {-1.0, 1.0}
    assert abs(np.mean(big.labels)) < 0.15


def test_fixed_batch_contexts_are_distinct_ordered_subsets(dictionary):
    b = pl.sample_fixed(jax.random.key(2), dictionary, batch=4000, ell=5, eps=0.1, delta=2)
    idx = np.asarray(b.idx)
    assert idx.shape == (4000, 5) and idx.min() >= 0 and idx.max() < 16
    assert all(len(set(row)) == 5 for row in idx)
    # Uniform subsets in random order: every key equally likely at every position.
    for pos in (0, 4):
        counts = np.bincount(idx[:, pos], minlength=16)
        assert counts.min() > 4000 / 16 * 0.75 and counts.max() < 4000 / 16 * 1.25
    np.testing.assert_array_equal(b.query_pos, 3)  # distance 2 from the end of 5 tokens


def test_fixed_batch_flips_labels_at_rate_eps(dictionary):
    b = pl.sample_fixed(jax.random.key(3), dictionary, batch=20000, ell=8, eps=0.1, delta=1)
    true = np.asarray(dictionary.labels)[np.asarray(b.idx)]
    flips = np.asarray(b.labels) != true
    assert abs(flips.mean() - 0.1) < 0.005
    # Memorising y(.) scores 1 - eps on queries; reading the context scores 1.
    target = np.asarray(pl.targets(b))
    memo = true[np.arange(20000), np.asarray(b.query_pos)]
    assert abs(np.mean(memo == target) - 0.9) < 0.01


def test_materialize_and_query(dictionary):
    b = pl.sample_fixed(jax.random.key(4), dictionary, batch=7, ell=6, eps=0.2, delta=None)
    m = pl.materialize(dictionary, b)
    x_q, target = pl.query(m)
    rows = np.arange(7)
    np.testing.assert_array_equal(x_q, np.asarray(dictionary.keys)[np.asarray(b.idx)[rows, np.asarray(b.query_pos)]])
    np.testing.assert_array_equal(target, np.asarray(b.labels)[rows, np.asarray(b.query_pos)])


def test_fresh_batch_distribution_and_uniform_queries():
    b = pl.sample_fresh(jax.random.key(5), batch=3000, d=32, ell=10, delta=None)
    assert b.keys.shape == (3000, 10, 32)
    assert abs(float(jnp.mean(jnp.sum(b.keys ** 2, -1))) - 1) < 0.02
    assert abs(float(jnp.mean(b.labels))) < 0.03
    counts = np.bincount(np.asarray(b.query_pos), minlength=10)
    assert counts.min() > 240 and counts.max() < 360
    fixed = pl.sample_fresh(jax.random.key(5), batch=5, d=4, ell=10, delta=10)
    np.testing.assert_array_equal(fixed.query_pos, 0)


def test_generators_are_deterministic_and_jittable(dictionary):
    f = jax.jit(lambda k: pl.sample_fixed(k, dictionary, 8, 4, 0.1, 1))
    a, b = f(jax.random.key(9)), f(jax.random.key(9))
    np.testing.assert_array_equal(a.idx, b.idx)
    np.testing.assert_array_equal(a.labels, b.labels)
    c = f(jax.random.key(10))
    assert not np.array_equal(a.idx, c.idx)
