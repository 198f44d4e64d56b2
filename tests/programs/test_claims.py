"""The claim table and the checks behind it: statuses come from checks, ties fail, every check is
explained and belongs to a claim."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ssmgate import reproduce
from ssmgate.programs import registry
from ssmgate.programs.p1_horn import claims as p1_horn_claims, report as p1_horn_report
from ssmgate.programs.p1_kv import report as p1_kv_report
from ssmgate.programs.p2_lm import claims as p2_lm_claims, report as p2_lm_report
from ssmgate.programs.p2_state_tracking import report as p2_state_tracking_report
from ssmgate.report import claims

REPO = Path(__file__).resolve().parents[2]
COMMITTED = json.loads((REPO / "docs" / "reproduction" / "summary.json").read_text())
ROWS = registry.claim_rows()


def test_statuses_come_from_the_checks():
    claim = claims.Claim("X", "c", "p", "exp", (r"^a_", r"^b$"))
    assert claims.status(claim, {"exp": {"checks": {"a_1": True, "b": True, "c": False}}}) == \
        ("reproduced", "2 of 2 checks pass")
    assert claims.status(claim, {"exp": {"checks": {"a_1": True, "b": False}}})[0] == "partly"
    assert claims.status(claim, {"exp": {"checks": {"a_1": False, "b": False}}})[0] == "not reproduced"
    assert claims.status(claim, {"exp": {"checks": {"c": True}}})[0] == "not attempted"
    assert claims.status(claim, {})[0] == "not attempted"
    unchecked = claims.Claim("Y", "c", "p", "exp", unchecked="why")
    assert claims.status(unchecked, {"exp": {"checks": {"a_1": True}}}) == ("not attempted", "why")


def test_every_figure_and_table_has_a_row():
    keys = [c.key for c in ROWS]
    assert len(keys) == len(set(keys))
    for artefact in ("P1 Fig 1a", "P1 Fig 1b", "P1 Fig 1c", "P1 Fig 1d", "P1 Fig 2a", "P1 Fig 2b", "P1 Fig 2c",
                     "P1 Fig 3b", "P1 Fig 3c", "P1 Fig 3d", "P1 Table 1", "P1 Fig 4a", "P1 Fig 4b",
                     "P1 Fig 4, Transformer", "P1 Fig 5, BFCL", "P1 Fig 5, Horn", "P2 theory", "P2 Fig 5",
                     "P2 Figs 3/7", "P2 Fig 6", "P2 Figs 8-9", "P2 Tables 3-4", "P2 Table 5", "P2 Table 6",
                     "P2 Table 7", "P2 Fig 2", "P2 Fig 4", "P2 MIMO contrasts"):
        assert artefact in keys
    assert sum(k.startswith("P1 Fig 5") for k in keys) == 2 and sum(k.startswith("P2 Table 2") for k in keys) == 3
    for experiment, program in registry.EXPERIMENTS.items():
        for c in program.claims.CLAIMS:  # a package holds only its own rows
            assert c.experiment == experiment, c.key
            assert c.checks or c.unchecked, c.key


def unmatched(experiment: str, check_names) -> list[str]:
    """What ties a claim row to a check is broken: a check no row names (and not one of the experiment's
    own budget checks), or a row's pattern that names no check."""
    own = registry.EXPERIMENTS[experiment].claims
    patterns = [p for c in own.CLAIMS for p in c.checks]
    lost = [f"check {n} is in no row" for n in check_names
            if n not in own.UNCLAIMED_CHECKS and not any(re.search(p, n) for p in patterns)]
    lost += [f"pattern {p} of {c.key} names no check" for c in own.CLAIMS for p in c.checks
             if not any(re.search(p, n) for n in check_names)]
    lost += [f"unclaimed check {n} is not made" for n in own.UNCLAIMED_CHECKS if n not in check_names]
    return lost


@pytest.mark.parametrize("experiment", list(reproduce.EXPERIMENTS))
def test_every_check_of_the_committed_numbers_is_explained_and_claimed(experiment):
    entry = COMMITTED[experiment]
    checks = reproduce.EXPERIMENTS[experiment][2].recheck(entry)
    assert checks, experiment
    for name in checks:
        claim, source = checks.notes[name]
        assert claim and source, name
    assert unmatched(experiment, list(checks)) == []


