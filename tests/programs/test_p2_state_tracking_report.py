"""The Table 2 report section from per-task summaries (made up here; the program's own summaries
are tested in test_p2_state_tracking.py)."""
import pytest

from ssmgate.programs.p2_state_tracking import report

ROWS = ("mamba2", "m3_norot", "m3_static", "overdamped", "critical", "underdamped")


def task_summary(task, scaled, code=None):
    lens = ["223", "255"] if task == "arith" else ["224", "256"]
    out = {"task": task, "test_lens": [int(v) for v in lens],
           "scaled_accuracy": {m: {lens[0]: v, lens[1]: v - 1} for m, v in scaled.items()},
           "chosen_lr": {m: 1e-3 for m in scaled}}
    if code is not None:
        out["phase_code"] = {"deg": list(code), "head": 0, "pair": 1, "ideal_deg": [0.0, 180.0 if task == "parity" else 120.0],
                             "pairs_deg": [[5.0, 40.0], list(code), [-20.0, -150.0]]}
    return out


def runs(parity_under=99.0, arith_under=90.0, code=(0.4, 179.0), arith_others=30.0):
    low = {m: 1.0 for m in ROWS}
    return {"state_tracking_parity": task_summary("parity", dict(low, underdamped=parity_under), code),
            "state_tracking_mod3": task_summary("mod3", dict(low, underdamped=95.0), (0.1, -119.0)),
            "state_tracking_arith": task_summary("arith", dict({m: arith_others for m in ROWS},
                                                               underdamped=arith_under))}


def test_summary_entry_checks_and_markdown(tmp_path):
    entry, text = report.build(runs(), "cpu", {"state_tracking_parity": ["steps: 10000 -> 2000"]}, {"x": 1.0},
                               tmp_path / "figures", tmp_path)
    assert entry["scaled_accuracy"]["underdamped"] == {"parity": 99.0, "mod3": 95.0, "arith": 90.0}
    assert entry["scaled_accuracy_all"]["mamba2"]["arith"] == {"223": 30.0, "255": 29.0}
    assert entry["phase_code"] == {"parity_deg": [0.4, 179.0], "mod3_deg": [0.1, -119.0]}
    assert all(entry["checks"].values()) and len(entry["checks"]) == 7
    assert "| underdamped (Mamba-3) | 99.00 (100.00) | 95.00 (95.26) | 90.00 (95.68) |" in text
    assert "steps: 10000 -> 2000" in text
    assert (tmp_path / "figures" / "p2_phase_code.png").stat().st_size > 0
    assert (tmp_path / "figures" / "p2_spectra.png").stat().st_size > 0


@pytest.mark.parametrize("kwargs, failing", [
    # An unsolved task fails its phase-code check too: a pair near the ideal code then means nothing.
    (dict(parity_under=50.0), ["parity_underdamped_ge_90", "parity_phase_code_within_10_deg_and_solved"]),
    (dict(arith_under=20.0), ["arith_underdamped_best_and_ge_10"]),
    (dict(arith_under=8.0, arith_others=2.0), ["arith_underdamped_best_and_ge_10"]),  # best, but at chance
    (dict(code=(0.4, 165.0)), ["parity_phase_code_within_10_deg_and_solved"]),
])
def test_each_check_can_fail(tmp_path, kwargs, failing):
    entry, _ = report.build(runs(**kwargs), "cpu", {}, {}, tmp_path / "figures", tmp_path)
    assert [k for k, v in entry["checks"].items() if not v] == failing


def test_a_subset_of_tasks_reports_what_exists(tmp_path):
    only = {"state_tracking_arith": runs()["state_tracking_arith"]}
    entry, text = report.build(only, "quick", {}, {}, tmp_path / "figures", tmp_path)
    assert entry["phase_code"] == {} and list(entry["checks"]) == ["arith_underdamped_best_and_ge_10"]
    assert "p2_phase_code" not in text and "| Arithmetic |" in text


@pytest.mark.parametrize("minutes, within", [((20.9, 24.4, 7.8), True), ((22.2, 26.4, 50.1), False)])
def test_the_cpu_grid_is_timed_against_the_hour(tmp_path, minutes, within):
    walls = {report.RUN_OF_TASK[t]: 60 * m for t, m in zip(report.TASKS, minutes)}
    entry, text = report.build(runs(), "cpu", {}, walls, tmp_path / "figures", tmp_path)
    assert entry["checks"]["cpu_grid_within_60_min"] is within
    assert f"| all | {sum(minutes):.1f} |" in text and f"| state_tracking_mod3 | {minutes[1]:.1f} |" in text


def test_other_scales_and_partial_grids_have_no_time_check(tmp_path):
    walls = {report.RUN_OF_TASK[t]: 60.0 for t in report.TASKS}
    assert "cpu_grid_within_60_min" not in report.build(runs(), "quick", {}, walls, tmp_path / "f", tmp_path)[0]["checks"]
    del walls["state_tracking_arith"]
    assert "cpu_grid_within_60_min" not in report.build(runs(), "cpu", {}, walls, tmp_path / "f", tmp_path)[0]["checks"]


def test_every_test_length_is_shown_in_model_order(tmp_path):
    """A task tested at a training length too (arithmetic at 63) shows it beside the long lengths."""
    r = runs()
    arith = r["state_tracking_arith"]
    arith["test_lens"].append(63)
    for m in arith["scaled_accuracy"]:
        arith["scaled_accuracy"][m]["63"] = 70.0
    entry, text = report.build(r, "cpu", {}, {}, tmp_path / "figures", tmp_path)
    assert entry["scaled_accuracy"]["mamba2"]["arith"] == 30.0  # Table 2 stays at the first length
    header = "| model | parity at 224 | parity at 256 | mod3 at 224 | mod3 at 256 | arith at 63 | arith at 223 | arith at 255 |"
    assert header in text
    assert text.index("| Mamba-2 | 1 | 0 |") < text.index("| underdamped (Mamba-3) | 99 | 98 |")
    assert "| underdamped (Mamba-3) | 99 | 98 | 95 | 94 | 70 | 90 | 89 |" in text
