"""Optimisers: schedule values, equivalence with plain optax, the Muon/decay masks, lr injection."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ssmgate.train import optim
from ssmgate.train.optim import OptimCfg, make_optimizer


def lm_like_params(key=0):
    """A Mamba-2-like LM's param paths and shapes (small)."""
    k = iter(jax.random.split(jax.random.key(key), 16))
    n = lambda *s: jax.random.normal(next(k), s)
    return {"embed": {"embedding": n(16, 8)},
            "layers_0": {"mixer": {"in_proj": {"kernel": n(8, 12)}, "out_proj": {"kernel": n(12, 8)},
                                   "conv": {"kernel": n(4, 12), "bias": n(12)},
                                   "A_log": n(2), "dt_bias": n(2), "D": n(2), "norm": {"scale": n(12)},
                                   "static_angle": n(2, 3)},
                         "norm": {"scale": n(8)}},
            "lm_head": {"kernel": n(8, 16)}}


def grads_like(params, seed):
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(treedef, [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])


def run(tx, params, steps):
    state = tx.init(params)
    update = jax.jit(tx.update)
    for i in range(steps):
        updates, state = update(grads_like(params, i), state, params)
        params = optax.apply_updates(params, updates)
    return params, state


def test_schedule_warmup_cosine_floor_and_flat_tail():
    cfg = OptimCfg(warmup_steps=10, total_steps=110, final_lr_frac=0.1)
    m = optim.schedule_multiplier(cfg)
    np.testing.assert_allclose([m(0), m(5), m(10)], [0.0, 0.5, 1.0], atol=1e-7)
    np.testing.assert_allclose(m(60), 0.55, rtol=1e-6)  # cosine midpoint: (1 + floor) / 2
    np.testing.assert_allclose([m(110), m(500)], [0.1, 0.1], rtol=1e-6)
    ref = optax.warmup_cosine_decay_schedule(0.0, 1.0, 10, 110, end_value=0.1)
    steps = jnp.arange(0, 130)
    np.testing.assert_allclose(jax.vmap(m)(steps), jax.vmap(ref)(steps), atol=1e-6)


def test_schedule_without_warmup_starts_at_peak():
    m = optim.schedule_multiplier(OptimCfg(warmup_steps=0, total_steps=100, final_lr_frac=0.0))
    np.testing.assert_allclose([m(0), m(100)], [1.0, 0.0], atol=1e-7)


@pytest.mark.parametrize("change, match", [
    (dict(name="adam"), r"OptimCfg.name='adam': expected one of \('sgd', 'adamw', 'muon'\)"),
    (dict(warmup_steps=20, total_steps=10),
     r"OptimCfg.warmup_steps=20: expected an integer in \[0, total_steps = 10\]"),
    (dict(final_lr_frac=1.5), r"final_lr_frac=1.5: expected a value in \[0, 1\]"),
    (dict(lr=0.0), r"OptimCfg.lr=0.0: expected a value > 0"),
    (dict(b2=1.0), r"OptimCfg.b2=1.0"),
    (dict(muon_adam_lr=-1.0), r"muon_adam_lr=-1.0"),
])
def test_validate_names_field_value_and_allowed(change, match):
    with pytest.raises(ValueError, match=match):
        make_optimizer(OptimCfg(**change))


@pytest.mark.parametrize("decay_all", [False, True])
def test_adamw_equals_optax_adamw_with_the_schedule_as_lr(decay_all):
    cfg = OptimCfg(name="adamw", lr=1e-2, warmup_steps=2, total_steps=6, final_lr_frac=0.1,
                   weight_decay=0.3, clip_norm=1.0, decay_all=decay_all)
    params = lm_like_params()
    schedule = lambda t: cfg.lr * optim.schedule_multiplier(cfg)(t)
    ref = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay,
                                  mask=None if decay_all else optim.decay_mask))
    ours, _ = run(make_optimizer(cfg), params, 8)
    theirs, _ = run(ref, params, 8)
    chex.assert_trees_all_close(ours, theirs, rtol=2e-6, atol=1e-7)
    assert not np.allclose(ours["embed"]["embedding"], params["embed"]["embedding"])


def test_muon_mask_hidden_matrices_only():
    mask = optim.muon_mask(lm_like_params())
    mixer = mask["layers_0"]["mixer"]
    assert mixer["in_proj"]["kernel"] and mixer["out_proj"]["kernel"]
    assert not mask["embed"]["embedding"] and not mask["lm_head"]["kernel"]
    assert not mixer["conv"]["kernel"] and not mixer["static_angle"]  # 2-D, but no linear maps
    assert not any(jax.tree.leaves([mixer["A_log"], mixer["dt_bias"], mixer["D"], mixer["norm"],
                                    mixer["conv"]["bias"], mask["layers_0"]["norm"]]))


