"""Parameter edits that return new parameters (protocol §8, P1 §5): the gate scale s of P1 and any
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


def edit_checkpoint(src_run_dir, dst_run_dir, edit: Callable, note: str, *, step: int | None = None) -> int:
    """Writes to `<dst_run_dir>/checkpoints` the checkpoint of `src_run_dir` (its latest, or `step`)
    with its parameters replaced by `edit(params)`; returns the step. The optimizer state, step and
    metadata are kept (the metadata gains `edited: note` and `edited_from`), so a run of the same
    configuration pointed at dst_run_dir resumes from the edited weights (e.g. fine-tuning after
    the gate scaling of P1 §5, or evaluating an edited model with a finished run's flags).
    `edit` must keep every leaf's shape and dtype; dst must not hold checkpoints yet."""
    from pathlib import Path

    import jax

    from ssmgate.train.checkpoint import CheckpointError, Checkpointer

    src, dst = Path(src_run_dir) / "checkpoints", Path(dst_run_dir) / "checkpoints"
    if not src.is_dir():
        raise CheckpointError(f"{src}: no checkpoints directory (expected a run directory of ssmgate.main)")
    if dst.is_dir() and any(dst.iterdir()):
        raise CheckpointError(f"{dst} already holds checkpoints; expected a new run directory for the edited weights")
    with Checkpointer(src) as c:
        step, state, meta = c.restore_raw(step)
    if not isinstance(state, dict) or "params" not in state:
        raise CheckpointError(f"{src}/{step}: the state has no 'params' (found {type(state).__name__}); expected a "
                              "single run's TrainState, not a sweep")
    params = state["params"]
    edited = edit(params)
    before, after = jax.tree_util.tree_structure(params), jax.tree_util.tree_structure(edited)
    if before != after:
        raise ValueError(f"edit_checkpoint: the edit changed the parameter tree ({before} -> {after})")
    for old, new in zip(jax.tree.leaves(params), jax.tree.leaves(edited)):
        if np.shape(old) != np.shape(new) or np.asarray(old).dtype != np.asarray(new).dtype:
            raise ValueError(f"edit_checkpoint: the edit changed a leaf from {np.shape(old)} {np.asarray(old).dtype} "
                             f"to {np.shape(new)} {np.asarray(new).dtype}; expected the same shape and dtype")
    meta = dict(meta, edited=note, edited_from=str(src / str(step)))
    with Checkpointer(dst) as d:
        d.save(step, dict(state, params=edited), meta=meta, force=True)
    return step
