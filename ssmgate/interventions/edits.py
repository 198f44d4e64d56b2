"""Parameter edits that return new parameters (SPEC 8, P1 §5): the gate scale s of P1 and any
user edit of one leaf. The input pytree is never modified."""
from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import numpy as np

from ssmgate.models import gates


def scale_gate(params, s: float):
    """exp(A_log) scaled by s > 0 on every Mamba-2 mixer: A_log += log s (P1's gate scaling)."""
    return gates.scale_gates(params, s)


def edit_param(params, path: str, fn: Callable):
    """New pytree whose leaf at `path` ('layers_0/mixer/dt_bias') is fn(leaf); fn must keep the
    leaf's shape and dtype (a checkpoint restored into the model must still fit)."""
    keys = [k for k in path.split("/") if k]
    if not keys:
        raise ValueError("edit_param: empty path; expected e.g. 'layers_0/mixer/dt_bias'")

    def rebuild(node, depth):
        if not isinstance(node, dict) or keys[depth] not in node:
            where = "/".join(keys[:depth]) or "the top level"
            have = sorted(node) if isinstance(node, dict) else type(node).__name__
            raise KeyError(f"edit_param: no '{keys[depth]}' under {where} of the path '{path}'; found {have}")
        if depth == len(keys) - 1:
            old = node[keys[depth]]
            if isinstance(old, dict):
                raise ValueError(f"edit_param: '{path}' is a subtree ({sorted(old)}); expected a leaf")
            new = jnp.asarray(fn(old))
            if new.shape != np.shape(old) or new.dtype != jnp.asarray(old).dtype:
                raise ValueError(f"edit_param: fn changed '{path}' from {np.shape(old)} {jnp.asarray(old).dtype} to "
                                 f"{new.shape} {new.dtype}; expected the same shape and dtype")
            return {**node, keys[depth]: new}
        return {**node, keys[depth]: rebuild(node[keys[depth]], depth + 1)}

    return rebuild(params, 0)
