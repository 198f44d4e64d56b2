"""The train step: updates, metrics, per-step rng, non-finite guard, bf16 compute, vmapped sweeps."""
import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssmgate.train import optim
from ssmgate.train.optim import OptimCfg, make_optimizer
from ssmgate.train.state import TrainState
from ssmgate.train.step import make_eval_step, make_train_step, unhalt

CFG = OptimCfg(name="adamw", lr=1e-2, warmup_steps=2, total_steps=10, weight_decay=0.0)


def init_params():
    return {"dense": {"kernel": jnp.array([[0.5, -1.0], [2.0, 0.0]]), "bias": jnp.zeros(2)}}


def loss_fn(params, batch, rng):
    """Least squares; `batch["eps"]` = 0 makes the loss finite but its gradient 0/0 at a zero weight."""
    pred = batch["x"] @ params["dense"]["kernel"] + params["dense"]["bias"]
    loss = jnp.mean((pred - batch["y"]) ** 2) + jnp.sum(jnp.sqrt(params["dense"]["kernel"] ** 2 + batch["eps"]))
    return loss, {"noise": jax.random.uniform(rng), "dtype_bits": jnp.float32(jnp.finfo(pred.dtype).bits)}


def batch(x_fill=1.0, eps=1.0):
    return {"x": jnp.full((4, 2), x_fill), "y": jnp.ones((4, 2)), "eps": jnp.float32(eps)}


def fresh_state(tx, seed=0):
    return TrainState.create(init_params(), tx, jax.random.key(seed))


def assert_states_equal(a, b):
    chex.assert_trees_all_equal(a, b, strict=True)  # typed keys: the same impl and key data


def test_step_updates_params_and_reports_metrics():
    tx = make_optimizer(CFG)
    step = jax.jit(make_train_step(loss_fn, tx))
    state = fresh_state(tx)
    lrs = []
    for _ in range(3):
        new, metrics = step(state, batch())
        lrs.append(float(metrics["lr"]))
        assert int(metrics["nonfinite"]) == 0 and metrics["nonfinite"].dtype == jnp.int32
        assert int(new.step) == int(state.step) + 1
        state = new
    # the lr metric is the one each update used: peak * (0, 1/2, 1) over the 2-step warmup
    np.testing.assert_allclose(lrs, [0.0, 5e-3, 1e-2], rtol=1e-6)
    assert not np.allclose(state.params["dense"]["kernel"], init_params()["dense"]["kernel"])
    assert set(metrics) == {"loss", "grad_norm", "lr", "nonfinite", "noise", "dtype_bits"}
    assert float(metrics["grad_norm"]) > 0


def test_rng_is_folded_per_step():
    tx = make_optimizer(CFG)
    step = jax.jit(make_train_step(loss_fn, tx))
    state = fresh_state(tx, seed=3)
    noises = []
    for k in range(2):
        state, metrics = step(state, batch())
        noises.append(float(metrics["noise"]))
        assert noises[-1] == float(jax.random.uniform(jax.random.fold_in(jax.random.key(3), k)))
    assert noises[0] != noises[1]


@pytest.mark.parametrize("bad_batch, code", [(batch(x_fill=jnp.nan), 1), (batch(eps=0.0), 2)])
def test_nonfinite_keeps_the_input_state_halted_and_says_why(bad_batch, code):
    tx = make_optimizer(CFG)
    step = jax.jit(make_train_step(loss_fn, tx))
    state, _ = step(fresh_state(tx), batch())  # one good step, so moments and counts are non-zero
    new, metrics = step(state, bad_batch)
    assert int(metrics["nonfinite"]) == code
    assert np.isfinite(float(metrics["loss"])) == (code == 2)
    assert int(new.step) == -2  # halted after 1 update
    assert_states_equal(unhalt(new), state)
    # a halted state ignores later (good) steps, so a loop that reads the flag late still holds it
    later, metrics = step(new, batch())
    assert int(metrics["nonfinite"]) == 0
    assert_states_equal(later, new)


def test_bf16_compute_keeps_float32_params_and_optimizer_state():
    for name in ("adamw", "muon"):
        tx = make_optimizer(dataclasses.replace(CFG, name=name))
        step = jax.jit(make_train_step(loss_fn, tx, compute_dtype=jnp.bfloat16))
        state = fresh_state(tx)
        for _ in range(3):
            state, metrics = step(state, batch())
        assert int(metrics["dtype_bits"]) == 16  # the forward pass ran in bf16
        assert int(metrics["nonfinite"]) == 0
        floats = [x.dtype for x in jax.tree.leaves((state.params, state.opt_state))
                  if jnp.issubdtype(x.dtype, jnp.floating)]
        assert all(d == jnp.float32 for d in floats), floats