@pytest.mark.parametrize("name", ["adamw", "muon", "sgd"])
def test_weight_decay_is_lr_times_wd_times_param_on_kernels_and_embedding_only(name):
    """Decay on vs off changes the first update by exactly -lr * wd * p (sgd: through the lr only)
    on kernels and the embedding, and not at all on norms, biases and gate parameters."""
    params = lm_like_params()
    grads = grads_like(params, 0)
    base = dict(name=name, lr=1e-2, warmup_steps=0, clip_norm=0.0)
    on, off = (make_optimizer(OptimCfg(**base, weight_decay=wd)) for wd in (0.5, 0.0))
    u_on, _ = on.update(grads, on.init(params), params)
    u_off, _ = off.update(grads, off.init(params), params)
    decayed = optim.decay_mask(params)

    def check(path, d, a, b, p):
        expected = -1e-2 * 0.5 * p if d else jnp.zeros_like(p)
        np.testing.assert_allclose(a - b, expected, atol=1e-6, err_msg=str(path))

    jax.tree_util.tree_map_with_path(check, decayed, u_on, u_off, params)


def test_muon_orthogonalises_hidden_matrices_and_adamw_elsewhere():
    params = lm_like_params()
    cfg = OptimCfg(name="muon", lr=1.0, warmup_steps=0, weight_decay=0.0, clip_norm=0.0, muon_adam_lr=0.5)
    tx = make_optimizer(cfg)
    updates, _ = tx.update(grads_like(params, 0), tx.init(params), params)
    singular = jnp.linalg.svd(updates["layers_0"]["mixer"]["in_proj"]["kernel"], compute_uv=False)
    assert float(singular.max() / singular.min()) < 2.0  # Newton-Schulz: near-equal singular values
    # AdamW group at muon_adam_lr: Adam's first (nesterov) step has |update| ~ lr per entry
    a_log = updates["layers_0"]["mixer"]["A_log"]
    assert 0.3 < float(jnp.abs(a_log).max()) <= 0.5 * 2


def test_get_set_learning_rate_and_current_lr():
    cfg = OptimCfg(lr=3e-4, warmup_steps=4, total_steps=10)
    tx = make_optimizer(cfg)
    params = lm_like_params()
    _, state = run(tx, params, 3)
    assert float(optim.get_learning_rate(state)) == pytest.approx(3e-4)
    # after 3 updates the latest one used count 2: peak * 2 / 4
    assert float(optim.current_learning_rate(state)) == pytest.approx(3e-4 * 0.5)
    state = optim.set_learning_rate(state, 1e-3)
    assert float(optim.get_learning_rate(state)) == pytest.approx(1e-3)
    assert optim.get_learning_rate(state).dtype == jnp.float32
    with pytest.raises(ValueError, match=r"learning rate of shape \(3,\): expected a scalar or shape \(\)"):
        optim.set_learning_rate(state, jnp.ones(3))
    with pytest.raises(ValueError, match="no 'learning_rate'"):
        optim.get_learning_rate(optax.adam(1e-3).init(params))


@pytest.mark.parametrize("name", ["adamw", "muon", "sgd"])
def test_two_lrs_in_one_vmapped_update(name):
    tx = make_optimizer(OptimCfg(name=name, lr=1e-3, warmup_steps=0, weight_decay=0.0, clip_norm=0.0))
    params = lm_like_params()
    stack = lambda t: jax.tree.map(lambda x: jnp.stack([x, x]), t)
    states = optim.set_learning_rate(stack(tx.init(params)), jnp.array([1e-3, 1e-2]))
    updates, states = jax.jit(jax.vmap(tx.update))(stack(grads_like(params, 0)), states, stack(params))
    np.testing.assert_allclose(optim.current_learning_rate(states), [1e-3, 1e-2], rtol=1e-6)
    # every update is linear in the lr at the first step
    jax.tree.map(lambda u: np.testing.assert_allclose(u[1], 10 * u[0], rtol=1e-5, atol=1e-9), updates)


@pytest.mark.parametrize("name", ["adamw", "muon", "sgd"])
def test_optimizer_state_is_float32(name):
    tx = make_optimizer(OptimCfg(name=name, momentum=0.9))
    state = tx.init(lm_like_params())
    floats = [x.dtype for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert floats and all(d == jnp.float32 for d in floats)
