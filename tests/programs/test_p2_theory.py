"""The P2 theory experiment (`p2_theory`): its run measures P2 App. A / App. C on random draws and
closed forms, its checks pass on those numbers and fail on wrong ones, its flag files run from main,
and its section and claim row come out of the report."""
from __future__ import annotations

import copy
import json

import pytest

from ssmgate.programs.p2_theory import program as p2_theory
from ssmgate.programs.p2_theory import claims as theory_claims, report
from ssmgate.report import claims
from tests.main_runs import REPO, run_many

DRAWS = 200


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("p2_theory") / "theory"
    return p2_theory.run(p2_theory.TheoryCfg(draws=DRAWS, figure=False), str(run_dir)), run_dir


def test_the_run_measures_the_papers_facts(summary):
    s, run_dir = summary
    assert json.loads((run_dir / "summary.json").read_text())["table8"] == json.loads(json.dumps(s["table8"]))
    fams = s["table8"]
    assert list(fams) == list(report.PAPER_TABLE8)
    for name, f in fams.items():
        assert f["draws"] == DRAWS and f["type_agree"] == DRAWS, name
    assert 0 < fams["complex_kda"]["stated_complex"] < DRAWS and 0 < fams["momentum_deltanet"]["found_complex"] < DRAWS
    assert fams["deltanet"]["real_zeta_inf"] == DRAWS and fams["linear_attention"]["real_zeta_nan"] == DRAWS
    assert fams["kda"]["real_zeta_values"] == 6 * DRAWS  # every pair of the 4 rates
    assert s["gain"]["simulated"]["0"] == pytest.approx(100.0, abs=1e-9)
    assert s["gain"]["closed_form"]["pi/2"] == pytest.approx(1 / (1 + 0.99 ** 2) ** 0.5, rel=1e-12)
    assert s["closed_form"]["grid_points"] == 45
    checks = report.checks(s)
    assert checks and all(checks.values()), checks
    assert len(checks) == 12 and all(name.startswith(("table8_", "appC")) for name in checks)


def _failing(entry: dict, edit) -> list[str]:
    wrong = copy.deepcopy(entry)
    edit(wrong)
    return [name for name, ok in report.checks(wrong).items() if not ok]


def _set(path, value):
    def edit(e):
        *head, last = path
        for key in head:
            e = e[key]
        e[last] = value
    return edit


@pytest.mark.parametrize("path,value,failing", [
    (("table8", "kda", "type_agree"), DRAWS - 1, "table8_eigen_type_matches_stated_condition_on_every_draw"),
    (("table8", "complex_kda", "stated_complex"), 0, "table8_eigen_type_matches_stated_condition_on_every_draw"),
    (("table8", "momentum_deltanet", "max_zeta_gap_complex"), 1e-6,
     "table8_damping_ratio_formulas_match_eigenvalues_within_1e-09"),
    (("table8", "gated_deltanet", "real_zeta_min"), 0.95, "table8_damping_column_holds_on_every_draw"),
    (("table8", "deltanet", "real_zeta_inf"), DRAWS - 1, "table8_damping_column_holds_on_every_draw"),
    (("table8", "complex_kda", "complex_zeta_max"), 1.0, "table8_damping_column_holds_on_every_draw"),
    (("complex_kda_boundary", "type_changes_across"), False, "table8_complex_kda_boundary_separates_real_and_complex"),
    (("closed_form", "max_rel_err_vs_expm"), 2e-6, "appC1_closed_form_transition_within_1e-06_of_expm"),
    (("modal", "critical", "rel_err_to_N"), [5e-4, 2e-3], "appC2_critical_scaled_propagator_within_0.001_of_N"),
    (("modal", "overdamped", "cos_start_end"), [[0.3, 0.9985]], "appC2_overdamped_direction_cos_above_0.999"),
    (("modal", "underdamped", "angle_drift_rotation"), [1e-8], "appC2_underdamped_angles_kept_within_1e-09"),
    (("modal", "fastest_decay", "argmax_a"), 1.5, "appC2_critical_damping_decays_fastest"),
    (("gain", "simulated", "0"), 99.85, "appC3_gain_rho0.99_theta0_within_0.1_of_100"),
    (("gain", "simulated", "pi/2"), 0.7125, "appC3_gain_rho0.99_theta_pi2_within_0.001_of_0.7107"),
    (("gain", "grid", "max_rotated_over_unrotated"), 1.0, "appC3_rotation_lowers_gain_at_every_theta"),  # a tie fails
])
def test_a_wrong_number_fails_its_check_and_only_it(summary, path, value, failing):
    assert _failing(summary[0], _set(path, value)) == [failing]