def test_create_rejects_bf16_params():
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), init_params())
    with pytest.raises(ValueError, match=r"params must be float32 .* dense/bias: bfloat16"):
        TrainState.create(params, make_optimizer(CFG), jax.random.key(0))


def test_vmapped_step_gives_each_replica_its_lr():
    tx = make_optimizer(CFG)
    step = jax.jit(jax.vmap(make_train_step(loss_fn, tx), in_axes=(0, None)))
    states = jax.vmap(lambda k: TrainState.create(init_params(), tx, k))(jax.random.split(jax.random.key(0), 2))
    states = states.replace(opt_state=optim.set_learning_rate(states.opt_state, jnp.array([1e-3, 1e-2])))
    for _ in range(3):
        states, metrics = step(states, batch())
    np.testing.assert_allclose(metrics["lr"], [1e-3, 1e-2], rtol=1e-6)
    moved = [float(jnp.abs(states.params["dense"]["kernel"][i] - init_params()["dense"]["kernel"]).max())
             for i in range(2)]
    assert moved[1] > 5 * moved[0]


def test_aux_metric_clash_is_an_error():
    tx = make_optimizer(CFG)
    step = make_train_step(lambda p, b, r: (loss_fn(p, b, r)[0], {"lr": 0.0}), tx)
    with pytest.raises(ValueError, match=r"aux metrics \['lr'\] clash"):
        step(fresh_state(tx), batch())


def test_eval_step_uses_state_params_in_compute_dtype():
    metric_fn = lambda params, b: {"loss": loss_fn(params, b, jax.random.key(0))[0],
                                   "dtype_bits": jnp.finfo(params["dense"]["kernel"].dtype).bits}
    state = fresh_state(make_optimizer(CFG))
    out = make_eval_step(metric_fn, compute_dtype=jnp.bfloat16)(state, batch())
    assert out["dtype_bits"] == 16 and np.isfinite(float(out["loss"]))


def _masked_lm_loss(params, batch, rng):
    """A mean over the scored tokens (mask), as the programs' losses are."""
    del rng
    pred = batch.inputs @ params["w"]
    err = jnp.sum((pred - batch.targets) ** 2, axis=-1) * batch.mask
    loss = err.sum() / jnp.maximum(batch.mask.sum(), 1.0)
    return loss, {"scored": batch.mask.sum()}


def test_microbatches_give_the_whole_batchs_update_with_unequal_masks():
    """4 slices of 8 rows whose masks score different numbers of tokens: the same loss, gradient and
    update as the whole batch (to float32 rounding)."""
    from ssmgate.tasks.synthetic_lm import LMBatch
    rng = np.random.default_rng(0)
    f32 = lambda a: jnp.asarray(a, jnp.float32)
    keep = [[0.9], [0.1], [0.5], [1.0], [0.3], [0.7], [0.2], [0.6]]
    b = LMBatch(f32(rng.normal(size=(8, 3, 4))), f32(rng.normal(size=(8, 3, 2))), f32(rng.random((8, 3)) < keep))
    tx = make_optimizer(dataclasses.replace(CFG, clip_norm=0.0))
    state = TrainState.create({"w": f32(rng.normal(size=(4, 2)))}, tx, jax.random.key(0))
    whole = make_train_step(_masked_lm_loss, tx)
    sliced = make_train_step(_masked_lm_loss, tx, microbatches=4)
    (s1, m1), (s2, m2) = jax.jit(whole)(state, b), jax.jit(sliced)(state, b)
    assert float(m1["scored"]) != 0 and float(m2["loss"]) > 0
    np.testing.assert_allclose(m2["loss"], m1["loss"], rtol=1e-6)
    np.testing.assert_allclose(m2["grad_norm"], m1["grad_norm"], rtol=1e-6)
    np.testing.assert_allclose(s2.params["w"], s1.params["w"], rtol=1e-6)
    # an equal-weight mean of the slices' losses would differ: the weights matter here
    per_slice = [float(_masked_lm_loss(state.params, jax.tree.map(lambda x: x[i::4], b), None)[0]) for i in range(4)]
    assert abs(np.mean(per_slice) - float(m1["loss"])) > 1e-3


def test_microbatches_that_do_not_split_the_batch_name_the_flag():
    tx = make_optimizer(CFG)
    step = make_train_step(loss_fn, tx, microbatches=3)
    with pytest.raises(ValueError, match="--mesh_microbatches=3: a batch of 4 rows"):
        step(fresh_state(tx), {"x": jnp.ones((4, 2)), "y": jnp.ones((4, 2)), "eps": jnp.ones((4,))})
