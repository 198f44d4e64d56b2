"""Causal multi-head self-attention with rotary position embeddings (RoPE), in plain JAX.

RoPE follows GPT-NeoX's half-split layout: of each head's `head_dim` channels the first
`rot_dim = 2 * floor(head_dim * rotary_fraction / 2)` are rotated, channel i < rot_dim/2 paired
with channel i + rot_dim/2 at angle  position * base^(-2i / rot_dim);  the rest pass unchanged.
Because q and k are both rotated by their own position, q_s . k_u depends on s - u only.

`SelfAttention.__call__(x_btd, cache=None) -> (y_btd, cache)`, the interface of the SSM mixers:
- cache=None: the sequence starts at position 0; the returned `KVCache` holds exactly its t
  tokens (capacity t), a prefill that `KVCache.grow` can make room after.
- cache given: the t tokens sit at positions cache.length .. cache.length + t - 1; they are written
  into the cache buffer and attend to everything before them, so a sequence run in pieces equals
  one run. Make a cache with room for the whole sequence by `KVCache.empty` (or `grow`).

Parameters (relative to the module): `query`, `key`, `value`, `out` each with `kernel` (d, d) and,
when `use_bias`, `bias` (d,). Heads are contiguous blocks of head_dim channels.
Logits and softmax are float32 whatever the compute dtype.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from einops import rearrange

# GPT-NeoX and Llama both initialise their projections N(0, 0.02).
proj_init = nn.initializers.normal(0.02)


def rotary_dim(head_dim: int, rotary_fraction: float) -> int:
    """Number of rotated channels per head: the largest even count <= head_dim * fraction."""
    return 2 * int(head_dim * rotary_fraction / 2)


def rope_cos_sin(positions_t, rot_dim: int, base: float):
    """cos, sin of the rotation angles at `positions_t`, each (t, rot_dim / 2), float32."""
    inv_freq_f = base ** (-jnp.arange(0, rot_dim, 2, dtype=jnp.float32) / rot_dim)
    angle_tf = positions_t.astype(jnp.float32)[:, None] * inv_freq_f[None, :]
    return jnp.cos(angle_tf), jnp.sin(angle_tf)


def apply_rope(x_bthk, positions_t, rotary_fraction: float = 1.0, base: float = 10000.0):
    """Rotates the first rot_dim channels of each head (half-split pairs); returns x's dtype."""
    k = x_bthk.shape[-1]
    rot = rotary_dim(k, rotary_fraction)
    if rot == 0:
        return x_bthk
    cos_tf, sin_tf = rope_cos_sin(positions_t, rot, base)
    cos_tf, sin_tf = cos_tf[None, :, None, :], sin_tf[None, :, None, :]
    x = x_bthk.astype(jnp.float32)
    x1, x2, rest = x[..., :rot // 2], x[..., rot // 2:rot], x[..., rot:]
    rotated = jnp.concatenate([x1 * cos_tf - x2 * sin_tf, x2 * cos_tf + x1 * sin_tf, rest], axis=-1)
    return rotated.astype(x_bthk.dtype)


class KVCache(NamedTuple):
    """Keys (after RoPE) and values of the tokens seen so far.

    k, v: (b, capacity, heads, head_dim); slots >= length are unused. length: int32 scalar, the
    number of tokens written (one length for the whole batch).
    """
    k: jax.Array
    v: jax.Array
    length: jax.Array

    @staticmethod
    def empty(batch: int, capacity: int, n_heads: int, head_dim: int, dtype: Any = jnp.float32) -> "KVCache":
        zeros = jnp.zeros((batch, capacity, n_heads, head_dim), dtype)
        return KVCache(zeros, zeros, jnp.zeros((), jnp.int32))

    @property
    def capacity(self) -> int:
        return self.k.shape[1]

    def grow(self, extra: int) -> "KVCache":
        """The same cache with `extra` more free slots."""
        pad = ((0, 0), (0, extra), (0, 0), (0, 0))
        return KVCache(jnp.pad(self.k, pad), jnp.pad(self.v, pad), self.length)


def _check_room(cache: KVCache, t: int):
    # Under jit the length is traced and cannot be checked; dynamic_update_slice would then clamp
    # the write position silently, so check whenever the length is known.
    try:
        length = int(cache.length)
    except jax.errors.ConcretizationTypeError:
        return
    if length + t > cache.capacity:
        raise ValueError(f"KVCache: capacity {cache.capacity} holds {length} tokens and cannot take {t} more; "
                         f"expected capacity >= {length + t} (use KVCache.empty or KVCache.grow)")


def causal_attention(q_bshk, k_buhk, v_buhk, q_offset, n_valid=None):
    """softmax(q k^T / sqrt(k)) v with query i (at position q_offset + i) seeing keys u <= q_offset + i.

    Keys at u >= n_valid (unused cache slots) are masked too. Logits and softmax in float32; the
    output has v's dtype.
    """
    head_dim = q_bshk.shape[-1]
    logits_bhsu = jnp.einsum("bshk,buhk->bhsu", q_bshk, k_buhk, preferred_element_type=jnp.float32)
    logits_bhsu = logits_bhsu / jnp.sqrt(jnp.float32(head_dim))
    q_pos_s = q_offset + jnp.arange(q_bshk.shape[1])
    k_pos_u = jnp.arange(k_buhk.shape[1])
    visible_su = k_pos_u[None, :] <= q_pos_s[:, None]
    if n_valid is not None:
        visible_su &= k_pos_u[None, :] < n_valid
    logits_bhsu = jnp.where(visible_su, logits_bhsu, jnp.finfo(jnp.float32).min)
    probs_bhsu = jax.nn.softmax(logits_bhsu, axis=-1)
    return jnp.einsum("bhsu,buhk->bshk", probs_bhsu.astype(v_buhk.dtype), v_buhk)


class SelfAttention(nn.Module):
    n_heads: int
    rotary_fraction: float = 1.0
    rope_base: float = 10000.0
    use_bias: bool = False
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x_btd, cache: KVCache | None = None):
        b, t, d = x_btd.shape
        if d % self.n_heads:
            raise ValueError(f"SelfAttention: d_model {d} is not a multiple of n_heads {self.n_heads}")
        head_dim = d // self.n_heads

        def proj(name):
            return nn.Dense(d, use_bias=self.use_bias, dtype=self.dtype, param_dtype=jnp.float32,
                            kernel_init=proj_init, name=name)

        def heads(name):
            return rearrange(proj(name)(x_btd), "b t (h k) -> b t h k", h=self.n_heads)

        q_bthk, k_bthk, v_bthk = heads("query"), heads("key"), heads("value")
        start = jnp.zeros((), jnp.int32) if cache is None else cache.length
        positions_t = start + jnp.arange(t)
        q_bthk = apply_rope(q_bthk, positions_t, self.rotary_fraction, self.rope_base)
        k_bthk = apply_rope(k_bthk, positions_t, self.rotary_fraction, self.rope_base)

        if cache is None:
            y_bthk = causal_attention(q_bthk, k_bthk, v_bthk, 0)
            new_cache = KVCache(k_bthk, v_bthk, jnp.asarray(t, jnp.int32))
        else:
            if cache.k.shape[0] != b or cache.k.shape[2:] != (self.n_heads, head_dim):
                raise ValueError(f"KVCache: k has shape {tuple(cache.k.shape)}; expected "
                                 f"(batch, capacity, heads, head_dim) = ({b}, capacity, {self.n_heads}, {head_dim})")
            _check_room(cache, t)
            at = (0, cache.length, 0, 0)
            k_buhk = jax.lax.dynamic_update_slice(cache.k, k_bthk.astype(cache.k.dtype), at)
            v_buhk = jax.lax.dynamic_update_slice(cache.v, v_bthk.astype(cache.v.dtype), at)
            y_bthk = causal_attention(q_bthk, k_buhk.astype(self.dtype), v_buhk.astype(self.dtype),
                                      cache.length, cache.length + t)
            new_cache = KVCache(k_buhk, v_buhk, cache.length + t)
        y_btd = proj("out")(rearrange(y_bthk, "b t h k -> b t (h k)"))
        return y_btd, new_cache
