"""protocol §8.3 state diagnostics: the |S|^2 identity per step, the streamed time-means equal a direct
token-by-token computation from stored states, the aggregation order (median over (layer, head),
then the mean over books; sqrt after the median for the RMS), and the bad inputs."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ssmgate.interventions import Intervention, intervened_model
from ssmgate.interventions import diagnostics as dg
from ssmgate.models import lm
from ssmgate.models.config import ModelCfg

CFG = ModelCfg(block="mamba3", vocab_size=32, d_model=32, n_layers=2, d_state=16, headdim=8, expand=2,
               dtype="float32", algorithm="sequential")
T = 14
WINDOWS = [(2, 14), (5, 9)]


@pytest.fixture(scope="module")
def setup():
    params = lm.init_params(CFG, jax.random.PRNGKey(0))
    tokens = np.asarray(jax.random.randint(jax.random.PRNGKey(1), (T,), 0, CFG.vocab_size))
    return params, tokens


def test_norm_identity(rng=np.random.default_rng(0)):
    S_prev, S = (jnp.asarray(rng.normal(size=(3, 4, 5)), jnp.float32) for _ in range(2))
    alpha = jnp.asarray(rng.uniform(0.2, 1.0, size=3), jnp.float32)
    cos, ss, pp, uu, pu = dg.step_terms(S_prev, S, alpha)
    np.testing.assert_allclose(ss, pp + uu + 2 * pu, rtol=1e-5)
    assert np.all(np.abs(cos) <= 1.0 + 1e-6)


def _direct(params, tokens, intervention):
    """Token by token with stored states: per step (layers, H) cosine and |S|^2."""
    model = intervened_model(CFG, intervention)
    cache = dg._zero_cache(CFG)
    cos, sq = [], []
    for tok in tokens:
        (_, new), inter = model.apply({"params": params}, jnp.asarray([[tok]]), cache, mutable=["intermediates"])
        c_l, s_l = [], []
        for i in range(CFG.n_layers):
            alpha = inter["intermediates"][f"layers_{i}"]["mixer"]["decay"][0][0, 0]
            P = np.asarray(alpha)[:, None, None] * np.asarray(cache[i].h[0], np.float64)
            U = np.asarray(new[i].h[0], np.float64) - P
            c_l.append((P * U).sum((1, 2)) / (np.linalg.norm(P, axis=(1, 2)) * np.linalg.norm(U, axis=(1, 2)) + 1e-12))
            s_l.append((np.asarray(new[i].h[0], np.float64) ** 2).sum((1, 2)))
        cos.append(c_l)
        sq.append(s_l)
        cache = new
    return np.asarray(cos), np.asarray(sq)


@pytest.mark.parametrize("kind", ["native", "phase_removal"])
def test_streamed_means_equal_direct_computation(setup, kind):
    params, tokens = setup
    got = dg.book_statistics(CFG, params, tokens, WINDOWS, Intervention(kind))
    cos, sq = _direct(params, tokens, Intervention(kind))
    for lo, hi in WINDOWS:
        np.testing.assert_allclose(got[(lo, hi)]["cosine"], cos[lo:hi].mean(0), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[(lo, hi)]["sq_norm"], sq[lo:hi].mean(0), rtol=1e-4)
    assert got[(2, 14)]["cosine"].shape == (CFG.n_layers, CFG.n_ssm_heads)


def test_the_state_matches_a_full_forward_pass(setup):
    """The decode scan's final state is the one-shot forward pass's final state."""
    params, tokens = setup
    model = intervened_model(CFG, Intervention())
    _, caches = model.apply({"params": params}, jnp.asarray(tokens)[None])
    stats = dg.book_statistics(CFG, params, tokens, [(T - 1, T)])
    last_sq = np.stack([(np.asarray(c.h[0], np.float64) ** 2).sum((1, 2)) for c in caches])
    np.testing.assert_allclose(stats[(T - 1, T)]["sq_norm"], last_sq, rtol=1e-4)


def test_aggregation_order():
    per_head = {"cosine": np.array([[0.1, 0.9, 0.2], [0.3, 0.8, 0.4]]),
                "sq_norm": np.array([[1.0, 4.0, 9.0], [16.0, 25.0, 36.0]])}
    s = dg.summarise(per_head)
    assert s["cosine"] == pytest.approx(0.35)       # median of the six, not a mean of medians
    assert s["rms"] == pytest.approx(np.sqrt(12.5))  # sqrt after the median
    assert dg.mean_over_books([s, {"cosine": 0.15, "rms": 1.0}]) == pytest.approx(
        {"cosine": 0.25, "rms": (np.sqrt(12.5) + 1.0) / 2})


def test_bad_inputs(setup):
    params, tokens = setup
    with pytest.raises(ValueError, match=r"window \[10, 20\) outside the 14 tokens"):
        dg.book_statistics(CFG, params, tokens, [(10, 20)])
    with pytest.raises(ValueError, match="expected one sequence"):
        dg.book_statistics(CFG, params, tokens[None], [(0, 4)])
    with pytest.raises(ValueError, match="transition 'under'"):
        dg.book_statistics(dataclasses.replace(CFG, transition="under"), params, tokens, [(0, 4)])
    with pytest.raises(ValueError, match="no books"):
        dg.mean_over_books([])
