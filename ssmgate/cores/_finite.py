"""Causality for non-finite inputs in the chunked (matmul) forms.

Inside a chunk, the chunked forms multiply every input position by a causal weight matrix whose
future entries are exact zeros; IEEE arithmetic gives 0 * NaN = NaN, so one non-finite input at
position s would make the outputs of the whole chunk non-finite, positions before s included,
while the sequential and associative forms keep them clean. `keep_past_clean` restores the
sequential behaviour: it runs the form on inputs whose non-finite entries are zeroed, then marks
non-finite every output of a head from the first bad position of that head on (and its final
state), which is what the recurrence itself does with a NaN in its state. Finite inputs pass
through unchanged, so results stay bit-identical; the cost is one elementwise pass over the
per-token inputs and a cumulative `or` over time.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

SPREADING_ALGORITHMS = ("chunked", "pallas")
HEAD = "head"  # a per-token input (b, t, h, ...): its bad entries poison their own head
GROUP = "group"  # a per-token input (b, t, g, ...): its bad entries poison every head of the group


def _bad_heads(arr, kind: str, h: int):
    bad = ~jnp.isfinite(arr)
    bad = bad.reshape(*bad.shape[:3], -1).any(axis=-1)  # (b, t, h or g)
    if kind == GROUP:
        bad = jnp.repeat(bad, h // bad.shape[2], axis=2)  # head i reads group i // (h // g)
    return bad


def keep_past_clean(run, args, kinds, h: int):
    """run(*args) -> (y (b, t, h, ...), final state pytree of (b, h, ...) leaves), computed on
    cleaned inputs and poisoned from each head's first non-finite per-token input on.

    kinds: per argument, HEAD, GROUP or None (not per token, or read by its own position only,
    like C; a None argument is skipped)."""
    poison = None
    clean = list(args)
    for i, (arr, kind) in enumerate(zip(args, kinds)):
        if kind is None or arr is None:
            continue
        bad = _bad_heads(arr, kind, h)
        poison = bad if poison is None else poison | bad
        clean[i] = jnp.where(jnp.isfinite(arr), arr, jnp.zeros((), arr.dtype))
    y, final = run(*clean)
    poison = jax.lax.cummax(poison.astype(jnp.int8), axis=1).astype(bool)  # (b, t, h)
    nan = jnp.asarray(jnp.nan, y.dtype)
    y = jnp.where(poison.reshape(*poison.shape, *(1,) * (y.ndim - 3)), nan, y)
    ever = poison[:, -1]  # (b, h): a bad input anywhere
    final = jax.tree_util.tree_map(
        lambda leaf: jnp.where(ever.reshape(*ever.shape, *(1,) * (leaf.ndim - 2)),
                               jnp.asarray(jnp.nan, leaf.dtype), leaf), final)
    return y, final
