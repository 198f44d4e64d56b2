"""Transformer baselines of P1 (protocol §3.2, §4.6, §5.2) and the MLPs every LM block may use.

Both blocks map (x_btd, cache) -> (x_btd, cache) on the float32 residual stream; `cache` is the
attention's `KVCache` (see attention.py). Parameter paths, relative to the block:

GPTNeoXBlock (parallel residual: x + attn(LN1 x) + mlp(LN2 x); LayerNorms and projections with bias)
  attn_norm/{scale,bias} (d,)   attn/{query,key,value,out}/{kernel (d, d), bias (d,)}
  mlp_norm/{scale,bias} (d,)    mlp/up/{kernel (d, f), bias (f,)}  mlp/down/{kernel (f, d), bias (d,)}
LlamaBlock (sequential pre-norm: h = x + attn(RMS x); h + mlp(RMS h); no biases)
  attn_norm/scale (d,)          attn/{query,key,value,out}/kernel (d, d)
  mlp_norm/scale (d,)           mlp/{gate,up}/kernel (d, f)  mlp/down/kernel (f, d)
The MLP follows cfg.mlp: "gelu" = GPT-NeoX's up -> exact GELU -> down, with biases; "swiglu" =
Llama's down(silu(gate x) * up x), without. f = cfg.d_mlp, or by default 4 d (gelu) and 8/3 d
rounded up to a multiple of 64 (swiglu).
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ssmgate.models.attention import SelfAttention, proj_init
from ssmgate.models.config import ModelCfg
from ssmgate.models.layers import RMSNorm


def mlp_width(cfg: ModelCfg) -> int:
    """Hidden width f of the MLP (see module docstring)."""
    if cfg.d_mlp:
        return cfg.d_mlp
    if cfg.mlp == "gelu":
        return 4 * cfg.d_model
    return -(-(8 * cfg.d_model // 3) // 64) * 64


def compute_dtype(cfg: ModelCfg):
    return jnp.dtype(cfg.dtype)


class MLP(nn.Module):
    """Position-wise MLP of kind `kind` ("gelu" | "swiglu") and hidden width `width`."""
    kind: str
    width: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x_btd):
        d = x_btd.shape[-1]
        bias = self.kind == "gelu"

        def dense(features, name):
            return nn.Dense(features, use_bias=bias, dtype=self.dtype, param_dtype=jnp.float32,
                            kernel_init=proj_init, name=name)

        if self.kind == "gelu":
            h_btf = jax.nn.gelu(dense(self.width, "up")(x_btd), approximate=False)
        elif self.kind == "swiglu":
            h_btf = jax.nn.silu(dense(self.width, "gate")(x_btd)) * dense(self.width, "up")(x_btd)
        else:
            raise ValueError(f"MLP: kind={self.kind!r}; expected 'gelu' or 'swiglu'")
        return dense(d, "down")(h_btf)


def make_mlp(cfg: ModelCfg, name: str = "mlp") -> MLP:
    return MLP(cfg.mlp, mlp_width(cfg), compute_dtype(cfg), name=name)


def make_attention(cfg: ModelCfg, use_bias: bool) -> SelfAttention:
    return SelfAttention(cfg.n_heads, cfg.rotary_fraction, cfg.rope_base, use_bias, compute_dtype(cfg), name="attn")


class GPTNeoXBlock(nn.Module):
    cfg: ModelCfg

    @nn.compact
    def __call__(self, x_btd, cache=None):
        cfg = self.cfg
        norm = lambda name: nn.LayerNorm(cfg.norm_eps, dtype=compute_dtype(cfg), param_dtype=jnp.float32, name=name)
        attn_btd, cache = make_attention(cfg, use_bias=True)(norm("attn_norm")(x_btd), cache)
        mlp_btd = make_mlp(cfg)(norm("mlp_norm")(x_btd))
        return x_btd + attn_btd.astype(x_btd.dtype) + mlp_btd.astype(x_btd.dtype), cache


class LlamaBlock(nn.Module):
    cfg: ModelCfg

    @nn.compact
    def __call__(self, x_btd, cache=None):
        cfg = self.cfg
        norm = lambda name: RMSNorm(cfg.norm_eps, compute_dtype(cfg), name=name)
        attn_btd, cache = make_attention(cfg, use_bias=False)(norm("attn_norm")(x_btd), cache)
        h_btd = x_btd + attn_btd.astype(x_btd.dtype)
        return h_btd + make_mlp(cfg)(norm("mlp_norm")(h_btd)).astype(x_btd.dtype), cache


TRANSFORMER_BLOCKS = {"gpt_neox": GPTNeoXBlock, "llama": LlamaBlock}
