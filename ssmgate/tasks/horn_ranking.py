"""Episodes, relevance classes, ranking and pools of the Horn-clause task (protocol §4.1, §4.3-4.5);
`horn.py` has the graph, the token format and the batches. `graph` arguments are `horn.HornGraph`s.

Plackett–Luce (PL) over the K clauses of the current layer, sampled by the Gumbel-top-k trick:
key_c = beta s_c + G_c with s_c = -class(c) (classes 1..4, protocol §4.1) and G_c ~ Gumbel(0, 1), sorted
descending. beta = 0 is a uniformly random order; beta = inf puts class 1 first, then 2, 3, 4, each
class in uniformly random order (computed lexicographically: inf * s + G would be NaN-prone).

Pools are static-shape `(k_hi,)` arrays of clause indices, -1 at positions >= k (padding).
Everything here is per example and jittable; vmap it over a batch.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

import jax
import jax.numpy as jnp


# --- episodes and classes (jittable) ----------------------------------------------------------

class HornStates(NamedTuple):
    current: jax.Array   # (n,) int32 global prop index of the current prop
    goal: jax.Array      # (n,) int32 global prop index of Q (in S3)
    path: jax.Array      # (n,) int32 the episode's clause of this turn's layer (class 1)
    classes: jax.Array   # (n, K) int32 classes 1..4 of the layer's clauses


def episode_state(key, graph, layer):
    """One episode (protocol §4.1 recipe) seen at turn layer + 1: (current local, goal local, path clause,
    classes). The episode depends on `key` only, so both turns of one key share it."""
    k1, k2 = jax.random.split(key)
    elig = jnp.asarray(graph.eligible1)
    c1 = elig[jax.random.randint(k1, (), 0, elig.shape[0])]
    b = jnp.asarray(graph.dst[0])[c1]
    c2 = jnp.asarray(graph.out2)[b, jax.random.randint(k2, (), 0, jnp.asarray(graph.deg2)[b])]
    goal = jnp.asarray(graph.dst[1])[c2]
    current = jnp.where(layer == 0, jnp.asarray(graph.src[0])[c1], b)
    path = jnp.where(layer == 0, c1, c2)
    src, dst = jnp.asarray(graph.src)[layer], jnp.asarray(graph.dst)[layer]
    reach = jnp.asarray(graph.reach)[layer, dst, goal]
    classes = jnp.where(src == current, jnp.where(reach, 1, 2), jnp.where(reach, 3, 4))
    return current, goal, path, classes.astype(jnp.int32)


def sample_states(key, graph, n: int, turn: int) -> HornStates:
    """n independent episodes at turn 1 or 2 (jittable with graph, n, turn static)."""
    if turn not in (1, 2):
        raise ValueError(f"turn={turn!r}: expected 1 or 2")
    cur, goal, path, cls = jax.vmap(lambda k: episode_state(k, graph, turn - 1))(jax.random.split(key, n))
    P = graph.P
    return HornStates((turn - 1) * P + cur, 2 * P + goal, path, cls)


# --- ranking -------------------------------------------------------------------------------------

def check_beta(beta) -> float:
    """beta as a Python float; ValueError unless it is a number >= 0 (inf allowed). beta is static:
    the inf branch is chosen at trace time."""
    try:
        b = float(beta)
    except (TypeError, ValueError):
        raise ValueError(f"beta={beta!r}: expected a float >= 0 (inf allowed)") from None
    if not b >= 0:  # also rejects NaN
        raise ValueError(f"beta={beta!r}: expected a float >= 0 (inf allowed)")
    return b


def pl_order(key, classes_K, beta: float):
    """One PL sample: (K,) int32 clause indices, best first. classes_K: (K,) ints in 1..4."""
    beta = check_beta(beta)
    classes = jnp.asarray(classes_K, jnp.int32)
    g = jax.random.gumbel(key, classes.shape, jnp.float32)
    if math.isinf(beta):
        # The beta -> inf limit of sorting by beta s + G: by class, ties by G (lexsort's last key is primary).
        return jnp.lexsort((-g, classes)).astype(jnp.int32)
    return jnp.argsort(-(g - beta * classes.astype(jnp.float32))).astype(jnp.int32)


def random_order(key, eligible_K):
    """(K,) int32: the eligible clauses first in uniformly random order, then the others."""
    # float keys: XLA's CPU top_k is ~70x slower on integers. Ties (2^-23 resolution) go to the lower
    # index, a bias of order K / 2^23 per row.
    u = jax.random.uniform(key, eligible_K.shape)
    return jax.lax.top_k(jnp.where(eligible_K, u, -1.0), eligible_K.shape[0])[1].astype(jnp.int32)


def first_class1_rank(order_K, classes_K):
    """0-based rank of the best-ranked class-1 clause in `order_K`; K when there is none."""
    is1 = jnp.asarray(classes_K)[order_K] == 1
    return jnp.where(jnp.any(is1), jnp.argmax(is1), order_K.shape[0]).astype(jnp.int32)


def uniform_recall(K: int, n1: int, k: int) -> Fraction:
    """Exact P(a uniformly random k-subset of K clauses holds >= 1 of the n1 class-1 clauses)
    = 1 - C(K - n1, k) / C(K, k) (hypergeometric): PL recall@k at beta = 0."""
    return 1 - Fraction(math.comb(K - n1, k), math.comb(K, k))


def pool_from_order(order_K, k, k_hi: int, *, reverse: bool = False, oracle=None, oracle_pos=None):
    """(k_hi,) int32 pool of clause indices, -1 at positions >= k.

    Without an oracle, position i < k holds order[i] (reverse=False) or order[k - 1 - i] (reverse=True:
    the best-ranked clause sits last, next to the query). With `oracle`/`oracle_pos`, the oracle sits at
    `oracle_pos` and the other k - 1 positions hold order[0 .. k - 2] in order (so `order` must not
    contain the oracle in its first k - 1 entries).
    """
    i = jnp.arange(k_hi, dtype=jnp.int32)
    last = order_K.shape[0] - 1
    if oracle is None:
        src = k - 1 - i if reverse else i
        pool = order_K[jnp.clip(src, 0, last)]
    else:
        src = jnp.where(i > oracle_pos, i - 1, i)
        pool = jnp.where(i == oracle_pos, oracle, order_K[jnp.clip(src, 0, last)])
    return jnp.where(i < k, pool, -1).astype(jnp.int32)


def build_pool(key, kind: str, classes_K, path, k, k_hi: int, n_fresh_k, beta: float):
    """(pool (k_hi,), oracle_pos) of one example, as `horn.py`'s docstring describes each kind.
    oracle_pos: pool position of the target clause, -1 when the pool has none. n_fresh_k: ceil(q k)."""
    k_ord, k_pos = jax.random.split(key)
    K = classes_K.shape[0]
    if kind == "lengen":
        order = pl_order(k_ord, classes_K, beta)
        rank = first_class1_rank(order, classes_K)
        return pool_from_order(order, k, k_hi, reverse=True), jnp.where(rank < k, k - 1 - rank, -1)
    if kind == "no_oracle":
        return pool_from_order(random_order(k_ord, classes_K != 1), k, k_hi), jnp.asarray(-1)
    if kind not in ("retrieval", "rand_name"):
        raise ValueError(f"kind={kind!r}: expected one of ('retrieval', 'lengen', 'no_oracle', 'rand_name')")
    # The path clause is the oracle; rand_name keeps every other class-1 clause out of the pool.
    eligible = (jnp.arange(K) != path) if kind == "retrieval" else (classes_K != 1)
    pos = jax.random.randint(k_pos, (), 0, k if kind == "retrieval" else n_fresh_k)
    return pool_from_order(random_order(k_ord, eligible), k, k_hi, oracle=path, oracle_pos=pos), pos


# --- scoring ------------------------------------------------------------------------------------

RULES = {"retrieval": "class1", "lengen": "class1", "no_oracle": "static_class1", "rand_name": "answer"}


def correct(emitted_b, batch, graph, rule: str = "class1"):
    """(b,) bool. class1: the name resolves, via the example's name map (the names shown in its
    context), to a class-1 clause (protocol first-turn accuracy). static_class1: it is the static name of
    a class-1 clause of the layer (no-oracle probe). answer: it is the target name (rand-name probe)."""
    e = emitted_b[:, None]
    if rule == "class1":
        return jnp.any((batch.pool_name == e) & (batch.pool_name >= 0) & (batch.pool_class == 1), axis=1)
    if rule == "static_class1":
        static = jnp.asarray(graph.names)[batch.turn - 1]
        return jnp.any((static == e) & (batch.layer_class == 1), axis=1)
    if rule == "answer":
        return emitted_b == batch.answer
    raise ValueError(f"rule={rule!r}: expected one of {tuple(sorted(set(RULES.values())))}")
