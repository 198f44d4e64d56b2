"""The vmapped SGD loops: exact updates, frozen leaves, segments, early stop, non-finite losses."""
import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.train.sgd_sweep import UntilState, sgd_run, sgd_until


def quad_loss(params, batch):
    """0.5 * |w - batch|^2 + 0.5 * c^2: gradient w - batch on w, c on c."""
    return 0.5 * jnp.sum((params["w"] - batch) ** 2) + 0.5 * params["c"] ** 2


def batch_fn(key, k):
    return jax.random.normal(jax.random.fold_in(key, k), (3,))


def test_sgd_run_is_plain_sgd_and_respects_frozen_leaves():
    params = {"w": jnp.zeros(3), "c": jnp.asarray(2.0)}
    key = jax.random.key(0)
    out, bad, hist = sgd_run(quad_loss, params, jnp.asarray(-1), batch_fn, key, 0, lr=0.5, steps=4,
                             trainable={"c": False}, metrics_fn=lambda p: {"w0": p["w"][0]})
    w = np.zeros(3)
    for k in range(4):
        w = w - 0.5 * (w - np.asarray(batch_fn(key, k)))
    np.testing.assert_allclose(out["w"], w, rtol=1e-6)
    assert float(out["c"]) == 2.0 and int(bad) == -1
    assert hist["loss"].shape == (4,)
    np.testing.assert_allclose(hist["w0"][-1], w[0], rtol=1e-6)


def test_segments_equal_one_run():
    params = {"w": jnp.ones(3), "c": jnp.asarray(1.0)}
    key = jax.random.key(1)
    whole, _, _ = sgd_run(quad_loss, params, jnp.asarray(-1), batch_fn, key, 0, lr=0.1, steps=6)
    half, bad, _ = sgd_run(quad_loss, params, jnp.asarray(-1), batch_fn, key, 0, lr=0.1, steps=3)
    half, bad, _ = sgd_run(quad_loss, half, bad, batch_fn, key, 3, lr=0.1, steps=3)
    for k in whole:
        np.testing.assert_allclose(half[k], whole[k], rtol=1e-6)


def test_nonfinite_loss_is_reported_and_freezes_the_replica():
    def loss(params, batch):
        return quad_loss(params, batch) * jnp.where(params["c"] < 0.2, jnp.nan, 1.0)

    params = {"w": jnp.zeros(3), "c": jnp.asarray(1.0)}
    out, bad, _ = sgd_run(loss, params, jnp.asarray(-1), batch_fn, jax.random.key(2), 0, lr=0.5, steps=10)
    # c halves every step: 1, .5, .25, .125 -> the loss at step 3 is NaN.
    assert int(bad) == 3
    np.testing.assert_allclose(out["c"], 0.125)


def test_sgd_until_stops_each_replica_at_its_own_step():
    # With lr 0.5, c_k = c_0 / 2^k; stop when c < 0.1: c0 = 1 -> after 4 steps, c0 = 0.05 -> after 1.
    def run(c0):
        state = UntilState({"w": jnp.zeros(3), "c": c0}, jnp.asarray(-1), jnp.asarray(-1))
        return sgd_until(quad_loss, state, batch_fn, jax.random.key(3), 0, lr=0.5, steps=50,
                         stop_fn=lambda p: p["c"] < 0.1)

    out = jax.jit(jax.vmap(run))(jnp.asarray([1.0, 0.05, 3.0]))
    np.testing.assert_array_equal(out.stopped, [4, 1, 5])
    np.testing.assert_allclose(out.params["c"], [1 / 16, 0.025, 3 / 32])


def test_sgd_until_in_segments_equals_one_loop():
    state = UntilState({"w": jnp.zeros(3), "c": jnp.asarray(5.0)}, jnp.asarray(-1), jnp.asarray(-1))
    run = jax.jit(lambda s, start, n: sgd_until(quad_loss, s, batch_fn, jax.random.key(4), start, steps=n, lr=0.25,
                                                stop_fn=lambda p: p["c"] < 0.5))
    whole = run(state, 0, 100)
    part = state
    for start in range(0, 100, 3):
        part = run(part, start, 3)
    assert int(whole.stopped) == int(part.stopped) == 9
    np.testing.assert_allclose(part.params["w"], whole.params["w"], rtol=1e-6)
