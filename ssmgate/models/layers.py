"""Small Flax layers shared by the SSM mixers: RMSNorm, gated RMSNorm, causal depthwise conv1d.

Parameter paths (relative to the module):
  RMSNorm        `scale` (d,), init 1
  GatedRMSNorm   `scale` (d,), init 1
  CausalConv1d   `kernel` (width, channels), `bias` (channels,); PyTorch's Conv1d default init
                 U(+-1/sqrt(width)) (a depthwise filter's fan-in is its width)
Norms compute in float32 whatever the input dtype and return the module's `dtype`.
"""
from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

# nn.Linear / nn.Conv1d default of PyTorch (kaiming_uniform with a = sqrt(5)): U(+-1/sqrt(fan_in)).
# Mamba's modules rely on it, so our projections start at the same scale.
torch_default_init = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


def uniform_init(lo: float, hi: float):
    """Initializer drawing U(lo, hi) in the requested shape and dtype."""
    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, lo, hi)
    return init


def dense(features: int, dtype: Any, name: str) -> nn.Dense:
    """Bias-free projection with PyTorch's default init, float32 parameters, `dtype` compute."""
    return nn.Dense(features, use_bias=False, dtype=dtype, param_dtype=jnp.float32,
                    kernel_init=torch_default_init, name=name)


def rms_normalize(x, eps: float):
    """x / rms(x) over the last axis, in float32."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


class RMSNorm(nn.Module):
    """y = x / rms(x) * scale over the last axis."""

    eps: float = 1e-5
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        return (rms_normalize(x, self.eps) * scale).astype(self.dtype)


class GatedRMSNorm(nn.Module):
    """Mamba-2's gated norm (norm_before_gate=False): RMSNorm(y * silu(z)) * scale.

    `group_size` normalises each block of that many channels separately (Mamba-2 uses
    d_inner // n_groups); None normalises the whole last axis.
    """

    eps: float = 1e-5
    group_size: Optional[int] = None
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, y, z):
        d = y.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (d,), jnp.float32)
        gated = y.astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))
        group = self.group_size or d
        if d % group:
            raise ValueError(f"GatedRMSNorm: group_size {group} does not divide the channel count {d}")
        grouped = gated.reshape(*gated.shape[:-1], d // group, group)
        normed = rms_normalize(grouped, self.eps).reshape(gated.shape)
        return (normed * scale).astype(self.dtype)


class CausalConv1d(nn.Module):
    """Causal depthwise conv over time: y_t = bias + sum_{k<width} kernel[k] * x_{t-width+1+k}.

    __call__(x_btc, cache_bkc=None) -> (y_btc, new_cache_bkc). The cache holds the last width-1
    inputs (zeros before the sequence start), so a sequence run in pieces equals one run.
    """

    width: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x_btc, cache_bkc=None):
        b, t, c = x_btc.shape
        bound = 1.0 / self.width ** 0.5
        kernel_kc = self.param("kernel", uniform_init(-bound, bound), (self.width, c), jnp.float32)
        bias_c = self.param("bias", uniform_init(-bound, bound), (c,), jnp.float32)
        if cache_bkc is None:
            cache_bkc = jnp.zeros((b, self.width - 1, c), self.dtype)
        elif cache_bkc.shape != (b, self.width - 1, c):
            raise ValueError(f"CausalConv1d: cache has shape {tuple(cache_bkc.shape)}; expected "
                             f"(b, width - 1, channels) = {(b, self.width - 1, c)}")
        xp = jnp.concatenate([cache_bkc.astype(self.dtype), x_btc.astype(self.dtype)], axis=1)
        kernel_kc = kernel_kc.astype(self.dtype)
        # width is 4 in practice: a sum of shifted products beats a general conv on every backend.
        y = bias_c.astype(self.dtype) + sum(xp[:, k:k + t] * kernel_kc[k] for k in range(self.width))
        return y, xp[:, t:]
