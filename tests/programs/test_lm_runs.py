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