def test_a_check_renamed_without_its_claim_fails():
    names = list(reproduce.EXPERIMENTS["p1_kv"][2].recheck(COMMITTED["p1_kv"]))
    renamed = [n.replace("escape_fit_r2", "escape_r2") for n in names]
    assert unmatched("p1_kv", renamed) == ["check escape_r2_ge_0.7 is in no row",
                                           "pattern ^escape_fit_r2_ of P1 Fig 2b names no check"]


def test_ties_fail():
    """Orderings are strict: equal values never pass."""
    tie_kv = {"lengen_accuracy": {"-6": {"32": 0.9, "128": 0.5}, "0": {"32": 0.9, "128": 0.666},
                                  "2": {"32": 0.666, "128": 0.666}},
              "lengen_memoriser_accuracy": 0.666, "lengen_n": "128", "lengen_train_n": "32",
              "transformer_lengen_accuracy": {"128": 0.666}}
    kv = p1_kv_report.checks({}, tie_kv)
    assert kv["strongest_gate_strictly_best_at_4N"] is False and kv["strongest_gate_retrieves_at_N"] is False
    assert kv["strongest_gate_beats_transformer_at_4N"] is False
    tied_escapes = p1_kv_report.checks({}, {"escape_step": {"-6": [100], "0": [100], "2": [None]}})
    assert tied_escapes["escape_later_as_offset_grows"] is False
    horn = p1_horn_report.checks({"lengen_accuracy": {"-6": {"64": 0.4}, "0": {"64": 1.0}, "3": {"64": 1.0}},
                                  "transformer_lengen_accuracy": {"64": 1.0}})
    assert horn["lengen_strongest_gate_ranks_first_at_largest_k"] is True  # near-perfect gates share the rank
    assert horn["lengen_strongest_beats_transformer_at_largest_k"] is False
    weak_strongest = p1_horn_report.checks({"lengen_accuracy": {"-6": {"64": 0.4}, "0": {"64": 1.0}}})
    assert weak_strongest["lengen_strongest_gate_ge_0.95_at_largest_k"] is False  # no gate >= +1 ran
    st = p2_state_tracking_report.checks({"scaled_accuracy": {"underdamped": {"arith": 50.0},
                                                              "overdamped": {"arith": 50.0}}, "phase_code": {}})
    assert st["arith_underdamped_best_and_ge_10"] is False
    lm = p2_lm_report.checks({"ppl": {"rotation": 4.0, "no_rotation": 4.1}, "window_ppl": {},
                              "ppl_seeds": {"rotation": [4.0, 4.2], "no_rotation": [4.1, 4.3]},
                              "bc_removal_ratio": {"remove_C": 6.0, "remove_B": 6.0, "remove_both": 2.0}})
    assert lm["rotation_heldout_ppl_below_no_rotation_beyond_seed_spread"] is False  # the seeds overlap
    assert lm["table7_remove_C_gt_remove_B"] is False  # C and B tie
    assert lm["table7_each_single_removal_gt_remove_both_gt_native"] is True
    tied_both = p2_lm_report.checks({"ppl": {}, "window_ppl": {},
                                     "bc_removal_ratio": {"remove_C": 6.0, "remove_B": 2.0, "remove_both": 2.0}})
    assert tied_both["table7_each_single_removal_gt_remove_both_gt_native"] is False
    flat = {"cells": [{"start": s, "width": w, "accuracy_change_pp": -5.0, "ppl_ratio": 1.5}
                      for w in (1, 2) for s in range(3 - w)]}
    tied_widths = p2_lm_report.checks({"ppl": {}, "window_ppl": {}, "layer_heatmap": flat})
    assert tied_widths["fig2_mean_accuracy_change_falls_strictly_with_window_width"] is False
    one_seed = p2_lm_report.checks({"ppl": {"rotation": 4.0, "no_rotation": 5.0}, "window_ppl": {},
                                    "ppl_seeds": {"rotation": [4.0], "no_rotation": [5.0]}})
    assert one_seed["rotation_heldout_ppl_below_no_rotation_beyond_seed_spread"] is False
    apart = p2_lm_report.checks({"ppl": {"rotation": 4.0, "no_rotation": 5.0}, "window_ppl": {},
                                 "ppl_seeds": {"rotation": [4.0, 4.1], "no_rotation": [5.0, 4.2]}})
    assert apart["rotation_heldout_ppl_below_no_rotation_beyond_seed_spread"] is True


