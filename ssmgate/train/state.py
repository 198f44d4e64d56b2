"""The train state: one pytree (step, params, optimizer state, rng) that a step maps to the next.

Parameters are float32 whatever the compute dtype (SPEC §1.9): the step casts a copy for the
forward pass, so gradients, updates and optimizer moments stay float32.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct


def key_name(key) -> str:
    """One element of a jax key path as the name it has in a param path."""
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def path_str(key_path) -> str:
    """A jax key path as the '/'-joined param path ("params/embed/embedding") that the
    optimizer masks and the partition table match on."""
    return "/".join(key_name(k) for k in key_path)


def check_float32(params, what: str = "params") -> None:
    """Raise unless every floating leaf of `params` is float32 (the master copy is never bf16)."""
    bad = [f"{path_str(p)}: {leaf.dtype}" for p, leaf in jax.tree_util.tree_leaves_with_path(params)
           if jnp.issubdtype(leaf.dtype, jnp.floating) and leaf.dtype != jnp.float32]
    if bad:
        raise ValueError(f"{what} must be float32 (cast for compute inside the step, not in the state); "
                         f"got {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}")


class TrainState(struct.PyTreeNode):
    step: jax.Array  # int32 scalar: updates applied so far (and the index of the next batch)
    params: Any
    opt_state: Any
    rng: jax.Array  # base key; the step folds in `step`, so the key of step k depends on (seed, k) only

    @classmethod
    def create(cls, params, tx: optax.GradientTransformation, rng) -> "TrainState":
        check_float32(params)
        return cls(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=rng)
