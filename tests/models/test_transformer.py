"""RoPE, causal attention with its KV cache, and the GPT-NeoX / Llama blocks."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssmgate.models.attention import KVCache, SelfAttention, apply_rope, causal_attention, rotary_dim
from ssmgate.models.config import ModelCfg
from ssmgate.models.transformer import GPTNeoXBlock, LlamaBlock, mlp_width


def test_rope_scores_depend_on_relative_position_only():
    q, k = jax.random.normal(jax.random.key(0), (2, 1, 1, 1, 16))
    def score(s, u):
        rq = apply_rope(q, jnp.array([s]), 1.0, 10000.0)
        rk = apply_rope(k, jnp.array([u]), 1.0, 10000.0)
        return float(jnp.sum(rq * rk))
    assert score(7, 3) == pytest.approx(score(104, 100), rel=1e-4)
    assert score(7, 3) == pytest.approx(score(4, 0), rel=1e-4)
    assert score(7, 3) != pytest.approx(score(3, 7), rel=1e-2)  # not symmetric: direction matters


def test_rope_half_split_layout_and_fraction():
    head_dim, fraction = 12, 0.5
    rot = rotary_dim(head_dim, fraction)
    assert rot == 6 and rotary_dim(8, 0.3) == 2 and rotary_dim(8, 0.0) == 0
    x = jax.random.normal(jax.random.key(1), (1, 5, 2, head_dim))
    positions = jnp.arange(5)
    y = apply_rope(x, positions, fraction, 100.0)
    np.testing.assert_array_equal(y[..., rot:], x[..., rot:])  # pass-through channels
    # channel i pairs with i + rot/2 at angle pos * base^(-2i/rot)
    xn, yn = np.asarray(x, np.float64), np.asarray(y, np.float64)
    for i in range(rot // 2):
        ang = np.arange(5)[None, :, None] * 100.0 ** (-2 * i / rot)
        a, b = xn[..., i], xn[..., i + rot // 2]
        np.testing.assert_allclose(yn[..., i], a * np.cos(ang) - b * np.sin(ang), atol=1e-5)
        np.testing.assert_allclose(yn[..., i + rot // 2], b * np.cos(ang) + a * np.sin(ang), atol=1e-5)
    np.testing.assert_array_equal(apply_rope(x, positions, 0.0), x)


def test_causal_attention_matches_numpy_reference():
    q, k, v = jax.random.normal(jax.random.key(2), (3, 2, 5, 3, 4))
    y = np.asarray(causal_attention(q, k, v, 0))
    qn, kn, vn = (np.asarray(a, np.float64) for a in (q, k, v))
    for s in range(5):
        logits = np.einsum("bhk,buhk->bhu", qn[:, s], kn[:, :s + 1]) / 2.0
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        np.testing.assert_allclose(y[:, s], np.einsum("bhu,buhk->bhk", p, vn[:, :s + 1]), atol=1e-5)


@pytest.fixture(scope="module")
def attention():
    mod = SelfAttention(n_heads=2, rotary_fraction=0.5, use_bias=True)
    x = jax.random.normal(jax.random.key(3), (2, 9, 8))
    params = mod.init(jax.random.key(4), x)
    return mod, params, x


def test_attention_is_causal(attention):
    mod, params, x = attention
    y, _ = mod.apply(params, x)
    y2, _ = mod.apply(params, x.at[:, 5:].set(7.0))
    np.testing.assert_array_equal(y[:, :5], y2[:, :5])
    assert not np.allclose(y[:, 5:], y2[:, 5:])


def test_attention_cache_split_equals_whole(attention):
    mod, params, x = attention
    y, whole = mod.apply(params, x)
    assert int(whole.length) == 9 and whole.capacity == 9
    # preallocated cache, three pieces (one a single decoding step)
    cache = KVCache.empty(2, 12, 2, 4)
    pieces = []
    for lo, hi in ((0, 4), (4, 5), (5, 9)):
        out, cache = mod.apply(params, x[:, lo:hi], cache)
        pieces.append(out)
    np.testing.assert_allclose(jnp.concatenate(pieces, 1), y, atol=1e-5)
    assert int(cache.length) == 9
    # prefill without a cache, then grow it
    y1, cache = mod.apply(params, x[:, :6])
    y2, cache = mod.apply(params, x[:, 6:], cache.grow(3))
    np.testing.assert_allclose(jnp.concatenate([y1, y2], 1), y, atol=1e-5)
    # under jit too (the length is traced)
    step = jax.jit(mod.apply)
    y1, cache = step(params, x[:, :6], KVCache.empty(2, 9, 2, 4))
    y2, _ = step(params, x[:, 6:], cache)
    np.testing.assert_allclose(jnp.concatenate([y1, y2], 1), y, atol=1e-5)


def test_attention_cache_overflow_and_shape_errors(attention):
    mod, params, x = attention
    _, full = mod.apply(params, x[:, :4])
    with pytest.raises(ValueError, match="capacity 4 holds 4 tokens"):
        mod.apply(params, x[:, 4:], full)
    with pytest.raises(ValueError, match="expected \\(batch, capacity, heads, head_dim\\)"):
        mod.apply(params, x, KVCache.empty(2, 16, 4, 2))


def _cfg(block, **kw):
    mlp = {"gpt_neox": "gelu", "llama": "swiglu"}[block]
    return ModelCfg(block=block, mlp=mlp, d_model=16, n_heads=4, d_mlp=32, vocab_size=8, **kw).validate()


def _zero(params, sub):
    """params with every leaf under `sub` (a path prefix) set to zero."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: jnp.zeros_like(leaf) if tuple(p.key for p in path[:len(sub)]) == sub else leaf, params)