def test_a_report_from_earlier_numbers_opens_with_the_claim_table_and_rechecks_them(tmp_path):
    """--report_only without run folders keeps each section, with today's checks and the claim table."""
    out, docs = tmp_path / "out", tmp_path / "docs"
    for d in (out, docs):
        d.mkdir()
        for f in ("report.md", "summary.json"):
            (d / f).write_text((REPO / "docs" / "reproduction" / f).read_text())
    res = subprocess.run([sys.executable, "-m", "ssmgate.reproduce", "--scale=cpu", "--report_only",
                          f"--out_dir={out}", f"--docs_dir={docs}"], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    text = (docs / "report.md").read_text()
    assert text.index("## What reproduced") < text.index("<!-- experiment:p1_fig1 -->")
    summary = json.loads((docs / "summary.json").read_text())
    for name, row in summary["claims"].items():
        assert row["status"] in claims.STATUSES, name
    for experiment in reproduce.EXPERIMENTS:
        for check, passed in summary[experiment]["checks"].items():
            assert f"| {check} |" in text, check
    assert "| check | claim | threshold from | pass |" in text
    assert "| check | pass |" not in text and "| check | holds |" not in text


def test_fig5_horn_row_names_the_best_and_weakest_gate_and_the_transformer_at_the_largest_beta():
    acc = {"0": {"-3": {"8": 0.5, "64": 0.1}, "2": {"8": 0.0, "64": 0.0}},
           "1": {"-7.3": {"8": 0.9, "64": 0.0}, "-3": {"8": 0.8, "64": 0.25}, "2": {"8": 0.0, "64": 0.0}}}
    entry = {"fig5_horn": {"accuracy": acc, "transformer": {"1": {"8": 0.3, "64": 0.04}}}}
    assert p1_horn_claims._fig5_horn(entry) == "beta 1, largest k: best gate -3 0.25, weakest -7.3 0, Transformer 0.04"
    assert p1_horn_claims._fig5_horn({"fig5_horn": {"accuracy": acc}}).endswith("weakest -7.3 0")
    assert p1_horn_claims._fig5_horn({}) is None
    tied = {"1": {"1.6": {"64": 0.25}, "-3": {"64": 0.25}, "-0.2": {"64": 0.25}, "-7.3": {"64": 0.0}}}
    for order in (tied, {"1": dict(sorted(tied["1"].items()))}):   # as run, and as a sorted JSON stores it
        assert p1_horn_claims._fig5_horn({"fig5_horn": {"accuracy": order}}) == \
            "beta 1, largest k: best gates -3, -0.2, 1.6 0.25, weakest -7.3 0"


def test_p2_fig5_row_lists_parity_first_whatever_the_stored_order():
    entry = {"phase_code": {"mod3_deg": [0.0, 120.3], "parity_deg": [-0.4, 179.7]}}
    row = next(c for c in ROWS if c.key == "P2 Fig 5")
    assert row.ours(entry) == "parity 179.7, mod3 120.3"


def test_p2_fig6_row_gives_the_range_of_rotation_over_no_rotation_across_buckets():
    entry = {"bucket_ppl": {"rotation": {"0-128": 3.0, "128-256": 4.4, "rows": 7},
                            "no_rotation": {"0-128": 3.0, "128-256": 4.0, "rows": 7}}}
    assert p2_lm_claims._bucket_ratio(entry) == "rotation / no rotation 1.000–1.100× over 2 buckets"
    assert p2_lm_claims._bucket_ratio({}) is None
