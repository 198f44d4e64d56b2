"""scalar_decay_state: the final state alone (prefill), against the float64 reference and the scan."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssmgate import cores
from tests.cores import common
from tests.cores import reference as ref

CASES = (common.full(1), common.full(65), common.LONG, common.PLAIN)


def state_only(inp):
    return cores.scalar_decay_state(inp["x"], inp["dt"], inp["A"], inp["B"], initial_state=inp["init"])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_final_state_matches_the_float64_reference(case):
    inp = common.case_inputs("scalar_decay", case)
    _, ref_state = ref.scalar_decay(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], inp["D"], inp["init"])
    got = np.asarray(jax.jit(state_only)(inp))
    assert np.max(np.abs(got - ref_state)) <= 1e-5 * max(1.0, np.max(np.abs(ref_state)))


def test_gradients_match_the_sequential_scan():
    inp = common.case_inputs("scalar_decay", common.full(65))
    args = {k: jnp.asarray(inp[k]) for k in ("x", "dt", "A", "B")}
    h0 = jnp.asarray(inp["init"])
    w = jax.random.normal(jax.random.key(0), h0.shape)

    def via_state(a, h0):
        return jnp.sum(w * cores.scalar_decay_state(a["x"], a["dt"], a["A"], a["B"], initial_state=h0))

    def via_scan(a, h0):
        _, s = cores.scalar_decay(a["x"], a["dt"], a["A"], a["B"], a["B"], initial_state=h0, algorithm="sequential")
        return jnp.sum(w * s)

    g1 = jax.jit(jax.grad(via_state, argnums=(0, 1)))(args, h0)
    g2 = jax.jit(jax.grad(via_scan, argnums=(0, 1)))(args, h0)
    chex.assert_trees_all_equal_structs(g1, g2)  # the tolerance below is per leaf
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(jnp.max(jnp.abs(b))))


def test_extreme_decays_stay_finite():
    """Suffix sums of -dt*|A| over 1000 tokens reach ~ -5e4: weights underflow to 0, never inf/nan."""
    b, t, h, p, n = 1, 1000, 2, 2, 3
    x = jnp.ones((b, t, h, p))
    dt = jnp.full((b, t, h), 50.0)
    B = jnp.ones((b, t, 1, n))
    s = cores.scalar_decay_state(x, dt, jnp.asarray([-1.0, -1e-6]), B)
    assert bool(jnp.all(jnp.isfinite(s)))
    np.testing.assert_allclose(s[0, 0], 50.0, rtol=1e-6)  # only the last write survives on head 0


def test_bad_input_names_the_argument():
    x = jnp.ones((1, 4, 2, 3))
    with pytest.raises(ValueError, match="scalar_decay_state: argument 'dt'"):
        cores.scalar_decay_state(x, jnp.ones((1, 5, 2)), jnp.ones((2,)), jnp.ones((1, 4, 1, 2)))
    with pytest.raises(ValueError, match="initial_state"):
        cores.scalar_decay_state(x, jnp.ones((1, 4, 2)), -jnp.ones((2,)), jnp.ones((1, 4, 1, 2)),
                                 initial_state=jnp.zeros((1, 2, 3, 3)))
