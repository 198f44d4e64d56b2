"""ssmgate/cores/_trig.py: the polynomial sin/cos of the rotation cores against float64 numpy."""
import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.cores._trig import sin_cos

# Measured 9.2e-8 (below one float32 ulp of 1.0, 1.19e-7); jnp.sin/cos measured 3.3e-8.
TOL = 1.2e-7


def test_float32_values_within_an_ulp():
    rng = np.random.default_rng(0)
    special = np.array([0.0, np.pi / 4, np.pi / 2, np.pi, 1.5 * np.pi, 2 * np.pi - 1e-6, 2 * np.pi])
    x = np.concatenate([np.linspace(0.0, 2 * np.pi, 200_001), rng.uniform(-300.0, 300.0, 200_000), special])
    x = x.astype(np.float32)
    s, c = jax.jit(sin_cos)(jnp.asarray(x))
    assert s.dtype == c.dtype == jnp.float32
    exact = x.astype(np.float64)
    assert np.max(np.abs(np.asarray(s, np.float64) - np.sin(exact))) <= TOL
    assert np.max(np.abs(np.asarray(c, np.float64) - np.cos(exact))) <= TOL


def test_derivatives_are_cos_and_minus_sin():
    x = jnp.asarray(np.linspace(0.0, 2 * np.pi, 1001), jnp.float32)
    ds = jax.vmap(jax.grad(lambda v: sin_cos(v)[0]))(x)
    dc = jax.vmap(jax.grad(lambda v: sin_cos(v)[1]))(x)
    s, c = sin_cos(x)
    np.testing.assert_array_equal(ds, c)
    np.testing.assert_array_equal(dc, -s)


def test_float64_keeps_jnp_precision():
    with jax.enable_x64():
        x = jnp.asarray(np.linspace(-10.0, 10.0, 1001))
        s, c = sin_cos(x)
        assert s.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(s), np.sin(np.asarray(x)), rtol=0, atol=1e-15)
        np.testing.assert_allclose(np.asarray(c), np.cos(np.asarray(x)), rtol=0, atol=1e-15)
