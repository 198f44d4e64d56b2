"""The P1 Figure 1 program: flags and their errors, every panel end to end at tiny sizes, and the
Protocol §9 checks C6 (Fig 1a), C8 (Fig 1b) and C10 (Fig 1c/1d, slow)."""
import csv
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from ssmgate.models.simplified_ssm import margins
from ssmgate import reproduce
from ssmgate.programs.p1_fig1 import program as p1_fig1
from ssmgate.programs.p1_fig1 import report as p1_fig1_report
from ssmgate.cli.grids import parse_grid
from ssmgate.theory import gating as theory
from tests.main_runs import run_many

REPO = Path(__file__).resolve().parents[2]
TINY = {
    "a": p1_fig1.ToyGateCfg(panel="a", d=64, P=16, ell=4, delta=2, lr=0.1, batch=32, steps=5, seeds=2,
                            alpha0=(0.05, 0.5)),
    "b": p1_fig1.ToyGateCfg(panel="b", d=64, P=16, ell=4, delta=1, lr=0.3, batch=64, steps=600, seeds=1,
                            alpha0=(0.3, 0.03), segment=200),
    "c": p1_fig1.ToyGateCfg(panel="c", d=16, ell=32, delta=None, lr=0.1, batch=32, steps=20, seeds=2,
                            tau=(2.0, 1e4), eval_delta=(1, 8), n_test=64, segment=10),
    "d": p1_fig1.ToyGateCfg(panel="d", d=16, ell=16, delta=None, lr=0.1, batch=32, steps=20, seeds=1,
                            tau=(1.0, 4.0), n_test=64, delta_bins=3, segment=20),
}


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("panel, change, flag", [
    ("a", {"panel": "e"}, "--fig1_panel"),
    ("a", {"alpha0": (0.1, 1.5)}, "--fig1_alpha0=1.5"),
    ("a", {"alpha0": ()}, "--fig1_alpha0"),
    ("a", {"delta": 5}, "--fig1_query_distance=5"),
    ("a", {"delta": None}, "--fig1_query_distance"),
    ("a", {"eps": -0.1}, "--fig1_eps=-0.1"),
    ("a", {"eps": 0.5}, "--fig1_eps=0.5"),
    ("a", {"P": 3}, "--fig1_P=3"),
    ("a", {"lr": 0.0}, "--lr=0.0"),
    ("a", {"steps": 0}, "--steps=0"),
    ("c", {"tau": (4.0, 0.0)}, "--fig1_tau=0.0"),
    ("c", {"n_test": 0}, "--fig1_n_test=0"),
    ("c", {"eval_delta": (1, 33)}, "--fig1_eval_distances=33"),
    ("c", {"eval_delta": ()}, "--fig1_eval_distances"),
    ("c", {"train_query": "sometimes"}, "--fig1_train_query=sometimes"),
])
def test_bad_configuration_names_the_flag_and_the_range(panel, change, flag):
    with pytest.raises(p1_fig1.ConfigError) as err:
        p1_fig1.validate(dataclasses.replace(TINY[panel], **change))
    assert str(err.value).startswith(flag)
    assert "expected" in str(err.value)


def test_grid_parser():
    assert parse_grid("alpha0", "0.1, 0.2") == (0.1, 0.2)
    np.testing.assert_allclose(parse_grid("tau", "logspace:0:2:3,1e6"), [1, 10, 100, 1e6])
    with pytest.raises(ValueError, match="--fig1_tau: cannot read 'logspace:1'"):
        parse_grid("fig1_tau", "logspace:1")
    with pytest.raises(ValueError, match="--fig1_alpha0: cannot read 'abc'"):
        parse_grid("fig1_alpha0", "abc")


BAD_FLAGS = [
    (["--fig1_alpha0=0.5,1.2"], "--fig1_alpha0=1.2: expected values in (0, 1)"),
    (["--fig1_panel=x"], "--fig1_panel=x: expected one of a, b, c, d"),
    (["--fig1_ell=2"], "--fig1_query_distance=4: expected an integer in [1, ell=2]"),
    (["--fig1_eps=-0.2"], "--fig1_eps=-0.2: expected a label-flip probability in (0, 0.5)"),
    (["--fig1_query_distance=near"], "--fig1_query_distance=near: expected an integer distance"),
]


