"""The training loop in process: a planted NaN, a corrupted checkpoint, resume, and a sweep of K
replicas against K separate runs."""
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssmgate.train import loop, sweep
from ssmgate.train.optim import OptimCfg, make_optimizer, set_learning_rate
from ssmgate.train.run_dir import RunDir
from ssmgate.train.state import TrainState
from ssmgate.train.step import make_train_step

D = 6


def loss_fn(params, batch, rng):
    del rng
    pred = jnp.tanh(batch["x"] @ params["w1"]["kernel"]) @ params["w2"]["kernel"]
    loss = jnp.mean((pred - batch["y"]) ** 2)
    return loss, {"mse": loss}


def init_params(key, offset=0.0):
    k1, k2 = jax.random.split(key)
    return {"w1": {"kernel": jax.random.normal(k1, (D, 8)) / 3 + offset},
            "w2": {"kernel": jax.random.normal(k2, (8, 1)) / 3}}


def batch_of(seed, k, nan_at=None):
    key = jax.random.fold_in(jax.random.PRNGKey(seed), k)
    x = jax.random.normal(key, (16, D))
    y = jnp.sin(x.sum(axis=1, keepdims=True))
    if nan_at is not None:
        x = jnp.where(k == nan_at, jnp.nan, x)
    return {"x": x, "y": y}


TX = make_optimizer(OptimCfg(name="adamw", lr=1e-2, total_steps=12, warmup_steps=2, weight_decay=0.0))


def single(seed=0, lr=1e-2):
    def init():
        k_init, k_rng = jax.random.split(jax.random.PRNGKey(seed))
        s = TrainState.create(init_params(k_init), TX, k_rng)
        return s.replace(opt_state=set_learning_rate(s.opt_state, lr))
    return init


def run_single(path, steps=12, nan_at=None, ckpt_every=4, seed=0, lr=1e-2):
    init = single(seed, lr)
    step = jax.jit(make_train_step(loss_fn, TX))
    cfg = loop.LoopCfg(steps=steps, log_every=2, ckpt_every=ckpt_every, tensorboard=False)
    return loop.run(RunDir(path), cfg, init_state=init, abstract_state=jax.eval_shape(init), step_fn=step,
                    batch_fn=lambda k: batch_of(seed, k, nan_at), meta={}, fingerprint="f")


