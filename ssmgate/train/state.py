"""The train state: one pytree (step, params, optimizer state, rng) that a step maps to the next.

Parameters are float32 whatever the compute dtype (protocol §1.9): the step casts a copy for the
forward pass, so gradients, updates and optimizer moments stay float32.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from ssmgate.tree_paths import path_str


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
