"""Mamba-2 mixer block (protocol §1.2) around the `scalar_decay` core.

    in_proj(u) -> z | x | B | C | dt_raw          widths d_inner, d_inner, G N, G N, H
    x, B, C <- silu(causal depthwise conv(x, B, C))
    dt = softplus(dt_raw + dt_bias),  A = -exp(A_log)
    y = scalar_decay(x, dt, A, B, C, D)           h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T
    out = out_proj(GatedRMSNorm(y, z))            norm(y * silu(z)) per group of d_inner / G

Parameters (paths relative to the mixer; H heads, P headdim, N d_state, G groups):
  in_proj/kernel   (d_model, 2 d_inner + 2 G N + H)   PyTorch Linear default init, no bias
  conv/kernel      (conv_width, d_inner + 2 G N)       conv/bias (d_inner + 2 G N,)
  A_log            (H,)   log U(a_init_lo, a_init_hi)   (gates.a_log_init; + delta: gates.offset_gates)
  dt_bias          (H,)   softplus^{-1}(log-uniform [dt_min, dt_max], floor dt_floor)
  D                (H,)   ones
  norm/scale       (d_inner,)
  out_proj/kernel  (d_inner, d_model)
The gate of P1 is A_log (see ssmgate/models/gates.py for edits and statistics).

`__call__(u_btd, cache=None) -> (y_btd, Mamba2Cache)`: the cache carries the conv's last
conv_width - 1 inputs and the core's state, so a sequence run in pieces equals one run; decoding
is t = 1 with the cache.
"""
from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from einops import rearrange

from ssmgate.cores import scalar_decay
from ssmgate.models import gates
from ssmgate.models.config import ModelCfg
from ssmgate.models.layers import CausalConv1d, GatedRMSNorm, dense


class Mamba2Cache(NamedTuple):
    """conv (b, conv_width - 1, d_inner + 2 G N) in the compute dtype; ssm (b, H, P, N) float32."""

    conv: jax.Array
    ssm: jax.Array


class Mamba2Mixer(nn.Module):
    cfg: ModelCfg

    @nn.compact
    def __call__(self, u_btd, cache: Mamba2Cache | None = None):
        cfg = self.cfg.validate()
        cdt = jnp.dtype(cfg.dtype)
        h, p, g, n, d_inner = cfg.n_ssm_heads, cfg.headdim, cfg.n_groups, cfg.d_state, cfg.d_inner

        zxbcdt = dense(2 * d_inner + 2 * g * n + h, cdt, "in_proj")(u_btd.astype(cdt))
        z, xbc, dt_raw = jnp.split(zxbcdt, [d_inner, 2 * d_inner + 2 * g * n], axis=-1)
        xbc, conv_cache = CausalConv1d(cfg.conv_width, dtype=cdt, name="conv")(
            xbc, None if cache is None else cache.conv)
        xbc = jax.nn.silu(xbc)
        x, B, C = jnp.split(xbc, [d_inner, d_inner + g * n], axis=-1)

        A_log = self.param("A_log", lambda key: gates.a_log_init(cfg, key))
        dt_bias = self.param("dt_bias", lambda key: gates.dt_bias_init(cfg, key))
        D = self.param("D", nn.initializers.ones, (h,), jnp.float32)
        dt_bth = jax.nn.softplus(dt_raw.astype(jnp.float32) + dt_bias)
        B_btgn, C_btgn = (rearrange(v, "b t (g n) -> b t g n", g=g, n=n) for v in (B, C))
        y_bthp, ssm_state = scalar_decay(
            rearrange(x, "b t (h p) -> b t h p", h=h, p=p), dt_bth, -jnp.exp(A_log), B_btgn, C_btgn, D,
            initial_state=None if cache is None else cache.ssm,
            algorithm=cfg.algorithm, chunk_size=cfg.chunk_size)

        y = GatedRMSNorm(cfg.norm_eps, group_size=d_inner // g, dtype=cdt, name="norm")(
            rearrange(y_bthp, "b t h p -> b t (h p)"), z)
        out = dense(cfg.d_model, cdt, "out_proj")(y)
        return out, Mamba2Cache(conv_cache, ssm_state)
