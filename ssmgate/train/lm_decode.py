"""Greedy decoding of a language model of the zoo: one jitted program per (model, prompt shape, steps).

The prompt (b, L) runs once in parallel form and leaves the model's cache (the SSM state, or a
Transformer's key-value cache sized for prompt + new tokens); then `lax.scan` feeds back the argmax
one token at a time. Rows that emitted `eos_id` keep emitting it, so the output ends in EOS padding.
`replicas=True` decodes a sweep's stacked parameters (leading replica axis) in the same program.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.train import sweep


@functools.lru_cache(maxsize=16)
def _program(model, steps: int, eos_id: int, replicas: bool):
    def one(params, prompt_bl):
        b, length = prompt_bl.shape
        cache = model.init_cache(b, length + steps)
        logits, cache = model.apply({"params": params}, prompt_bl, cache)
        first = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)

        def step(carry, _):
            token, done, cache = carry
            logits, cache = model.apply({"params": params}, token[:, None], cache)
            nxt = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
            done = done | (token == eos_id)
            nxt = jnp.where(done, eos_id, nxt)
            return (nxt, done, cache), nxt

        (_, _, _), rest = jax.lax.scan(step, (first, jnp.zeros(b, bool), cache), None, length=steps - 1)
        return jnp.concatenate([first[:, None], rest.T], axis=1)

    return jax.jit(sweep.replica_vmap(one, (0, None)) if replicas else one)


def greedy(model, params, prompts_bl, steps: int, eos_id: int, *, replicas: bool = False) -> np.ndarray:
    """(b, steps) generated tokens (or (R, b, steps) with `replicas`) after the prompts (b, L)."""
    if steps < 1:
        raise ValueError(f"greedy: steps={steps}; expected >= 1")
    prompts_bl = np.asarray(prompts_bl, np.int32)
    if prompts_bl.ndim != 2 or prompts_bl.shape[1] < 1:
        raise ValueError(f"greedy: prompts of shape {prompts_bl.shape}; expected (batch, length >= 1)")
    return np.asarray(_program(model, steps, int(eos_id), replicas)(params, prompts_bl))


def until_eos(tokens, eos_id: int) -> list:
    """Each row's tokens before its first EOS."""
    out = []
    for row in np.asarray(tokens):
        stop = np.flatnonzero(row == eos_id)
        out.append(row[:stop[0]] if len(stop) else row)
    return out
