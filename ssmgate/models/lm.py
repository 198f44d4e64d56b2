"""Language-model stack: embedding, `cfg.n_layers` pre-norm residual blocks, final norm, head.

`LanguageModel(cfg).__call__(tokens_bt, cache=None) -> (logits_btv float32, cache)`; with
`head=False` the final-norm hidden states (b, t, d) in place of the logits, for a loss that applies
the head itself (`head_matrix`, ssmgate.train.chunked_loss). `cache` is a
list with one entry per layer (the mixer's or the attention's cache, None = start of sequence);
the returned list continues the sequence, so running tokens in two pieces equals one run.
Transformer layers need room for the whole sequence: start from `LanguageModel.init_cache`
(an SSM layer's entry stays None there) or grow a returned cache (`KVCache.grow`).
The residual stream is float32 (as Mamba's residual_in_fp32); sublayers compute in cfg.dtype.

Params pytree (plain nested dict; d = d_model, V = vocab_size, f = MLP width):
  embed/embedding                 (V, d), N(0, 0.02)
  layers_{i}/...                  i = 0 .. n_layers - 1:
    mamba2 | mamba3:  norm/scale (d,)  mixer/... (Mamba2Mixer / Mamba3Mixer, see mamba2.py, mamba3.py)
                      and when cfg.mlp != "none":  mlp_norm/scale (d,)  mlp/... (see transformer.MLP)
    gpt_neox | llama: attn_norm, attn, mlp_norm, mlp (see transformer.py)
  final_norm/scale (d,)           (+ final_norm/bias (d,) for gpt_neox: LayerNorm)
  lm_head/kernel                  (d, V), only when cfg.tie_embeddings is False;
                                  tied: logits = h @ embed/embedding^T
Gate parameters therefore live at  layers_{i}/mixer/A_log, layers_{i}/mixer/dt_bias, ...
"""
from __future__ import annotations

import functools
from typing import Callable, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from ssmgate.models.attention import KVCache
from ssmgate.models.config import ModelCfg
from ssmgate.models.hooks import PhaseHooks
from ssmgate.models.layers import RMSNorm
from ssmgate.models.mamba2 import Mamba2Mixer
from ssmgate.models.mamba3 import Mamba3Mixer
from ssmgate.models.transformer import TRANSFORMER_BLOCKS, compute_dtype, make_mlp

embed_init = nn.initializers.normal(0.02)


MIXERS = {"mamba2": Mamba2Mixer, "mamba3": Mamba3Mixer}


def mixer_class(block: str):
    """The SSM mixer module of `block`."""
    if block not in MIXERS:
        raise ValueError(f"mixer_class: block={block!r}; expected one of {sorted(MIXERS)}")
    return MIXERS[block]


class MixerBlock(nn.Module):
    """x + mixer(RMS x), then, with an MLP, + mlp(RMS .)."""
    cfg: ModelCfg
    hooks: Optional[PhaseHooks] = None   # Mamba-3 forward-time interventions of this layer

    @nn.compact
    def __call__(self, x_btd, cache=None):
        cfg = self.cfg
        extra = {} if self.hooks is None else {"hooks": self.hooks}
        mixed_btd, cache = mixer_class(cfg.block)(cfg, name="mixer", **extra)(
            RMSNorm(cfg.norm_eps, compute_dtype(cfg), name="norm")(x_btd), cache)
        x_btd = x_btd + mixed_btd.astype(x_btd.dtype)
        if cfg.mlp != "none":
            mlp_in_btd = RMSNorm(cfg.norm_eps, compute_dtype(cfg), name="mlp_norm")(x_btd)
            x_btd = x_btd + make_mlp(cfg)(mlp_in_btd).astype(x_btd.dtype)
        return x_btd, cache


def block_class(block: str):
    return TRANSFORMER_BLOCKS.get(block, MixerBlock)


