"""protocol §8.5 phase trajectories: travel, the percentile picks among full-turn channels, the
cumulative phase, and the model path (the increments the model sows, zero after phase removal)."""
import jax
import numpy as np
import pytest

from ssmgate.interventions import Intervention, intervened_model
from ssmgate.interventions import phase_trajectories as pt
from ssmgate.models import lm
from ssmgate.models.config import ModelCfg


def test_travel_picks_and_cumulative_phase():
    inc = np.zeros((2, 5, 3, 2))                       # (layers, t, H, r)
    rates = np.arange(12, dtype=float).reshape(2, 3, 2) * 0.5   # per-channel |increment| per token
    inc[:] = rates[:, None] * np.where(np.arange(5) % 2 == 0, 1, -1)[None, :, None, None]
    travel = pt.phase_travel(inc)
    np.testing.assert_allclose(travel, 5 * rates)
    picks = pt.pick_channels(travel, percentiles=(0, 100), min_travel=2 * np.pi)
    eligible = np.sort(travel[travel >= 2 * np.pi])
    assert [p.travel for p in picks] == [eligible[0], eligible[-1]]
    slow = picks[0]
    assert travel[slow.layer, slow.head, slow.pair] == slow.travel
    np.testing.assert_allclose(pt.cumulative_phase(inc, slow), np.cumsum(inc[slow.layer, :, slow.head, slow.pair]))
    with pytest.raises(ValueError, match="no channel travels"):
        pt.pick_channels(travel, min_travel=1e9)


def test_model_increments_and_plot(tmp_path):
    cfg = ModelCfg(block="mamba3", vocab_size=16, d_model=16, n_layers=2, d_state=8, headdim=8, expand=2,
                   dtype="float32")
    params = lm.init_params(cfg, jax.random.PRNGKey(0))
    tokens = np.arange(40) % 16
    inc = pt.phase_increments(lm.build_model(cfg), params, tokens)
    assert inc.shape == (2, 40, cfg.n_ssm_heads, cfg.n_rot_pairs) and np.abs(inc).max() > 0
    removed = pt.phase_increments(intervened_model(cfg, Intervention("phase_removal")), params, tokens)
    assert np.abs(removed).max() == 0.0
    picks = pt.pick_channels(pt.phase_travel(inc), min_travel=0.0)
    pt.plot(inc, picks, tmp_path / "fig4.png", title="random init")
    assert (tmp_path / "fig4.png").stat().st_size > 0
    with pytest.raises(ValueError, match="no phase increments"):
        m2 = ModelCfg(block="mamba2", vocab_size=16, d_model=16, n_layers=1, d_state=8, headdim=8)
        pt.phase_increments(lm.build_model(m2), lm.init_params(m2, jax.random.PRNGKey(0)), tokens)