@pytest.fixture(scope="module")
def bad_flag_runs(tmp_path_factory):
    """Every BAD_FLAGS case through the entry point, in one child process: [(run dir, Result)]."""
    run_dirs = [tmp_path_factory.mktemp("bad_flag") / "run" for _ in BAD_FLAGS]
    results = run_many([["--flagfile=experiments/p1/quick/fig1a.flags", f"--run_dir={d}", *args]
                        for (args, _), d in zip(BAD_FLAGS, run_dirs)])
    return list(zip(run_dirs, results))


@pytest.mark.parametrize("case", range(len(BAD_FLAGS)), ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_main_stops_at_startup_on_a_bad_flag(bad_flag_runs, case):
    run_dir, res = bad_flag_runs[case]
    assert res.returncode != 0
    assert BAD_FLAGS[case][1] in res.stderr, res.stderr[-2000:]
    assert not run_dir.exists()  # nothing ran


CHECK_FLAG_FILES = """
import sys
from absl import flags
import ssmgate.main  # defines every flag
from ssmgate.programs.p1_fig1 import flags as p1_fig1_flags
for path in sys.argv[1:]:
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["check", "--flagfile=" + path])
    p1_fig1_flags.config_from_flags()
    print("valid", path)
"""


def test_every_flag_file_is_valid():
    files = sorted(p for p in (REPO / "experiments" / "p1").rglob("fig1*.flags") if "shared" not in p.parts)
    assert len(files) == 12  # four panels x (paper, cpu, quick); shared/fig1.flags is a part, not a run
    res = subprocess.run([sys.executable, "-c", CHECK_FLAG_FILES, *map(str, files)], cwd=REPO,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("valid") == 12


def test_dry_run_checks_and_runs_nothing(tmp_path):
    [res] = run_many([["--flagfile=experiments/p1/fig1c.flags", "--dry_run", f"--run_dir={tmp_path / 'run'}"]])
    assert res.returncode == 0, res.stderr[-2000:]
    assert "panel='c'" in res.stdout and not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """The four panels at tiny sizes, run once: {panel: (run dir, summary)}."""
    root = tmp_path_factory.mktemp("p1_fig1")
    return {p: (root / f"fig1{p}", p1_fig1.run(cfg, root / f"fig1{p}")) for p, cfg in TINY.items()}


def test_panel_a_end_to_end(tiny_runs):
    tmp_path, summary = tiny_runs["a"]
    rows = read_csv(tmp_path / "fig1a.csv")
    assert list(rows[0]) == ["alpha0", "seed", "delta_m", "delta_r"] and len(rows) == 4
    assert json.loads((tmp_path / "summary.json").read_text())["panel"] == "a"
    for name in ("fig1a.png", "params.npz", "metrics.jsonl", "config.json"):
        assert (tmp_path / name).exists(), name
    # Stronger initial retention -> larger retrieval margin.
    assert summary["delta_r"][1] > summary["delta_r"][0] > 0


def test_panel_b_end_to_end(tiny_runs):
    tmp_path, summary = tiny_runs["b"]
    rows = read_csv(tmp_path / "fig1b.csv")
    assert list(rows[0]) == ["alpha0", "seed", "escape_step", "ode_T_full", "ode_T_reduced"]
    steps = summary["escape_steps"]
    assert all(s is not None for s in steps) and steps[1] > steps[0]
    assert summary["escape_steps_strictly_increasing"]
    assert float(rows[0]["ode_T_full"]) == pytest.approx(theory.flow_escape_time(0.3, 16, 0.1))


@pytest.mark.parametrize("panel", ["c", "d"])
@pytest.mark.parametrize("train_query", ["matched", "uniform"])
def test_long_panels_end_to_end(tiny_runs, tmp_path, panel, train_query):
    cfg = dataclasses.replace(TINY[panel], train_query=train_query)
    if train_query == "matched":
        tmp_path, summary = tiny_runs[panel]
    else:
        summary = p1_fig1.run(cfg, tmp_path)
    acc = np.asarray(summary["accuracy"])
    deltas = cfg.eval_delta or tuple(range(1, cfg.ell + 1))
    assert acc.shape == (len(cfg.tau), len(deltas))
    assert np.all((acc >= 0) & (acc <= 1))
    rows = read_csv(tmp_path / "fig1cd.csv")
    assert list(rows[0]) == ["panel", "tau", "seed", "Delta", "acc", "bayes_acc", "n_test"]
    assert len(rows) == len(cfg.tau) * len(deltas) * cfg.seeds
    assert (tmp_path / f"fig1{panel}.png").exists()
    bayes = np.asarray(summary["bayes_accuracy"])
    if panel == "c":
        assert summary["max_abs_diff_to_bayes"] == pytest.approx(np.max(np.abs(acc - bayes)))
    else:  # panel d's cells are distance bins: bin means of the per-distance accuracies
        assert summary["max_abs_diff_to_bayes_per_distance"] == pytest.approx(np.max(np.abs(acc - bayes)))
        lo, hi = summary["bins"][1]
        np.testing.assert_allclose(np.asarray(summary["binned_accuracy"])[:, 1], acc[:, lo - 1:hi].mean(1))
        assert summary["max_abs_diff_to_bayes"] <= summary["max_abs_diff_to_bayes_per_distance"] + 1e-12


def test_delta_bins_cover_every_distance_once():
    for ell, n in ((512, 12), (16, 3), (5, 10)):
        bins = p1_fig1.delta_bins(ell, n)
        covered = [dl for lo, hi in bins for dl in range(lo, hi + 1)]
        assert covered == list(range(1, ell + 1))
        assert len(bins) <= n


def test_c6_first_step_rates_match_prop1():
    """C6 (i): the first SGD step's delta_r / delta_m increments vs P a^2 / ((1 - 2 eps)(1 + a)^2).

    The theory has exactly orthonormal keys; a random dictionary (d=512, P=32) shifts one seed's ratio
    by up to ~10% (fixed-label cross terms y_i y_j x_i.x_j), so the increments are averaged over 5."""
    base = dataclasses.replace(TINY["a"], d=512, P=32, ell=8, delta=4, eps=0.1, batch=8192, steps=1, seeds=5,
                               alpha0=(0.05, 0.1, 0.2, 0.4))
    alpha_r, _, params, data, batch_fn, lift = p1_fig1._short_setup(base)
    loss = p1_fig1._loss_fn(p1_fig1._model(base))

    def first_step(p, data):
        g = jax.grad(loss)(p, batch_fn(data, 0))
        p = jax.tree.map(lambda a, b: a - base.lr * b, p, g)
        return margins(p, data[0].keys, data[0].labels, base.delta)

    dm, dr = jax.jit(lift(jax.vmap(first_step, in_axes=(0, None)), 1))(params, data)
    ratio = np.asarray(dr).reshape(4, 5).mean(1) / np.asarray(dm).reshape(4, 5).mean(1)
    np.testing.assert_allclose(ratio, theory.initial_rate_ratio(np.asarray(base.alpha0), 32, 0.1), rtol=0.1)


def test_c6_margins_after_25_steps(tmp_path):
    """C6 (ii, iii): after 25 steps delta_r < delta_m for alpha0 <= 0.12, > for >= 0.25; crossing in [0.14, 0.23]."""
    cfg = dataclasses.replace(TINY["a"], d=512, P=32, ell=8, delta=4, eps=0.1, batch=128, steps=25, seeds=5,
                              alpha0=(0.05, 0.08, 0.12, 0.25, 0.4))
    s = p1_fig1.run(cfg, tmp_path)
    dm, dr = np.asarray(s["delta_m"]), np.asarray(s["delta_r"])
    assert np.all(dr[:3] < dm[:3]) and np.all(dr[3:] > dm[3:])
    assert 0.14 <= s["crossing_alpha0"] <= 0.23


def test_c8_escape_steps_follow_the_flow(tmp_path):
    """C8 (soft part): escape step increases as alpha0 decreases; 0.3 x step within 40% of the 3-D flow."""
    cfg = dataclasses.replace(TINY["b"], d=256, P=32, ell=4, delta=1, eps=0.1, lr=0.3, batch=128, steps=3000,
                              seeds=1, alpha0=(0.1, 0.03, 0.01, 3e-3, 1e-3), segment=1000)
    s = p1_fig1.run(cfg, tmp_path)
    assert s["escape_steps_strictly_increasing"]
    assert all(s["sgd_over_flow_within_40pct"]), s["sgd_over_flow"]


@pytest.mark.slow
def test_c10_trained_long_context_matches_bayes(tmp_path):
    """C10: d=64, ell=256, frozen gate, 1,500 SGD steps."""
    cfg = p1_fig1.ToyGateCfg(panel="c", d=64, ell=256, delta=None, lr=0.1, batch=128, steps=1500, seeds=1,
                             tau=(4.0, 16.0, 64.0, 1e4), eval_delta=(1, 8, 32), n_test=20000, segment=500)
    s = p1_fig1.run(cfg, tmp_path)
    acc = np.asarray(s["accuracy"])
    assert s["max_abs_diff_to_bayes"] <= 0.03
    assert abs(acc[-1].mean() - 0.692) <= 0.02  # Phi(sqrt(64/255)) at tau = 1e4
    d = dataclasses.replace(cfg, panel="d", tau=(1.0, 2.0, 4.0, 8.0, 16.0), eval_delta=(), n_test=5000)
    sd = p1_fig1.run(d, tmp_path / "d")
    dm = sd["delta_max_80"]
    assert all(b > a for a, b in zip(dm, dm[1:])), dm


def test_report_gathers_the_panels(tiny_runs, tmp_path):
    root = next(iter(tiny_runs.values()))[0].parent
    runs = {f"fig1{p}": s for p, (_, s) in tiny_runs.items()}
    changes = {r: reproduce.changes_from_paper("p1", r, "cpu") for r in runs}
    quick = reproduce.changes_from_paper("p1", "fig1b", "quick")  # its segment differs too: pacing, not a change
    assert "fig1_d: 512 -> 256" in quick and not any("segment" in c for c in quick)
    entry, md = p1_fig1_report.build(runs, "cpu", changes, {r: 1.0 for r in runs}, figure_dir=tmp_path / "figures",
                                     run_root=root)
    assert entry["fig1cd"]["max_abs_diff_to_bayes"] == max(runs["fig1c"]["max_abs_diff_to_bayes"],
                                                           runs["fig1d"]["max_abs_diff_to_bayes"])
    assert set(entry["checks"]) == {
        "fig1a_crossing_alpha0_in_[0.15,0.21]", "fig1b_escape_steps_strictly_increasing",
        "fig1b_sgd_over_flow_within_40pct", "fig1c_rise_then_fall_for_delta_ge_16",
        "fig1c_no_decay_accuracy_within_0.02_of_theory_%.3f_at_this_size" % runs["fig1c"]["no_decay_theory"],
        "fig1cd_max_abs_diff_to_bayes_per_distance_le_0.03", "fig1d_contour_prop_to_tau_log_d_over_tau_r2_ge_0.9"}
    for p in "abcd":
        assert (tmp_path / "figures" / f"fig1{p}.png").exists()
        assert f"figures/fig1{p}.png" in md
    assert "steps: 10000 -> 500" in " ".join(changes["fig1c"])
    assert "fig1d" in entry and "accuracy" not in entry["fig1d"]  # the full grid stays in the run directory


def _fig1d_entry(dm80, dm90):
    tau = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0]
    tl = [t * np.log(128 / t) if t < 128 else None for t in tau]
    return {"fig1d": {"tau": tau, "tau_log_d_over_tau": tl, "delta_max_80": dm80, "delta_max_90": dm90,
                      "max_abs_diff_to_bayes": 0.01, "max_abs_diff_to_bayes_per_distance": 0.02}}


def test_fig1d_contour_check_states_prop_9():
    """Prop 9: Delta_max ~ tau log(d/tau) for tau << d (tau <= d/8 here: 1 .. 16), at both levels."""
    name = "fig1d_contour_prop_to_tau_log_d_over_tau_r2_ge_0.9"
    # the committed cpu contour (the trained Delta_max equals Bayes'): R^2 0.987 and 0.996
    good = _fig1d_entry([3, 5, 9, 15, 25, 39, 55, 65], [3, 4, 7, 12, 18, 25, 29, 13])
    assert p1_fig1_report.recheck(good)[name] is True
    fit = p1_fig1_report.contour_fit(good["fig1d"]["tau"], [3, 5, 9, 15, 25, 39, 55, 65],
                                     good["fig1d"]["tau_log_d_over_tau"], 8)
    assert fit["n"] == 5 and fit["r2"] == pytest.approx(0.9868, abs=1e-3) and fit["c"] == pytest.approx(0.714, abs=1e-3)
    flat = _fig1d_entry([10, 10, 11, 10, 10, 39, 55, 65], [3, 4, 7, 12, 18, 25, 29, 13])  # no growth with tau
    assert p1_fig1_report.recheck(flat)[name] is False
    too_few = _fig1d_entry([3, 5, 9, 15, 25, 39, 55, 65], [3, 4, 7, 12, 18, 25, 29, 13])
    too_few["fig1d"]["tau_log_d_over_tau"][2:] = [None] * 6  # two taus with tau << d: nothing to fit
    assert p1_fig1_report.recheck(too_few)[name] is False