@pytest.mark.parametrize("block, parallel", [("gpt_neox", True), ("llama", False)])
def test_block_residual_structure(block, parallel):
    """GPT-NeoX: x + attn(LN x) + mlp(LN x) (parallel); Llama: MLP reads x + attn (sequential)."""
    mod = {"gpt_neox": GPTNeoXBlock, "llama": LlamaBlock}[block](_cfg(block))
    x = jax.random.normal(jax.random.key(5), (2, 6, 16))
    params = mod.init(jax.random.key(6), x)
    # N(0, 0.02) projections make both sublayers tiny; scale them to O(1) so their interaction shows
    params = jax.tree_util.tree_map_with_path(
        lambda path, leaf: leaf * 25.0 if path[-1].key == "kernel" else leaf, params)
    y, _ = mod.apply(params, x)
    y_attn, _ = mod.apply(_zero(params, ("params", "mlp", "down")), x)
    y_mlp, _ = mod.apply(_zero(params, ("params", "attn", "out")), x)
    assert np.allclose(y, y_attn + y_mlp - x, atol=1e-5) == parallel


def test_block_parameter_paths():
    x = jnp.zeros((1, 3, 16))
    neox = GPTNeoXBlock(_cfg("gpt_neox")).init(jax.random.key(0), x)["params"]
    llama = LlamaBlock(_cfg("llama")).init(jax.random.key(0), x)["params"]
    shapes = lambda p: {"/".join(k.key for k in path): leaf.shape
                        for path, leaf in jax.tree_util.tree_flatten_with_path(p)[0]}
    assert shapes(neox) == {
        "attn_norm/scale": (16,), "attn_norm/bias": (16,), "mlp_norm/scale": (16,), "mlp_norm/bias": (16,),
        **{f"attn/{n}/{w}": s for n in ("query", "key", "value", "out")
           for w, s in (("kernel", (16, 16)), ("bias", (16,)))},
        "mlp/up/kernel": (16, 32), "mlp/up/bias": (32,), "mlp/down/kernel": (32, 16), "mlp/down/bias": (16,)}
    assert shapes(llama) == {
        "attn_norm/scale": (16,), "mlp_norm/scale": (16,),
        **{f"attn/{n}/kernel": (16, 16) for n in ("query", "key", "value", "out")},
        "mlp/gate/kernel": (16, 32), "mlp/up/kernel": (16, 32), "mlp/down/kernel": (32, 16)}


def test_mlp_default_widths_and_transformer_needs_mlp():
    assert mlp_width(ModelCfg(block="gpt_neox", mlp="gelu", d_model=768)) == 3072
    widths = [mlp_width(ModelCfg(block="llama", mlp="swiglu", d_model=d)) for d in (768, 1024, 2048)]
    assert widths == [2048, 2752, 5504]
    assert mlp_width(ModelCfg(mlp="swiglu", d_model=768, d_mlp=1280)) == 1280
    with pytest.raises(ValueError, match="ModelCfg.mlp='none'.*transformer block needs its MLP"):
        ModelCfg(block="llama", mlp="none").validate()
