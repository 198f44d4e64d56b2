"""lm_runs.staged: one compiled batch function per stage, batches that follow the stage of each step."""
import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.train import lm_runs


def test_staged_batches_take_the_shape_of_their_stage_and_compile_once_each():
    traces = []

    def sample(seed, k, width):
        traces.append(width)  # runs only while tracing
        return jnp.full((2, width), seed) + k

    stage = lambda k: 4 if k < 3 else 8
    batch_fn = lm_runs.staged(lambda fn: lambda k: fn(5, k), sample, stage, None)
    shapes = [batch_fn(k).shape for k in range(6)]
    assert shapes == [(2, 4)] * 3 + [(2, 8)] * 3
    assert traces == [4, 8]  # one trace per stage, reused for every later step
    np.testing.assert_array_equal(batch_fn(4), np.full((2, 8), 9))
    # Without stages the sampler is sample(seed, k), jitted once.
    plain = lm_runs.staged(lambda fn: lambda k: fn(5, k), lambda seed, k: jnp.zeros(3) + seed + k, None, None)
    np.testing.assert_array_equal(plain(1), np.full(3, 6.0))


def test_staged_sweep_vmaps_the_replica_seeds():
    seeds = jnp.asarray([1, 2], jnp.uint32)
    batch_fn = lm_runs.staged(lambda fn: lambda k: jax.vmap(fn, (0, None))(seeds, k),
                              lambda seed, k, w: jnp.zeros(w, jnp.uint32) + seed * 10 + k, lambda k: 3, None)
    np.testing.assert_array_equal(batch_fn(4), [[14] * 3, [24] * 3])


def three_step_losses(replicas: int, loss, **build) -> np.ndarray:
    """The losses of 3 steps of a tiny Mamba-2 copy-task run (a sweep for replicas > 1) built with `build`."""
    from ssmgate.models.config import ModelCfg
    from ssmgate.tasks import synthetic_lm
    from ssmgate.train import mesh as meshlib
    from ssmgate.train.optim import OptimCfg
    from ssmgate.train.sweep import Replica
    task = synthetic_lm.SyntheticCfg(task="copy", batch=8, seq_len=16, vocab_size=16)
    model = ModelCfg(block="mamba2", vocab_size=16, d_model=32, n_layers=1, d_state=8, headdim=8, expand=1)
    mesh = meshlib.make_mesh(meshlib.MeshCfg(data=-1), jax.devices()[:1])
    run = lm_runs.build_run(model, OptimCfg(lr=1e-2, total_steps=3), tuple(Replica(s, 1e-2) for s in range(replicas)),
                            loss=loss, eval_batches=(), mesh=mesh, mode="replicated",
                            sample=lambda seed, i: synthetic_lm.sample(synthetic_lm.step_key(seed, i), task), **build)
    state, out = run.init_state(), []
    for i in range(3):
        state, metrics = run.step(state, run.batch_fn(i))
        out.append(np.asarray(metrics["loss"]))
    return np.stack(out)


def test_a_sweep_with_microbatches_on_a_mesh_trains_as_without():
    """A sweep of two replicas with 4 microbatches a step: the same losses over 3 steps as without."""
    from ssmgate.tasks import synthetic_lm
    np.testing.assert_allclose(three_step_losses(2, synthetic_lm.lm_loss, microbatches=4),
                               three_step_losses(2, synthetic_lm.lm_loss, microbatches=1), rtol=2e-5)


def test_a_run_with_the_loss_in_chunks_trains_as_without():
    """--mesh_loss_chunk reaches the step: the text loss scored 5 positions at a time (the last
    chunk padded) gives the same losses over 3 steps of a run as the whole logits."""
    np.testing.assert_allclose(three_step_losses(1, lm_runs.text_loss, loss_chunk=5),
                               three_step_losses(1, lm_runs.text_loss, loss_chunk=0), rtol=2e-5)
