"""The perturbed-label retrieval task of the gating paper (protocol §2.1 short context, §2.4 long context).

A context is a list of ell tokens (x_t, y~_t): a key x_t in R^d and a label y~_t = +-1. The query is the
key at one context position; the target is the label attached to it there. Two regimes:

- fixed keys (short context, Fig 1a/1b): P keys ~ N(0, I/d) with fixed labels y(x_i), drawn once per
  run; each context holds ell distinct keys in random order and each occurrence's label is flipped
  with probability eps, independently per example. Memorising y(.) scores 1 - eps; only retrieval
  from the context scores 1.
- fresh keys (long context, Fig 1c/1d): every key ~ N(0, I/d) and every label uniform, fresh per
  example (P -> infinity, eps = 1/2): only retrieval helps.

The query sits at distance `delta` from the end (0-based position ell - delta, distance 1 = last
token) or, with delta=None, at a uniform position. Everything is jittable; data for a step depends
only on the PRNG key it is given.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class FixedKeys(NamedTuple):
    """The short-context dictionary: keys (P, d) ~ N(0, I/d) and their fixed labels (P,) in {-1, +1}."""
    keys: jax.Array
    labels: jax.Array


class LabelBatch(NamedTuple):
    """keys (b, ell, d); labels (b, ell) = the context labels y~_t (after flips); query_pos (b,) 0-based."""
    keys: jax.Array
    labels: jax.Array
    query_pos: jax.Array


class IndexedBatch(NamedTuple):
    """A fixed-key batch by dictionary index: key t of row i is dictionary.keys[idx[i, t]].

    Models that see the dictionary can work in its P-dimensional basis instead of materialising
    (b, ell, d) keys; `materialize` gives the LabelBatch."""
    idx: jax.Array
    labels: jax.Array
    query_pos: jax.Array


def make_fixed_keys(key, d: int, P: int) -> FixedKeys:
    """Draws the P keys and their labels (iid uniform +-1, protocol §2.1 [REC])."""
    k_keys, k_labels = jax.random.split(key)
    keys = jax.random.normal(k_keys, (P, d)) / jnp.sqrt(d)
    labels = jnp.where(jax.random.bernoulli(k_labels, 0.5, (P,)), 1.0, -1.0)
    return FixedKeys(keys, labels)


def query_positions(key, batch: int, ell: int, delta: int | None):
    """0-based query positions: ell - delta for a fixed distance, uniform over the context for None."""
    if delta is None:
        return jax.random.randint(key, (batch,), 0, ell)
    return jnp.full((batch,), ell - delta, jnp.int32)


def sample_fixed(key, dictionary: FixedKeys, batch: int, ell: int, eps: float, delta: int | None) -> IndexedBatch:
    """Short-context batch: ell distinct dictionary keys per row in random order, labels flipped w.p. eps."""
    k_idx, k_flip, k_pos = jax.random.split(key, 3)
    P = dictionary.keys.shape[0]
    # The indices of the ell largest of P iid uniforms, largest first, are a uniformly random ordered
    # ell-subset (exchangeability); top_k is much cheaper than a full argsort on CPU.
    _, idx_bl = jax.lax.top_k(jax.random.uniform(k_idx, (batch, P)), ell)
    flips = jax.random.bernoulli(k_flip, eps, (batch, ell))
    labels = jnp.where(flips, -1.0, 1.0) * dictionary.labels[idx_bl]
    return IndexedBatch(idx_bl, labels, query_positions(k_pos, batch, ell, delta))


def materialize(dictionary: FixedKeys, batch: IndexedBatch) -> LabelBatch:
    """The keys of an indexed batch as vectors (b, ell, d)."""
    return LabelBatch(dictionary.keys[batch.idx], batch.labels, batch.query_pos)


def sample_fresh(key, batch: int, d: int, ell: int, delta: int | None) -> LabelBatch:
    """Long-context batch: fresh keys ~ N(0, I/d) and uniform labels for every token of every row."""
    k_keys, k_labels, k_pos = jax.random.split(key, 3)
    keys = jax.random.normal(k_keys, (batch, ell, d)) / jnp.sqrt(d)
    labels = jnp.where(jax.random.bernoulli(k_labels, 0.5, (batch, ell)), 1.0, -1.0)
    return LabelBatch(keys, labels, query_positions(k_pos, batch, ell, delta))


def targets(batch: LabelBatch | IndexedBatch):
    """(b,): the label attached to each row's query in its context."""
    return jnp.take_along_axis(batch.labels, batch.query_pos[:, None], axis=1)[:, 0]


def query(batch: LabelBatch):
    """(x_q (b, d), target (b,)): the query key and the label attached to it in the context."""
    x_q = jnp.take_along_axis(batch.keys, batch.query_pos[:, None, None], axis=1)[:, 0]
    return x_q, targets(batch)
