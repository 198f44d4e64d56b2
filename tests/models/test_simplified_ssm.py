"""The simplified SSM of protocol §2.2 against its formula (float64 numpy), across its three paths."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssmgate.models.simplified_ssm import SimplifiedSSM, logistic_loss, margins, retention
from ssmgate.tasks import perturbed_labels as pl


def formula_hidden(keys, labels, qpos, lam):
    """h = x~_q + sum_t exp(a (ell - t + 1)) (x_q . x_t) x~_t, positions 1-based, in float64."""
    keys, labels = np.asarray(keys, np.float64), np.asarray(labels, np.float64)
    b, ell, d = keys.shape
    a = -np.exp(lam)
    out = np.zeros((b, d + 1))
    for i in range(b):
        x_q = keys[i, qpos[i]]
        h = np.concatenate([x_q, [0.0]])
        for t in range(1, ell + 1):
            tok = np.concatenate([keys[i, t - 1], [labels[i, t - 1]]])
            h = h + np.exp(a * (ell - t + 1)) * (x_q @ keys[i, t - 1]) * tok
        out[i] = h
    return out


@pytest.fixture(scope="module")
def setup():
    d, ell = 12, 7
    batch = pl.sample_fresh(jax.random.key(0), batch=5, d=d, ell=ell, delta=None)
    model = SimplifiedSSM(d=d, lambda0=-0.7)
    params = model.init(jax.random.key(1), batch)["params"]
    params = {"w": jax.random.normal(jax.random.key(2), (d + 1,)), "log_rate": params["log_rate"]}
    return model, params, batch


def test_init_is_w_zero_and_lambda0():
    m = SimplifiedSSM(d=3, lambda0=1.5)
    p = m.init(jax.random.key(0), pl.sample_fresh(jax.random.key(1), 2, 3, 4, None))["params"]
    np.testing.assert_array_equal(p["w"], np.zeros(4))
    assert float(p["log_rate"]) == 1.5


def test_hidden_state_and_logits_match_formula(setup):
    model, params, batch = setup
    h_ref = formula_hidden(batch.keys, batch.labels, np.asarray(batch.query_pos), float(params["log_rate"]))
    h = model.apply({"params": params}, batch, method="hidden_state")
    np.testing.assert_allclose(h, h_ref, rtol=2e-5, atol=2e-6)
    f = model.apply({"params": params}, batch)
    np.testing.assert_allclose(f, h_ref @ np.asarray(params["w"], np.float64), rtol=2e-5, atol=2e-6)


def test_logits_at_many_queries_equal_single_queries(setup):
    model, params, batch = setup
    pos = jnp.asarray([[0, 3, 6]] * 5)
    many = model.apply({"params": params}, batch.keys, batch.labels, pos, method="logits_at")
    for j in range(3):
        single = model.apply({"params": params}, batch._replace(query_pos=pos[:, j]))
        np.testing.assert_allclose(many[:, j], single, rtol=1e-6, atol=1e-7)


def test_indexed_path_equals_vector_path_with_gradients():
    d, P, ell = 20, 9, 5
    dictionary = pl.make_fixed_keys(jax.random.key(3), d, P)
    ib = pl.sample_fixed(jax.random.key(4), dictionary, batch=6, ell=ell, eps=0.3, delta=None)
    vb = pl.materialize(dictionary, ib)
    model = SimplifiedSSM(d=d)
    params = {"w": jax.random.normal(jax.random.key(5), (d + 1,)), "log_rate": jnp.asarray(0.3)}
    f_idx = model.apply({"params": params}, ib, dictionary.keys)
    f_vec = model.apply({"params": params}, vb)
    np.testing.assert_allclose(f_idx, f_vec, rtol=1e-5, atol=1e-6)

    def loss(p, batch, keys=None):
        return logistic_loss(model.apply({"params": p}, batch, keys), pl.targets(batch))

    g_idx = jax.jit(jax.grad(loss))(params, ib, dictionary.keys)
    g_vec = jax.jit(jax.grad(loss))(params, vb)
    for k in params:
        np.testing.assert_allclose(g_idx[k], g_vec[k], rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="keys_pd"):
        model.apply({"params": params}, ib)


def test_gradients_match_the_formula_in_float64(setup):
    """jax.grad through the cores (f32) against a float64 finite difference of the formula."""
    model, params, batch = setup
    target = np.asarray(pl.targets(batch), np.float64)
    qpos = np.asarray(batch.query_pos)

    def ref_loss(w, lam):
        f = formula_hidden(batch.keys, batch.labels, qpos, lam) @ w
        return np.mean(np.logaddexp(0, -target * f))

    g = jax.grad(lambda p: logistic_loss(model.apply({"params": p}, batch), pl.targets(batch)))(params)
    w0, lam0, eps = np.asarray(params["w"], np.float64), float(params["log_rate"]), 1e-6
    fd_lam = (ref_loss(w0, lam0 + eps) - ref_loss(w0, lam0 - eps)) / (2 * eps)
    np.testing.assert_allclose(float(g["log_rate"]), fd_lam, rtol=1e-4, atol=1e-7)
    e3 = np.eye(len(w0))[3] * eps
    fd_w3 = (ref_loss(w0 + e3, lam0) - ref_loss(w0 - e3, lam0)) / (2 * eps)
    np.testing.assert_allclose(float(g["w"][3]), fd_w3, rtol=1e-4, atol=1e-7)


def test_margins_and_retention():
    keys = jnp.eye(4)[:3] * 1.0  # orthonormal keys
    labels = jnp.asarray([1.0, -1.0, 1.0])
    w = jnp.asarray([0.5, -0.5, 0.5, 0.0, 2.0])  # u = y_i (w_x . x_i) = 0.5 for every key
    lam = jnp.log(jnp.log(1 / 0.2) / 4)  # alpha_4 = 0.2
    np.testing.assert_allclose(retention(lam, 4), 0.2, rtol=1e-6)
    dm, dr = margins({"w": w, "log_rate": lam}, keys, labels, 4)
    np.testing.assert_allclose([dm, dr], [1.2 * 0.5, 0.2 * 2.0], rtol=1e-6)