def records(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def replica(tree, r):
    """Replica r of a sweep's stacked pytree."""
    return jax.tree.map(lambda a: a[r], tree)


def test_planted_nan_stops_with_step_quantity_and_keeps_last_good_state(tmp_path):
    with pytest.raises(loop.TrainingDiverged) as err:
        run_single(tmp_path, nan_at=6)
    assert "step 7: the loss is not finite" in str(err.value) and "step 6" in str(err.value)
    assert (tmp_path / "checkpoints" / "6").is_dir()
    assert records(tmp_path)[-1] == {"step": 7, "kind": "error", "error": "step 7: the loss is not finite"}
    good = run_single(tmp_path / "ref", steps=6)  # the same run stopped before the NaN
    restored = loop.Checkpointer(tmp_path / "checkpoints").restore(jax.eval_shape(single()))[1]
    chex.assert_trees_all_equal(restored.params, good.state.params, strict=True)


def test_resume_after_interruption_is_bit_identical_and_drops_later_metrics(tmp_path):
    full = run_single(tmp_path / "full")
    part = tmp_path / "part"
    run_single(part, steps=12, ckpt_every=4)
    # Simulate a kill after step 9: keep checkpoints <= 8 and the metrics written up to step 10.
    import shutil
    shutil.rmtree(part / "checkpoints" / "12")
    lines = [r for r in records(part) if r["step"] <= 10]
    (part / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    resumed = run_single(part)
    assert resumed.resumed_from == 8
    chex.assert_trees_all_equal(resumed.state, full.state, strict=True)
    steps = [r["step"] for r in records(part) if r["kind"] == "train"]
    assert steps == [2, 4, 6, 8, 10, 12]  # step 10 was written once again after the resume, not twice


def test_corrupted_latest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    full = run_single(tmp_path / "full")
    part = tmp_path / "part"
    run_single(part)
    for f in (part / "checkpoints" / "12").rglob("*"):
        if f.is_file() and f.stat().st_size > 0:
            f.write_bytes(b"garbage")
    resumed = run_single(part)
    assert resumed.resumed_from == 8
    chex.assert_trees_all_equal(resumed.state, full.state, strict=True)


def test_fingerprint_mismatch_refuses_to_resume(tmp_path):
    run_single(tmp_path, steps=4)
    init = single()
    cfg = loop.LoopCfg(steps=8, log_every=2, tensorboard=False)
    with pytest.raises(loop.CheckpointError, match="fingerprint"):
        loop.run(RunDir(tmp_path), cfg, init_state=init, abstract_state=jax.eval_shape(init),
                 step_fn=jax.jit(make_train_step(loss_fn, TX)), batch_fn=lambda k: batch_of(0, k), meta={},
                 fingerprint="other")


def test_sweep_of_k_replicas_equals_k_separate_runs(tmp_path):
    replicas = sweep.grid(seeds=[0, 1], lrs=[1e-2, 3e-3])
    state = sweep.init_sweep(replicas, init_params, TX)
    vstep = jax.jit(sweep.sweep_step(make_train_step(loss_fn, TX)))
    seeds = jnp.array([r.seed for r in replicas])
    batch_k = jax.jit(lambda k: jax.vmap(lambda s: batch_of(s, k))(seeds))
    cfg = loop.LoopCfg(steps=12, log_every=4, tensorboard=False)
    result = loop.run(RunDir(tmp_path / "sweep"), cfg, init_state=lambda: state, abstract_state=jax.eval_shape(lambda: state),
                      step_fn=vstep, batch_fn=batch_k, meta={}, fingerprint="s")
    for r, rep in enumerate(replicas):
        one = run_single(tmp_path / f"r{r}", seed=rep.seed, lr=rep.lr)
        chex.assert_trees_all_close(replica(result.state.train.params, r), one.state.params, rtol=1e-5, atol=1e-7)


def test_replica_vmap_runs_one_replica_unbatched_with_the_results_of_vmap():
    @jax.custom_batching.custom_vmap
    def batched_marker(v):  # 0 when traced unbatched, 1 under vmap
        return jnp.zeros(())

    @batched_marker.def_vmap
    def _(axis_size, in_batched, v):
        return jnp.ones((axis_size,)), True

    def fn(params, x):
        return {"y": jnp.tanh(x @ params["w"]), "n": jnp.sum(params["w"]), "vmapped": batched_marker(params["w"])}

    params = {"w": jax.random.normal(jax.random.PRNGKey(0), (3, D, 2))}
    x = jax.random.normal(jax.random.PRNGKey(1), (5, D))
    for k in (1, 3):
        p_k = jax.tree.map(lambda a: a[:k], params)
        got = jax.jit(sweep.replica_vmap(fn, (0, None)))(p_k, x)
        want = jax.vmap(fn, (0, None))(p_k, x)
        assert np.asarray(got["vmapped"]).tolist() == [0.0 if k == 1 else 1.0] * k  # one replica runs unbatched
        chex.assert_trees_all_equal_shapes(got, want)
        chex.assert_shape(got["y"], (k, 5, 2))
        for name in ("y", "n"):
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6)
    with pytest.raises(ValueError, match="2 arguments but in_axes"):
        sweep.replica_vmap(fn, (0,))(params, x)


def test_sweep_of_one_replica_equals_the_single_run(tmp_path):
    replicas = sweep.grid(seeds=[1], lrs=[3e-3])
    state = sweep.init_sweep(replicas, init_params, TX)
    vstep = jax.jit(sweep.sweep_step(make_train_step(loss_fn, TX)))
    for k in range(12):
        state, metrics = vstep(state, jax.tree.map(lambda a: a[None], batch_of(1, k)))
    chex.assert_shape(metrics["active"], (1,))
    one = run_single(tmp_path / "r", seed=1, lr=3e-3)
    chex.assert_tree_shape_prefix(state.train.params, (1,))
    chex.assert_trees_all_close(replica(state.train.params, 0), one.state.params, rtol=1e-5, atol=1e-7, strict=True)


def test_sweep_freezes_a_diverged_replica_and_stops_replicas_by_rule():
    replicas = sweep.grid(seeds=[0], lrs=[1e-2, 1e-2])
    state = sweep.init_sweep(replicas, init_params, TX)
    step = sweep.sweep_step(make_train_step(loss_fn, TX))
    x = jnp.stack([batch_of(0, 0)["x"], jnp.full((16, D), jnp.nan)])
    batch = {"x": x, "y": jnp.stack([batch_of(0, 0)["y"]] * 2)}
    new, _ = jax.jit(step)(state, batch)
    new, _ = jax.jit(step)(new, batch)  # the first step of the warmup has lr 0
    assert np.asarray(new.diverged).tolist() == [False, True] and np.asarray(new.active).tolist() == [True, False]
    # the diverged replica keeps its last good state; the other one moved every parameter
    chex.assert_trees_all_equal(replica(new.train.params, 1), replica(state.train.params, 1))
    moved = jax.tree.map(lambda a, b: not np.array_equal(a[0], b[0]), new.train.params, state.train.params)
    assert all(jax.tree.leaves(moved))
    assert "frozen" in sweep.report_divergence(new, [r.label for r in replicas])[0]
    rule = sweep.after_eval(sweep.StopRule("acc", escape_thr=0.5, stop_thr=0.9), ["a", "b"])
    s2 = rule(state, 10, {"acc": np.array([0.95, 0.6])})
    assert np.asarray(s2.escape_step).tolist() == [10, 10] and np.asarray(s2.active).tolist() == [False, True]
    s3 = rule(s2, 20, {"acc": np.array([0.99, 0.7])})
    assert np.asarray(s3.escape_step).tolist() == [10, 10] and np.asarray(s3.stopped_step).tolist() == [10, -1]
    with pytest.raises(KeyError, match="acc"):
        sweep.after_eval(sweep.StopRule("acc", 0.5), ["a"])(state, 1, {"loss": np.zeros(2)})


def test_escape_and_stop_updates_keep_the_step_compiled_once():
    # after_eval rewrites active/escape/stopped on the host; placed unsharded they would be a new
    # input type to a step jitted with shardings, which then traces and compiles a second time.
    from ssmgate.train import mesh as meshlib
    mesh = meshlib.make_mesh(meshlib.MeshCfg())
    replicas = sweep.grid(seeds=[0], lrs=[1e-2, 3e-3])
    state = sweep.init_sweep(replicas, init_params, TX)
    shardings = sweep.sweep_shardings(jax.eval_shape(lambda: state), mesh, "replicated")
    batch_sharding = meshlib.batch_sharding(mesh, replica_axis=True)
    step = meshlib.jit_step(sweep.sweep_step(make_train_step(loss_fn, TX)), shardings, batch_sharding)
    state = jax.device_put(state, shardings)
    batch = jax.tree.map(lambda a: jnp.stack([a, a]), batch_of(0, 0))
    rule = sweep.after_eval(sweep.StopRule("acc", escape_thr=0.5, stop_thr=0.9), ["a", "b"])
    state, _ = step(state, batch)
    state = rule(state, 1, {"acc": np.array([0.95, 0.6])})
    state, _ = step(state, batch)
    assert np.asarray(state.active).tolist() == [False, True]
    assert step._cache_size() == 1


def test_loop_config_errors_name_the_field():
    with pytest.raises(ValueError, match="steps=0"):
        loop.LoopCfg(steps=0).validate()
    with pytest.raises(ValueError, match="eval_every=-1"):
        loop.LoopCfg(steps=3, eval_every=-1).validate()


def test_tensorboard_event_files_and_curves(tmp_path):
    pytest.importorskip("tensorboardX")
    init = single()
    cfg = loop.LoopCfg(steps=4, log_every=2, tensorboard=True)
    loop.run(RunDir(tmp_path), cfg, init_state=init, abstract_state=jax.eval_shape(init),
             step_fn=jax.jit(make_train_step(loss_fn, TX)), batch_fn=lambda k: batch_of(0, k), meta={}, fingerprint="t")
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    from ssmgate.train.writers import plot_curves
    assert plot_curves(RunDir(tmp_path), names=("loss", "mse")) == ["curves.png"]
    assert (tmp_path / "curves.png").stat().st_size > 0
