"""Every threshold of the reproduction checks, pinned: loosening one must change this test too.

Each experiment owns its bars (ssmgate/programs/<name>/claims.py); the registry collects them in the
report's order, and docs/reproduction.md carries the same table.
"""
from pathlib import Path

import pytest

from ssmgate.programs import registry
from ssmgate.report import check_bars

REPO = Path(__file__).resolve().parents[2]

PINNED = {
    "fig1a_crossing_lo": 0.15, "fig1a_crossing_hi": 0.21, "fig1b_sgd_over_flow": 0.40, "fig1c_no_decay_tol": 0.02,
    "fig1cd_bayes_tol": 0.03, "kv_plateau_tol": 0.06, "kv_escape_r2": 0.7, "horn_rand_name_gap": 0.1,
    "horn_strong_gate_offset": 1.0, "horn_table1_factor": 1.5, "st_solved": 90.0, "st_unsolved": 10.0,
    "st_above_chance": 10.0, "st_phase_tol_deg": 10.0, "lm_table5_ratio": 1.15, "lm_min_seeds": 2,
    "lm_memory_growth": 0.1,
    "theory_type_agreement": 1.0, "theory_zeta_tol": 1e-9, "theory_expm_rel": 1e-6, "theory_critical_tol": 1e-3,
    "theory_overdamped_cos": 0.999, "theory_angle_tol": 1e-9, "theory_gain_tol_0": 0.1, "theory_gain_tol_pi2": 1e-3,
    "lm_fig2_change_lo": -45.0, "lm_fig2_change_hi": 3.0, "lm_ci_level": 0.95, "lm_fig4_fast_over_slow": 10.0,
    "fig1d_contour_r2": 0.9, "fig1d_tau_ll_d": 8, "kv_fit_min_offsets": 3, "horn_near_perfect": 0.95, "horn_copies": 0.9,
}


def test_every_bar_is_pinned_and_has_a_source():
    bars = registry.check_bars()
    assert {k: b.value for k, b in bars.items()} == PINNED
    for name, b in bars.items():
        assert b.source and ("P1" in b.source or "P2" in b.source or b.source.startswith("ours")), name


def test_the_docs_carry_the_same_table():
    docs = (REPO / "docs" / "reproduction.md").read_text()
    assert check_bars.markdown_table(registry.check_bars()) in docs, "regenerate the table of docs/reproduction.md#thresholds"


def test_two_experiments_may_not_share_a_bar_name():
    one = {"tol": check_bars.Bar(0.1, "ours: a")}
    with pytest.raises(ValueError, match="'tol' is defined by both a and b"):
        check_bars.merged([("a", one), ("b", one)])
