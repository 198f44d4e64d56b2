"""A checksum of every array leaf of a state, the same on any mesh: stored with a checkpoint and
verified when it is restored, so a flipped bit in a data file cannot pass for a parameter.

Per leaf, sum over positions i of bits_i * (2 i + 1) in uint32 arithmetic (wrapping), where bits_i
is element i's bit pattern. Integer sums are exact and order-free, so the value does not depend on
how the leaf is sharded or reduced; a change of one bit k of element i changes the sum by
2^k (2 i + 1) mod 2^32, never 0 because 2 i + 1 is odd, so every single-bit error shows, and
swapped elements show through the position weights.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from ssmgate.tree_paths import path_str


def _bits_u32(x: jax.Array) -> jax.Array:
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    width = jnp.dtype(x.dtype).itemsize
    if width == 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    if width in (1, 2):
        return jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{8 * width}")).astype(jnp.uint32)
    raise TypeError(f"checksum: {x.dtype} leaves are not supported (expected 8-, 16- or 32-bit elements)")


def _leaf_sum(x: jax.Array) -> jax.Array:
    bits = _bits_u32(x).reshape(-1)
    weights = 2 * jnp.arange(bits.size, dtype=jnp.uint32) + 1
    return jnp.sum(bits * weights, dtype=jnp.uint32)


@jax.jit
def _sums(arrays):
    return [_leaf_sum(a) for a in arrays]


def _local_scalar(s: jax.Array):
    """A checksum scalar on this host; in a multi-process run it is replicated, so any local copy."""
    if s.is_fully_addressable:
        return s
    if s.sharding.is_fully_replicated:
        return s.addressable_data(0)
    return multihost_utils.process_allgather(s, tiled=True)


def state_checksums(state) -> dict[str, str]:
    """{leaf path: 8 hex digits} for every array leaf of `state` (Python scalars are left out:
    the checkpoint's JSON metadata holds them exactly)."""
    flat = [(path_str(p), leaf) for p, leaf in jax.tree_util.tree_flatten_with_path(state)[0]
            if isinstance(leaf, jax.Array)]
    if not flat:
        return {}
    sums = _sums([leaf for _, leaf in flat])
    host = [np.asarray(_local_scalar(s)) for s in sums]
    return {path: f"{int(v):08x}" for (path, _), v in zip(flat, host)}


def mismatches(saved: dict[str, str], state) -> list[str]:
    """Paths whose checksum differs from `saved` (paths absent from `saved` are not checked)."""
    now = state_checksums(state)
    return [p for p, v in saved.items() if now.get(p) != v]
