"""Mamba-2 gate initialisation, edits and statistics (ssmgate/models/gates.py)."""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssmgate.models import gates
from ssmgate.models.config import ModelCfg
from ssmgate.models.mamba2 import Mamba2Mixer
from ssmgate.models.mamba3 import Mamba3Mixer

SMALL = dict(d_model=16, d_state=8, headdim=8, expand=2)


def many_heads(**kw):
    """8192 heads: enough for range and median checks by Monte Carlo."""
    return ModelCfg(block="mamba2", d_model=4096, headdim=1, **kw).validate()


def two_layer_params(seed=0, **kw):
    """An LM-shaped pytree: {'params': {'layers_i': {'mixer': mixer params, 'norm': ...}}}."""
    cfg = ModelCfg(block="mamba2", **{**SMALL, **kw}).validate()
    u = jnp.ones((1, 3, 16))
    layers = {}
    for i in range(2):
        mixer = jax.jit(Mamba2Mixer(cfg).init)(jax.random.key(seed + i), u)["params"]
        layers[f"layers_{i}"] = {"mixer": mixer, "norm": {"scale": jnp.ones(16)}}
    return {"params": layers}


@pytest.mark.parametrize("offset", [0.0, -10.0, 1.5])
def test_a_log_init_range_and_offset(offset):
    cfg = many_heads()
    raw = gates.offset_gates({"A_log": gates.a_log_init(cfg, jax.random.key(0))}, offset)["A_log"]
    assert raw.shape == (cfg.n_ssm_heads,) and raw.dtype == jnp.float32
    a_log = np.asarray(raw, np.float64)
    lo, hi = math.log(1.0) + offset, math.log(16.0) + offset
    assert a_log.min() >= lo - 1e-5 and a_log.max() <= hi + 1e-5
    # exp(A_log - offset) is U(1, 16): its mean is 8.5
    assert abs(np.mean(np.exp(a_log - offset)) - 8.5) < 0.2


def test_a_log_init_per_head_ranges():
    cfg = ModelCfg(block="mamba2", **SMALL, head_a_ranges=((1, 1), (2, 2), (4, 8), (100, 100))).validate()
    a_log = np.asarray(gates.offset_gates({"A_log": gates.a_log_init(cfg, jax.random.key(3))}, 0.5)["A_log"])
    np.testing.assert_allclose(a_log[[0, 1, 3]], np.log([1, 2, 100]) + 0.5, rtol=1e-6)
    assert math.log(4) + 0.5 <= a_log[2] <= math.log(8) + 0.5


def test_dt_bias_init_range_and_floor():
    cfg = many_heads()
    dt = np.logaddexp(0.0, np.asarray(gates.dt_bias_init(cfg, jax.random.key(1)), np.float64))
    assert dt.min() >= 1e-3 * (1 - 1e-4) and dt.max() <= 1e-1 * (1 + 1e-4)
    assert abs(np.median(np.log(dt)) - 0.5 * (math.log(1e-3) + math.log(1e-1))) < 0.1  # log-uniform
    floored = np.logaddexp(0.0, np.asarray(gates.dt_bias_init(many_heads(dt_min=1e-6, dt_floor=1e-3),
                                                               jax.random.key(1)), np.float64))
    assert floored.min() >= 1e-3 * (1 - 1e-4) and np.mean(np.isclose(floored, 1e-3, rtol=1e-3)) > 0.3


def test_default_init_median_tau_is_about_14_tokens():
    """protocol §1.2 [CALC]: with the default A and dt inits the median over heads of tau is ~14.1."""
    cfg = many_heads()
    k1, k2 = jax.random.split(jax.random.key(7))
    params = {"mixer": {"A_log": gates.a_log_init(cfg, k1), "dt_bias": gates.dt_bias_init(cfg, k2)}}
    assert 12.5 < gates.median_tau(params) < 15.5


def test_gate_paths_are_documented_paths():
    params = two_layer_params()
    assert gates.gate_paths(params) == [("params", "layers_0", "mixer", "A_log"),
                                        ("params", "layers_1", "mixer", "A_log")]
    assert gates.gate_paths(params["params"]["layers_0"]["mixer"]) == [("A_log",)]
    m3 = jax.jit(Mamba3Mixer(ModelCfg(block="mamba3", **SMALL)).init)(jax.random.key(0), jnp.ones((1, 3, 16)))
    assert gates.gate_paths(m3) == []


def test_scale_gates_adds_log_s_and_does_not_mutate():
    params = two_layer_params()
    before = jax.tree.map(np.array, params)
    scaled = gates.scale_gates(params, 4.0)
    for path in gates.gate_paths(params):
        old = gates._get(params, path)
        np.testing.assert_allclose(gates._get(scaled, path), old + math.log(4.0), rtol=1e-6)
    # input untouched, other leaves carried over unchanged
    chex.assert_trees_all_equal(params, before)
    assert scaled is not params and scaled["params"]["layers_0"] is not params["params"]["layers_0"]
    np.testing.assert_array_equal(scaled["params"]["layers_1"]["mixer"]["dt_bias"],
                                  params["params"]["layers_1"]["mixer"]["dt_bias"])
    # exp(A_log) scales by s, so every head's per-token rate does
    np.testing.assert_allclose(gates.head_rates(scaled), 4.0 * gates.head_rates(params), rtol=1e-5)


def test_offset_gates():
    params = two_layer_params()
    shifted = gates.offset_gates(params, -10.0)
    np.testing.assert_allclose(shifted["params"]["layers_0"]["mixer"]["A_log"],
                               params["params"]["layers_0"]["mixer"]["A_log"] - 10.0, rtol=1e-6)
    np.testing.assert_allclose(gates.head_taus(shifted), math.exp(10.0) * gates.head_taus(params), rtol=1e-4)


@pytest.mark.parametrize("s", [0.0, -2.0, float("nan"), float("inf")])
def test_scale_gates_rejects_bad_scales(s):
    with pytest.raises(ValueError, match=r"scale_gates: s = .*; expected a finite scale s > 0"):
        gates.scale_gates(two_layer_params(), s)


def test_edits_need_gates():
    with pytest.raises(ValueError, match="holds no 'A_log' leaf"):
        gates.scale_gates({"w": jnp.ones(3)}, 2.0)
    with pytest.raises(ValueError, match="offset_gates: delta = nan; expected a finite number"):
        gates.offset_gates(two_layer_params(), float("nan"))


def test_tau_and_alpha_statistics():
    params = two_layer_params()
    m0 = params["params"]["layers_0"]["mixer"]
    rate0 = np.logaddexp(0.0, np.asarray(m0["dt_bias"], np.float64)) * np.exp(np.asarray(m0["A_log"], np.float64))
    taus = gates.head_taus(params)
    assert taus.shape == (8,)
    np.testing.assert_allclose(taus[:4], 1.0 / rate0, rtol=1e-6)
    np.testing.assert_allclose(gates.head_alphas(params)[:4], np.exp(-rate0), rtol=1e-6)
    assert gates.median_tau(params) == pytest.approx(float(np.median(taus)))
    assert gates.median_alpha_change(params, params) == 0.0
    moved = gates.scale_gates(params, 2.0)
    expected = np.median(np.abs(gates.head_alphas(moved) - gates.head_alphas(params)))
    assert gates.median_alpha_change(params, moved) == pytest.approx(expected)
    with pytest.raises(ValueError, match="before has 8 heads, after has 4"):
        gates.median_alpha_change(params, params["params"]["layers_0"])
