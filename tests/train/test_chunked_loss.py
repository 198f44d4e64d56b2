"""The text loss scored in chunks (--mesh_loss_chunk) gives text_loss's values and gradients, for
tied and untied heads, odd lengths and masks, and keeps the whole sequence's logits out of memory."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssmgate.config_error import ConfigError
from ssmgate.models.config import ModelCfg
from ssmgate.models.lm import build_model, init_params
from ssmgate.tasks.synthetic_lm import LMBatch
from ssmgate.train.chunked_loss import chunked_text_loss
from ssmgate.train.lm_runs import lm_loss_fn, text_loss
from ssmgate.train.mesh import MeshCfg

V = 37


def text_batch(seed: int, b: int, t: int) -> LMBatch:
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    inputs = jax.random.randint(k1, (b, t), 0, V)
    mask = (jax.random.uniform(k3, (b, t)) < 0.7).astype(jnp.float32)  # some positions unscored
    return LMBatch(inputs, jax.random.randint(k2, (b, t), 0, V), mask)


@pytest.mark.parametrize("t,chunk", [(13, 4), (13, 13), (13, 32), (16, 1)])
def test_values_and_gradients_equal_text_loss(t, chunk):
    """Odd lengths (the last chunk padded), one chunk, a chunk longer than the sequence, chunk 1."""
    k1, k2 = jax.random.split(jax.random.key(0))
    h = jax.random.normal(k1, (3, t, 8), jnp.float32)
    head = jax.random.normal(k2, (8, V), jnp.float32)
    batch = text_batch(1, 3, t)

    def whole(h, head):
        return text_loss(jnp.einsum("btd,dv->btv", h, head), batch)

    def chunked(h, head):
        return chunked_text_loss(h, head, batch, chunk)

    (l0, m0), g0 = jax.value_and_grad(whole, argnums=(0, 1), has_aux=True)(h, head)
    (l1, m1), g1 = jax.jit(jax.value_and_grad(chunked, argnums=(0, 1), has_aux=True))(h, head)
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    assert set(m1) == set(m0)
    for name in m0:
        np.testing.assert_allclose(m1[name], m0[name], rtol=1e-6, err_msg=name)
    for a, b in zip(g0, g1):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("cfg", [
    ModelCfg(block="mamba3", vocab_size=V, d_model=16, n_layers=1, d_state=8, headdim=8),   # tied head
    ModelCfg(block="llama", mlp="swiglu", vocab_size=V, d_model=16, n_layers=1, n_heads=2,
             tie_embeddings=False),                                                      # lm_head/kernel
], ids=["tied", "untied"])
def test_model_loss_in_chunks_equals_the_whole_logits(cfg):
    """Through the train step's loss_fn: the model's final hidden states and head, in chunks of 4
    positions, give the loss, metrics and parameter gradients of the logits at once."""
    model = build_model(cfg)
    params = init_params(cfg, jax.random.key(0))
    batch = text_batch(2, 2, 11)
    outs = [jax.jit(jax.value_and_grad(lm_loss_fn(model, text_loss, chunk), has_aux=True))(params, batch, None)
            for chunk in (0, 4)]
    (l0, m0), g0 = outs[0]
    (l1, m1), g1 = outs[1]
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    for name in m0:
        np.testing.assert_allclose(m1[name], m0[name], rtol=1e-6, err_msg=name)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7), g0, g1)


def test_chunks_keep_the_sequence_logits_out_of_memory():
    """The compiled gradient's temporaries: the whole (b, t, vocab) float32 logits are several
    arrays at once in text_loss's backward; chunked, about one chunk's."""
    b, t, d, vocab = 2, 512, 32, 8192
    h = jax.ShapeDtypeStruct((b, t, d), jnp.float32)
    head = jax.ShapeDtypeStruct((d, vocab), jnp.float32)
    tokens = jax.ShapeDtypeStruct((b, t), jnp.int32)
    batch = LMBatch(tokens, tokens, jax.ShapeDtypeStruct((b, t), jnp.float32))
    logits_bytes = b * t * vocab * 4

    def temp_bytes(loss):
        grad = jax.jit(jax.grad(lambda h, head, batch: loss(h, head, batch)[0], argnums=(0, 1)))
        return grad.lower(h, head, batch).compile().memory_analysis().temp_size_in_bytes

    whole = temp_bytes(lambda h, head, batch: text_loss(jnp.einsum("btd,dv->btv", h, head), batch))
    chunked = temp_bytes(lambda h, head, batch: chunked_text_loss(h, head, batch, 32))
    assert whole >= logits_bytes
    assert chunked < logits_bytes / 4, (chunked, logits_bytes)


def test_bad_chunk_and_other_losses_are_refused():
    with pytest.raises(ValueError, match="mesh_loss_chunk=-1"):
        MeshCfg(loss_chunk=-1).validate()
    with pytest.raises(ValueError, match="mesh_loss_chunk=0"):
        chunked_text_loss(jnp.zeros((1, 2, 4)), jnp.zeros((4, V)), text_batch(0, 1, 2), 0)
    model = build_model(ModelCfg(block="mamba3", vocab_size=V, d_model=16, n_layers=1, d_state=8, headdim=8))

    def horn_loss(logits, batch):
        return logits.mean(), {}
    with pytest.raises(ConfigError, match="horn_loss.*expected --mesh_loss_chunk=0"):
        lm_loss_fn(model, horn_loss, 8)
