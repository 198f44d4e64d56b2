"""The checks of the P2 LM section that judge numbers without training: P2 Fig 2's layer-window heat
map, P2 Table 5's growth with C and Table 7's write/read removal beyond their bootstrap intervals,
P2 Fig 4's channel classes and P2 Figs 8-9's windowed PPL along training, on the committed cpu-scale
numbers and on made-up ones that pass and fail."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from ssmgate.interventions import phase_trajectories as pt
from ssmgate.programs.p2_lm import claims as p2_lm_claims, report
from ssmgate.report import claims

REPO = Path(__file__).resolve().parents[2]
COMMITTED = json.loads((REPO / "docs" / "reproduction" / "summary.json").read_text())["p2_lm"]
WIDER_HURTS = "fig2_mean_accuracy_change_falls_strictly_with_window_width"
IN_RANGE = "fig2_every_window_accuracy_change_within_[-45,+3]_pp"


def _heat(changes: dict) -> dict:
    """A heat-map entry from {(start, width): accuracy change in pp}."""
    return {"ppl": {}, "window_ppl": {}, "layer_heatmap": {"window": 64, "native_accuracy": 0.5, "cells": [
        {"start": s, "width": w, "accuracy_change_pp": v, "ppl_ratio": 1.5} for (s, w), v in changes.items()]}}


def test_fig2_checks_on_the_committed_heat_map():
    checks = report.recheck(COMMITTED)
    assert checks[WIDER_HURTS] is True and checks[IN_RANGE] is True
    means = report._mean_change_by_width(COMMITTED["layer_heatmap"]["cells"])
    assert list(means) == [1, 2, 3, 4] and all(a > b for a, b in zip(means.values(), list(means.values())[1:]))


def test_fig2_checks_fail_on_a_wrong_heat_map():
    good = {(0, 1): -2.0, (1, 1): 1.0, (0, 2): -10.0}
    assert report.checks(_heat(good))[WIDER_HURTS] is True and report.checks(_heat(good))[IN_RANGE] is True
    milder_when_wider = report.checks(_heat({**good, (0, 2): 0.0}))
    assert milder_when_wider[WIDER_HURTS] is False and milder_when_wider[IN_RANGE] is True
    too_good = report.checks(_heat({**good, (1, 1): 3.5}))
    assert too_good[IN_RANGE] is False
    too_bad = report.checks(_heat({**good, (0, 2): -46.0}))
    assert too_bad[IN_RANGE] is False and too_bad[WIDER_HURTS] is True
    one_width = report.checks(_heat({(0, 1): -2.0, (1, 1): -3.0}))
    assert one_width[WIDER_HURTS] is False  # no ordering to see


def test_table7_is_two_claims():
    checks = report.recheck(COMMITTED)  # remove-B 6.52, remove-C 6.23, both 1.78
    assert checks["table7_each_single_removal_gt_remove_both_gt_native"] is True
    assert checks["table7_remove_C_gt_remove_B"] is False
    assert not any(name.startswith("table7_") and name not in (
        "table7_each_single_removal_gt_remove_both_gt_native", "table7_remove_C_gt_remove_B") for name in checks)
    paper = report.checks({"ppl": {}, "window_ppl": {}, "bc_removal_ratio": {"remove_C": 12.18, "remove_B": 9.04,
                                                                            "remove_both": 2.08}})
    assert paper["table7_each_single_removal_gt_remove_both_gt_native"] and paper["table7_remove_C_gt_remove_B"]
    no_harm = report.checks({"ppl": {}, "window_ppl": {}, "bc_removal_ratio": {"remove_C": 12.0, "remove_B": 9.0,
                                                                              "remove_both": 1.0}})
    assert no_harm["table7_each_single_removal_gt_remove_both_gt_native"] is False


def test_the_claim_rows_of_fig2_and_table7():
    entry = copy.deepcopy(COMMITTED)
    entry["checks"] = report.recheck(entry)
    rows = claims.rows({"p2_lm": entry}, p2_lm_claims.CLAIMS)
    assert rows["P2 Table 7"]["status"] == "partly" and rows["P2 Table 7"]["checks"] == [
        "table7_each_single_removal_gt_remove_both_gt_native", "table7_remove_C_gt_remove_B"]
    assert rows["P2 Fig 2"]["status"] == "reproduced" and rows["P2 Fig 2"]["checks"] == sorted([WIDER_HURTS, IN_RANGE])
    changes = [c["accuracy_change_pp"] for c in entry["layer_heatmap"]["cells"]]
    assert rows["P2 Fig 2"]["ours"] == f"{min(changes):.3f} ... {max(changes):.3f} pp over {len(changes)} windows"
    # the committed runs measure the curve along training and Fig 4's channels: both rows are judged
    for key in ("P2 Figs 8-9", "P2 Fig 4"):
        assert rows[key]["status"] != "not attempted" and rows[key]["checks"], key


GROWS = "every_intervention_ratio_grows_from_smallest_to_largest_C_beyond_ci"
GT = "every_phase_intervention_ratio_gt_1.15"


def _table5(ratios: dict, ci: dict) -> dict:
    return {"ppl": {}, "window_ppl": {}, "intervention_ratio": ratios, "intervention_ratio_ci": ci}


def test_table5_growth_is_judged_at_the_smallest_and_largest_C_beyond_the_intervals():
    ratios = {"phase_removal": {"512": 2.0, "1024": 1.9, "8192": 3.0}, "decay_permutation": {"512": 1.4, "8192": 1.6}}
    tight = {k: {c: [v - 0.05, v + 0.05] for c, v in row.items()} for k, row in ratios.items()}
    checks = report.checks(_table5(ratios, tight))
    assert checks[GROWS] is True and checks[GT] is True  # a dip in between does not matter
    loose = {**tight, "decay_permutation": {"512": [1.2, 1.7], "8192": [1.5, 1.8]}}  # the intervals overlap
    assert report.checks(_table5(ratios, loose))[GROWS] is False
    shrinking = {**ratios, "phase_removal": {"512": 3.0, "8192": 2.0}}
    assert report.checks(_table5(shrinking, {}))[GROWS] is False
    assert report.checks(_table5(ratios, {}))[GROWS] is True  # no intervals recorded: the point values
    near_bar = {**tight, "decay_permutation": {"512": [1.1, 1.7], "8192": [1.55, 1.65]}}
    assert report.checks(_table5(ratios, near_bar))[GT] is False  # the lower end counts against x1.15
    assert report.checks(_table5({"phase_removal": {"512": 2.0}}, {}))[GROWS] is False  # one C: no growth to see


def test_table7_orders_hold_beyond_the_intervals():
    bc = {"remove_B": 9.04, "remove_C": 12.18, "remove_both": 2.08}
    ci = {"remove_B": [8.0, 10.0], "remove_C": [11.0, 13.0], "remove_both": [1.5, 2.5]}
    entry = {"ppl": {}, "window_ppl": {}, "bc_removal_ratio": bc, "bc_removal_ratio_ci": ci}
    checks = report.checks(entry)
    assert checks["table7_each_single_removal_gt_remove_both_gt_native"] and checks["table7_remove_C_gt_remove_B"]
    overlap = report.checks({**entry, "bc_removal_ratio_ci": {**ci, "remove_C": [9.5, 14.0]}})
    assert overlap["table7_remove_C_gt_remove_B"] is False
    assert overlap["table7_each_single_removal_gt_remove_both_gt_native"] is True
    near_native = report.checks({**entry, "bc_removal_ratio_ci": {**ci, "remove_both": [0.9, 2.5]}})
    assert near_native["table7_each_single_removal_gt_remove_both_gt_native"] is False
    near_both = report.checks({**entry, "bc_removal_ratio_ci": {**ci, "remove_B": [2.4, 10.0]}})
    assert near_both["table7_each_single_removal_gt_remove_both_gt_native"] is False


def _fig4(travel: tuple) -> dict:
    classes = {k: {"travel": t, "cycles": t / (2 * np.pi)} for k, t in zip(("slow", "medium", "fast"), travel)}
    return {"ppl": {}, "window_ppl": {}, "phase_trajectories": {
        "tokens": 4096, "classes": classes, "travel_ratio": {"fast_over_slow": travel[2] / travel[0]}}}


def test_fig4_check_asks_for_ordered_classes_an_order_of_magnitude_apart():
    name = "fig4_phase_travel_slow_lt_medium_lt_fast_and_fast_over_slow_ge_10"
    assert report.checks(_fig4((10.0, 40.0, 300.0)))[name] is True
    assert report.checks(_fig4((10.0, 40.0, 90.0)))[name] is False     # fast only 9x slow
    assert report.checks(_fig4((10.0, 400.0, 300.0)))[name] is False    # medium beyond fast
    skipped = {"ppl": {}, "window_ppl": {}, "phase_trajectories": {"tokens": 64, "skipped": "no channel turns once"}}
    assert report.checks(skipped)[name] is False
    entry = _fig4((10.0, 40.0, 300.0))
    entry["checks"] = report.checks(entry)
    row = claims.rows({"p2_lm": entry}, p2_lm_claims.CLAIMS)["P2 Fig 4"]
    assert row["status"] == "reproduced" and row["checks"] == [name]
    assert row["ours"] == "cycles slow / medium / fast 1.592 / 6.366 / 47.746; travel fast / slow x30"


def _curves(rot: dict, norot: dict) -> dict:
    """An entry with the windowed PPL along training: {C: [per seed]} at the last step 800 for each variant."""
    def curve(last):
        return {"400": {c: [v * 1.2 for v in vs] for c, vs in last.items()}, "800": last}
    seeds = {"rotation": curve(rot), "no_rotation": curve(norot)}
    return {"ppl": {}, "window_ppl": {}, "window_ppl_along_training_seeds": seeds,
            "window_ppl_along_training": {v: {st: {c: vs[0] for c, vs in row.items()} for st, row in curve.items()}
                                          for v, curve in seeds.items()}}


def test_figs_8_9_checks_compare_the_last_step_beyond_the_seed_spread():
    below = "fig8_9_rotation_window_ppl_below_no_rotation_at_the_last_step_every_C_beyond_seed_spread"
    widens = "fig8_9_rotation_gap_widens_from_smallest_to_largest_C_beyond_seed_spread"
    rot = {"1024": [4.0, 4.1], "8192": [4.0, 4.1]}
    checks = report.checks(_curves(rot, {"1024": [4.2, 4.3], "8192": [5.0, 5.1]}))
    assert checks[below] is True and checks[widens] is True
    same_gap = report.checks(_curves(rot, {"1024": [4.5, 4.6], "8192": [4.5, 4.6]}))
    assert same_gap[below] is True and same_gap[widens] is False
    overlap = report.checks(_curves(rot, {"1024": [4.05, 4.3], "8192": [5.0, 5.1]}))
    assert overlap[below] is False and overlap[widens] is True
    one_seed = report.checks(_curves({c: vs[:1] for c, vs in rot.items()}, {"1024": [4.2], "8192": [5.0]}))
    assert one_seed[below] is False and one_seed[widens] is False
    entry = _curves(rot, {"1024": [4.2, 4.3], "8192": [5.0, 5.1]})
    entry["checks"] = report.checks(entry)
    row = claims.rows({"p2_lm": entry}, p2_lm_claims.CLAIMS)["P2 Figs 8-9"]
    assert row["status"] == "reproduced" and row["checks"] == sorted([below, widens])
    assert row["ours"] == "C=8192: rotation 4, no rotation 5"


def test_fig4_numbers_of_the_picked_channels():
    travel = np.array([[[2.0, 7.0], [13.0, 30.0]], [[60.0, 100.0], [200.0, 629.0]]])  # (layers, heads, pairs)
    channels = pt.pick_channels(travel)  # among the 7 channels turning at least once (>= 2 pi)
    got = pt.class_numbers(channels, tokens=1000)
    assert list(got["classes"]) == ["slow", "medium", "fast"]
    slow, fast = got["classes"]["slow"], got["classes"]["fast"]
    assert (slow["layer"], slow["head"], slow["pair"], slow["travel"]) == (0, 1, 0, 13.0)  # nearest the 10th pct, 10.6
    assert (fast["layer"], fast["head"], fast["pair"], fast["travel"]) == (1, 1, 1, 629.0)
    assert fast["cycles"] == pytest.approx(629.0 / (2 * np.pi)) and fast["tokens_per_cycle"] == pytest.approx(
        1000 / fast["cycles"])
    assert got["travel_ratio"]["fast_over_slow"] == pytest.approx(629.0 / 13.0)
    with pytest.raises(ValueError, match="no channel picked for fast"):
        pt.class_numbers(channels[:2], tokens=1000)
