"""Names of pytree leaves as the framework writes them: "layers_0/mixer/A_log".

Parameter paths are the stable interface between models, optimizer masks, the partition table,
checkpoints and interventions; every layer names a leaf through these two functions.
"""
from __future__ import annotations


def key_name(key) -> str:
    """One element of a jax key path (dict key, attribute or sequence index) as a string."""
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def path_str(key_path) -> str:
    """A jax key path as its '/'-joined name."""
    return "/".join(key_name(k) for k in key_path)


def path_tuple(key_path) -> tuple[str, ...]:
    return tuple(key_name(k) for k in key_path)