def test_the_section_and_the_claim_row(summary, tmp_path):
    s, run_dir = summary
    (run_dir / "spectra.png").write_bytes(b"\x89PNG stand-in")
    entry, md = report.build({"theory": s}, "cpu", {"theory": []}, {"theory": 4.2}, tmp_path / "fig", run_dir.parent)
    assert entry["checks"] == report.recheck(json.loads(json.dumps(entry)))
    assert entry["wall_s"] == {"theory": 4.2} and entry["changes_from_paper"] == {"theory": []}
    assert "| family | paper: complex iff |" in md and "| App. C | paper (the fact) | ours |" in md
    stated = s["table8"]["complex_kda"]["stated_complex"]
    assert f"| Complex KDA | \\|cos theta\\| < 2 sqrt(-alpha) / (1 - alpha) | {stated} / {stated} |" in md
    assert "![spectra](figures/p2_theory_spectra.png)" in md and (tmp_path / "fig" / "p2_theory_spectra.png").exists()
    for name in entry["checks"]:
        assert f"| {name} |" in md
    row = claims.rows({"p2_theory": entry}, theory_claims.CLAIMS)["P2 theory"]
    assert row["status"] == "reproduced" and row["checks"] == sorted(entry["checks"])
    assert row["ours"] == f"type as stated on {6 * DRAWS} of {6 * DRAWS} draws; gain 100 / 0.711"
    wrong = copy.deepcopy(entry)
    wrong["gain"]["simulated"]["0"] = 90.0
    wrong["checks"] = report.recheck(wrong)
    assert claims.rows({"p2_theory": wrong}, theory_claims.CLAIMS)["P2 theory"]["status"] == "partly"
    _, missing = report.build({}, "cpu", {"theory": []}, {}, tmp_path / "fig", run_dir.parent)
    assert "Runs without a summary (failed or not run): theory" in missing


def test_the_flag_files_run_from_main(tmp_path):
    files = [f"experiments/p2/{where}theory.flags" for where in ("", "cpu/", "quick/")]
    results = run_many([[f"--flagfile={f}", "--dry_run"] for f in files]
                       + [["--flagfile=experiments/p2/quick/theory.flags", "--theory_draws=20", "--theory_figure=false",
                           f"--run_dir={tmp_path / 'run'}"],
                          ["--program=p2_theory", "--theory_key_dim=1", "--dry_run"],
                          ["--program=p2_theory", "--steps=3", "--dry_run"]])
    for f, res in zip(files, results):
        assert res.returncode == 0 and "TheoryCfg(draws=1000, key_dim=4, gain_steps=5000, seed=0" in res.stdout, f
    run, bad, unread = results[3:]
    assert run.returncode == 0, run.stderr[-2000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["config"]["draws"] == 20 and all(report.checks(s).values())
    assert "--theory_draws=20" in (tmp_path / "run" / "flags.txt").read_text()
    assert bad.returncode != 0 and "--theory_key_dim=1: expected an integer >= 2" in bad.stderr
    assert unread.returncode != 0 and "--steps is not a flag of --program=p2_theory" in unread.stderr
    assert (REPO / "experiments" / "p2" / "theory.flags").read_text().count("--program=p2_theory") == 1
