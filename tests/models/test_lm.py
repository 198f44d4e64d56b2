"""The LM stack: causality, cache continuation, tied/untied heads, parameter paths, bf16."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssmgate.models.config import ModelCfg
from ssmgate.models.lm import build_model, init_params

V = 11
# Tiny models of each block; SSM mixers on the sequential core (cheapest to compile).
CFGS = {
    "gpt_neox": ModelCfg(block="gpt_neox", mlp="gelu", vocab_size=V, d_model=16, n_layers=2, n_heads=2,
                         rotary_fraction=0.5),
    "llama": ModelCfg(block="llama", mlp="swiglu", vocab_size=V, d_model=16, n_layers=2, n_heads=2),
    "mamba2": ModelCfg(block="mamba2", vocab_size=V, d_model=16, n_layers=1, d_state=8, headdim=8,
                       algorithm="sequential"),
    "mamba3": ModelCfg(block="mamba3", vocab_size=V, d_model=16, n_layers=1, d_state=8, headdim=8, mimo_rank=2,
                       mlp="swiglu", d_mlp=24, algorithm="sequential"),
}


@functools.lru_cache(maxsize=None)
def built(name):
    cfg = CFGS[name]
    model = build_model(cfg)
    params = jax.jit(lambda key: init_params(cfg, key, seq_len=4))(jax.random.key(0))
    return model, params, jax.jit(model.apply)


def tokens(seed, t=10):
    return jax.random.randint(jax.random.key(seed), (2, t), 0, V)


@pytest.mark.parametrize("name", list(CFGS))
def test_future_tokens_do_not_change_past_logits(name):
    model, params, apply = built(name)
    tok = tokens(1)
    logits, _ = apply({"params": params}, tok)
    assert logits.shape == (2, 10, V) and logits.dtype == jnp.float32
    changed, _ = apply({"params": params}, tok.at[:, 6:].set((tok[:, 6:] + 1) % V))
    np.testing.assert_allclose(changed[:, :6], logits[:, :6], atol=1e-6)
    assert np.abs(changed[:, 6:] - logits[:, 6:]).max() > 1e-4


@pytest.mark.parametrize("name", list(CFGS))
def test_two_pieces_equal_one_run(name):
    model, params, apply = built(name)
    tok = tokens(2)
    whole, _ = apply({"params": params}, tok)
    cache = model.init_cache(2, capacity=10)
    first, cache = apply({"params": params}, tok[:, :7], cache)
    second, cache = apply({"params": params}, tok[:, 7:], cache)
    assert len(cache) == CFGS[name].n_layers
    np.testing.assert_allclose(jnp.concatenate([first, second], 1), whole, atol=2e-5)


def test_ssm_cache_from_a_plain_run_continues_it():
    model, params, apply = built("mamba2")
    tok = tokens(3)
    whole, _ = apply({"params": params}, tok)
    first, cache = apply({"params": params}, tok[:, :4])
    second, _ = apply({"params": params}, tok[:, 4:], cache)
    np.testing.assert_allclose(jnp.concatenate([first, second], 1), whole, atol=2e-5)


def _paths(params):
    return {"/".join(k.key for k in path): leaf.shape for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}


def test_parameter_paths():
    neox, mamba3 = _paths(built("gpt_neox")[1]), _paths(built("mamba3")[1])
    assert neox["embed/embedding"] == (V, 16) and neox["final_norm/bias"] == (16,)
    assert {"layers_0/attn/query/kernel", "layers_1/mlp/up/bias", "layers_1/attn_norm/scale"} <= set(neox)
    assert "layers_2/attn/query/kernel" not in neox and "lm_head/kernel" not in neox
    assert {"layers_0/norm/scale", "layers_0/mixer/in_proj/kernel", "layers_0/mixer/dt_bias",
            "layers_0/mlp_norm/scale", "layers_0/mlp/gate/kernel", "final_norm/scale"} <= set(mamba3)
    assert mamba3["layers_0/mlp/down/kernel"] == (24, 16)
    mamba2 = _paths(built("mamba2")[1])
    assert "layers_0/mixer/A_log" in mamba2 and not any("mlp" in p for p in mamba2)
    assert isinstance(built("mamba2")[1], dict)


def test_tied_head_is_the_embedding_transpose():
    """An untied model whose head is E^T gives the tied model's logits."""
    cfg = CFGS["llama"]
    tied_params = built("llama")[1]
    untied = cfg.replace(tie_embeddings=False)
    untied_params = init_params(untied, jax.random.key(0), seq_len=4)
    assert untied_params["lm_head"]["kernel"].shape == (16, V)
    assert set(_paths(untied_params)) - set(_paths(tied_params)) == {"lm_head/kernel"}
    untied_params = {**tied_params, "lm_head": {"kernel": tied_params["embed"]["embedding"].T}}
    tok = tokens(4)
    np.testing.assert_allclose(build_model(untied).apply({"params": untied_params}, tok)[0],
                               built("llama")[2]({"params": tied_params}, tok)[0], atol=1e-6)


@pytest.mark.parametrize("name", ["llama", "mamba3"])
def test_bfloat16_forward_is_finite_and_close(name):
    _, params, apply = built(name)
    tok = tokens(5)
    ref, _ = apply({"params": params}, tok)
    bf16 = CFGS[name].replace(dtype="bfloat16")
    logits, _ = jax.jit(build_model(bf16).apply)({"params": params}, tok)
    assert logits.dtype == jnp.float32 and bool(jnp.isfinite(logits).all())
    np.testing.assert_allclose(logits, ref, atol=0.05 * float(jnp.abs(ref).max()) + 1e-3)


def test_bad_inputs_are_named():
    model, params, _ = built("llama")
    with pytest.raises(ValueError, match="expected integer \\(batch, time\\)"):
        model.apply({"params": params}, jnp.zeros((2, 3)))
    with pytest.raises(ValueError, match="cache has 1 entries; expected one per layer \\(2\\)"):
        model.apply({"params": params}, tokens(0), [None])


@pytest.mark.parametrize("name", ["llama", "mamba3"])
def test_remat_keeps_parameters_outputs_and_gradients(name):
    """Rematerialisation recomputes each layer in the backward pass: same parameter tree, same
    logits and gradients; the remat program has the checkpoint in its backward."""
    model, params, apply = built(name)
    remat = model.clone(remat=True)
    tok = tokens(4)
    assert jax.tree.structure(remat.init(jax.random.key(0), tok[:, :4])["params"]) == jax.tree.structure(params)

    def loss(m, p):
        return jnp.mean(m.apply({"params": p}, tok)[0] ** 2)

    np.testing.assert_allclose(jax.jit(remat.apply)({"params": params}, tok)[0], apply({"params": params}, tok)[0],
                               atol=1e-6)
    plain, again = (jax.jit(jax.grad(functools.partial(loss, m)))(params) for m in (model, remat))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), plain, again)
    assert "remat" in str(jax.make_jaxpr(jax.grad(functools.partial(loss, remat)))(params))
    assert "remat" not in str(jax.make_jaxpr(jax.grad(functools.partial(loss, model)))(params))