class LanguageModel(nn.Module):
    cfg: ModelCfg
    # Per-layer forward-time interventions (Mamba-3 only; ssmgate.interventions builds them):
    # None, or one PhaseHooks-or-None per layer.
    hooks: Optional[tuple] = None
    # Rematerialisation: the backward pass recomputes each layer from its input instead of keeping
    # its activations (jax.checkpoint); same parameters and outputs, memory for one more forward.
    remat: bool = False
    # Applied to the residual stream after the embedding and each layer, and to the logits: the
    # training mesh pins their batch axis to its data axis (ssmgate.train.mesh.activation_constraint),
    # where the compiler would otherwise gather the batch to meet FSDP-sharded weights. None: as is.
    constrain: Optional[Callable] = None

    @nn.compact
    def __call__(self, tokens_bt, cache: Optional[list] = None, head: bool = True):
        cfg = self.cfg
        if tokens_bt.ndim != 2 or not jnp.issubdtype(tokens_bt.dtype, jnp.integer):
            raise ValueError(f"LanguageModel: tokens have shape {tokens_bt.shape} and dtype {tokens_bt.dtype}; "
                             f"expected integer (batch, time)")
        if cache is not None and len(cache) != cfg.n_layers:
            raise ValueError(f"LanguageModel: cache has {len(cache)} entries; expected one per layer ({cfg.n_layers})")
        if self.hooks is not None and (len(self.hooks) != cfg.n_layers or
                                       (cfg.block != "mamba3" and any(h is not None for h in self.hooks))):
            raise ValueError(f"LanguageModel: hooks for {len(self.hooks)} layers of block {cfg.block!r}; expected "
                             f"one entry per layer ({cfg.n_layers}), and interventions on 'mamba3' blocks only")
        embed = nn.Embed(cfg.vocab_size, cfg.d_model, embedding_init=embed_init, param_dtype=jnp.float32,
                         name="embed")
        pin = self.constrain or (lambda x: x)
        h_btd = pin(embed(tokens_bt).astype(jnp.float32))
        caches = []
        block = nn.remat(block_class(cfg.block)) if self.remat else block_class(cfg.block)
        for i in range(cfg.n_layers):
            extra = {} if self.hooks is None or self.hooks[i] is None else {"hooks": self.hooks[i]}
            h_btd, layer_cache = block(cfg, name=f"layers_{i}", **extra)(
                h_btd, None if cache is None else cache[i])
            h_btd = pin(h_btd)
            caches.append(layer_cache)
        if cfg.block == "gpt_neox":
            final_norm = nn.LayerNorm(cfg.norm_eps, dtype=compute_dtype(cfg), param_dtype=jnp.float32,
                                      name="final_norm")
        else:
            final_norm = RMSNorm(cfg.norm_eps, compute_dtype(cfg), name="final_norm")
        h_btd = final_norm(h_btd)
        if not head:
            return h_btd, caches
        if cfg.tie_embeddings:
            head_dv = embed.embedding.T
        else:
            head_dv = self.param("lm_head", lambda key: {"kernel": embed_init(key, (cfg.d_model, cfg.vocab_size))})
            head_dv = head_dv["kernel"]
        # bf16 operands, float32 accumulation and result: the loss sees float32 logits.
        logits_btv = jnp.einsum("btd,dv->btv", h_btd, head_dv.astype(h_btd.dtype),
                                preferred_element_type=jnp.float32)
        return pin(logits_btv), caches

    def init_cache(self, batch: int, capacity: int) -> list:
        """Empty per-layer caches: a KVCache with `capacity` slots for each attention layer,
        None (= zero state) for each SSM layer."""
        cfg = self.cfg
        if cfg.block not in TRANSFORMER_BLOCKS:
            return [None] * cfg.n_layers
        head_dim = cfg.d_model // cfg.n_heads
        return [KVCache.empty(batch, capacity, cfg.n_heads, head_dim, compute_dtype(cfg))
                for _ in range(cfg.n_layers)]


def head_matrix(cfg: ModelCfg, params) -> jax.Array:
    """The head (d, vocab) of `params`: the embedding's transpose when tied, else lm_head/kernel."""
    return params["embed"]["embedding"].T if cfg.tie_embeddings else params["lm_head"]["kernel"]


def build_model(cfg: ModelCfg) -> LanguageModel:
    return LanguageModel(cfg.validate())


def init_params(cfg: ModelCfg, key, seq_len: int = 8) -> dict:
    """Initial parameters (plain dict pytree, float32) from a (1, seq_len) dummy batch, by one
    compiled program: op by op, Flax's init compiles every primitive apart (15 s for a 2-layer
    Mamba-3 on a 2-core CPU, against 3 s compiled)."""
    return flax.core.unfreeze(_init_fn(cfg.validate())(key, jnp.zeros((1, seq_len), jnp.int32))["params"])


@functools.lru_cache(maxsize=64)
def _init_fn(cfg: ModelCfg):
    return jax.jit(build_model(cfg).init)


def logits(model: LanguageModel, params, tokens_bt) -> jax.Array:
    """A forward pass's logits (b, t, vocab) by one compiled program per model, reused across calls."""
    return _forward_fn(model, False)(params, jnp.asarray(tokens_bt, jnp.int32))


def sown_intermediates(model: LanguageModel, params, tokens_bt) -> dict:
    """The `intermediates` collection a forward pass of `tokens_bt` sows ({} if none), by one
    compiled program per model (op by op, a forward pass would compile every primitive apart)."""
    return _forward_fn(model, True)(params, jnp.asarray(tokens_bt, jnp.int32)).get("intermediates", {})


@functools.lru_cache(maxsize=32)  # modules hash by their config
def _forward_fn(model: LanguageModel, sown: bool):
    if sown:
        return jax.jit(lambda params, tokens: model.apply({"params": params}, tokens, mutable=["intermediates"])[1])
    return jax.jit(lambda params, tokens: model.apply({"params": params}, tokens)[0])
