"""The P1 Figure 1 section of the reproduction report and its entry `p1_fig1` in summary.json."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np

from ssmgate.report.format import Checks, cell as _f, checks_table, table as _table

from .claims import BARS as bars

PAPER = {  # the paper's readings and protocol §2.6 / §9.1 references
    "alpha_star": 0.158, "no_decay_accuracy": 0.638,
}


def contour_fit(tau, delta_max, tau_log, ratio: float) -> dict:
    """Least-squares fit through the origin of delta_max = c tau log(d/tau) over the taus with d/tau >= ratio
    (tau << d, read off tau_log itself: log(d/tau) = tau_log / tau); {"c", "r2", "n"}."""
    pts = [(tl, dm) for t, dm, tl in zip(tau, delta_max, tau_log) if tl is not None and tl / t >= math.log(ratio)]
    if len(pts) < 2:
        return {"c": None, "r2": None, "n": len(pts)}
    x, y = (np.asarray(v, np.float64) for v in zip(*pts))
    c = float(x @ y / (x @ x))
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - c * x) ** 2).sum()) / ss_tot if ss_tot > 0 else None
    return {"c": c, "r2": r2, "n": len(pts)}


def _checks(runs, at_paper_size: bool) -> Checks:
    checks = Checks()
    a, b, c, d = (runs.get(k) for k in ("fig1a", "fig1b", "fig1c", "fig1d"))
    if a:
        lo, hi = bars.bar("fig1a_crossing_lo"), bars.bar("fig1a_crossing_hi")
        checks.add(f"fig1a_crossing_alpha0_in_[{lo:g},{hi:g}]",
                   a["crossing_alpha0"] is not None and lo <= a["crossing_alpha0"] <= hi,
                   "P1 Fig 1a: the memorisation and retrieval margins cross near alpha* ~ 0.158",
                   bars.source("fig1a_crossing_lo"))
    if b:
        checks.add("fig1b_escape_steps_strictly_increasing", b["escape_steps_strictly_increasing"],
                   "P1 Fig 1b: the escape from the memorisation plateau comes strictly later for smaller alpha0",
                   "P1 Fig 1b (an ordering)")
        tol = bars.bar("fig1b_sgd_over_flow")
        checks.add(f"fig1b_sgd_over_flow_within_{round(100 * tol)}pct",
                   all(r is not None and abs(r - 1.0) <= tol for r in b["sgd_over_flow"]),
                   "P1 Fig 1b: SGD escapes when the 3-D gradient flow predicts", bars.source("fig1b_sgd_over_flow"))
    if c:
        # The paper's 0.638 is the d=128, ell=1024 value; other sizes are held to their own theory value.
        ref = PAPER["no_decay_accuracy"] if at_paper_size else c["no_decay_theory"]
        name = "paper_0.638" if at_paper_size else f"theory_{ref:.3f}_at_this_size"
        tol = bars.bar("fig1c_no_decay_tol")
        checks.add(f"fig1c_no_decay_accuracy_within_{tol:g}_of_{name}", abs(c["no_decay_accuracy"] - ref) <= tol,
                   "P1 Fig 1c: without decay the model scores the Bayes accuracy of retrieval alone",
                   bars.source("fig1c_no_decay_tol"))
        checks.add("fig1c_rise_then_fall_for_delta_ge_16", bool(c["rise_then_fall"]) and all(c["rise_then_fall"].values()),
                   "P1 Fig 1c: for distant keys accuracy first rises, then falls as tau grows", "P1 Fig 1c")
    if d and d.get("tau_log_d_over_tau"):
        ratio, r2_bar = bars.bar("fig1d_tau_ll_d"), bars.bar("fig1d_contour_r2")
        fits = {level: contour_fit(d["tau"], d[f"delta_max_{level}"], d["tau_log_d_over_tau"], ratio)
                for level in (80, 90)}
        checks.add(f"fig1d_contour_prop_to_tau_log_d_over_tau_r2_ge_{r2_bar:g}",
                   all(f["n"] >= 3 and f["r2"] >= r2_bar for f in fits.values()),
                   "P1 Fig 1d (Prop 9): for tau << d the contour of the trained accuracy (the last distance at "
                   "accuracy >= 0.8 and >= 0.9) grows as tau log(d/tau)", bars.source("fig1d_contour_r2", "fig1d_tau_ll_d"))
    if c or d:
        tol = bars.bar("fig1cd_bayes_tol")
        # Fig 1d compared at every single distance, not in bins (binning averages deviations away)
        gaps = [c["max_abs_diff_to_bayes"]] if c else []
        if d:
            gaps.append(d["max_abs_diff_to_bayes_per_distance"])
        checks.add(f"fig1cd_max_abs_diff_to_bayes_per_distance_le_{tol:g}", max(gaps) <= tol,
                   "P1 Fig 1c/d: the trained models score the Bayes-optimal accuracy at every tau and single "
                   "distance (our bar: the paper shows the curves and the binned heat map)",
                   bars.source("fig1cd_bayes_tol"))
    return checks


def recheck(entry: dict) -> Checks:
    """The checks of a summary entry written earlier (its runs' folders gone). Panel c ran at the
    paper's size when its Bayes value is the paper's 0.638 (d = 128, l = 1024; the entry keeps no sizes)."""
    runs = {k: entry[k] for k in ("fig1a", "fig1b", "fig1c", "fig1d") if k in entry}
    at_paper_size = "fig1c" in runs and round(runs["fig1c"]["no_decay_theory"], 3) == PAPER["no_decay_accuracy"]
    return _checks(runs, at_paper_size)


def build(runs: dict, scale: str, changes: dict, walls: dict, figure_dir: Path, run_root: Path):
    """(summary entry, markdown section) from the panel runs' summaries (missing panels are skipped)."""
    figure_dir.mkdir(parents=True, exist_ok=True)
    for run in runs:
        png = run_root / run / f"{run}.png"
        if png.exists():
            shutil.copy(png, figure_dir / png.name)
    entry = {k: v for k, v in runs.items() if k != "fig1d"}
    if "fig1d" in runs:  # the full (tau, Delta) grid stays in the run's own summary and CSV
        entry["fig1d"] = {k: v for k, v in runs["fig1d"].items() if k not in ("accuracy", "bayes_accuracy", "Delta")}
    cd = [runs[k]["max_abs_diff_to_bayes"] for k in ("fig1c", "fig1d") if k in runs]
    if cd:
        entry["fig1cd"] = {"max_abs_diff_to_bayes": max(cd)}
    configs = {r: json.loads((run_root / r / "config.json").read_text()) for r in runs}
    checks = _checks(runs, "fig1c" in configs and (configs["fig1c"]["d"], configs["fig1c"]["ell"]) == (128, 1024))
    entry["checks"] = checks
    entry["changes_from_paper"] = changes
    entry["wall_s"] = walls

    md = [f"## P1 Figure 1: memorisation vs retrieval in the simplified SSM ({scale} scale)\n"]
    if scale == "quick":
        md.append("Quick scale shrinks panels b–d (see the changes below); the acceptance checks are stated "
                  "for the `cpu` scale, which runs the paper's sizes.\n")
    a = runs.get("fig1a")
    if a:
        md.append("### Fig 1a: margins after 25 SGD steps\n\n![Fig 1a](figures/fig1a.png)\n")
        md.append(_table(["quantity", "paper", "theory", "ours"], [
            ["α0 where δ_r = δ_m after the run", "α* ≈ 0.158 marks the switch", f"{_f(a['flow_crossing_alpha0'])} (gradient flow at t = {_f(a['flow_time'])})", a["crossing_alpha0"]],
            ["α* = √((1−2ε)/P)", PAPER["alpha_star"], a["alpha_star"], "–"],
            ["exact equal-initial-rate point", "–", a["equal_rate_alpha"], "–"],
        ]))
    b = runs.get("fig1b")
    if b:
        md.append("### Fig 1b: escape time vs α0\n\n![Fig 1b](figures/fig1b.png)\n")
        rows = [[al, tf, tr, (None if m is None else b["lr"] * m), r]
                for al, tf, tr, m, r in zip(b["alpha0"], b["flow_escape_time"], b["reduced_escape_time"],
                                            b["escape_steps"], b["sgd_over_flow"])]
        md.append(_table(["α0", "3-D flow T (theory)", "reduced flow T (Prop. 4)", "ours: lr × escape step", "ours / 3-D flow"], rows))
        md.append("The paper shows the Θ(1/(α0 log(1/α0))) scaling; protocol §9.1 asks lr × steps within ±40% of the 3-D flow.\n")
    c = runs.get("fig1c")
    if c:
        md.append("### Fig 1c: accuracy vs frozen gate length τ\n\n![Fig 1c](figures/fig1c.png)\n")
        header = ["τ"] + [f"Δ={dl}: ours / Bayes" for dl in c["Delta"]]
        rows = [[t] + [f"{x:.3f} / {y:.3f}" for x, y in zip(acc, bay)]
                for t, acc, bay in zip(c["tau"], c["accuracy"], c["bayes_accuracy"])]
        md.append(_table(header, rows))
        md.append(_table(["quantity", "paper", "theory", "ours"], [
            [f"no-decay accuracy (τ = {_f(c['no_decay_tau'])})", 0.638, c["no_decay_theory"], c["no_decay_accuracy"]],
            ["max over cells of abs(ours − Bayes)", "–", 0, c["max_abs_diff_to_bayes"]],
        ]))
    d = runs.get("fig1d")
    if d:
        md.append("### Fig 1d: accuracy over (τ, Δ)\n\n![Fig 1d](figures/fig1d.png)\n")
        rows = [[t, o8, b8, o9, b9, tl] for t, o8, b8, o9, b9, tl in zip(
            d["tau"], d["delta_max_80"], d["bayes_delta_max_80"], d["delta_max_90"], d["bayes_delta_max_90"],
            d["tau_log_d_over_tau"])]
        md.append(_table(["τ", "Δmax(acc≥0.8) ours", "Bayes", "Δmax(acc≥0.9) ours", "Bayes", "τ log(d/τ)"], rows))
        fits = {lv: contour_fit(d["tau"], d[f"delta_max_{lv}"], d["tau_log_d_over_tau"], bars.bar("fig1d_tau_ll_d"))
                for lv in (80, 90)}
        md.append("Prop 9's contour: fitting Δmax = c·τ log(d/τ) through the origin over τ ≤ d/"
                  f"{bars.bar('fig1d_tau_ll_d'):g} gives " + "; ".join(
                      f"at accuracy ≥ 0.{lv // 10}: c = {_f(f['c'])}, R² = {_f(f['r2'])} ({f['n']} τ)"
                      for lv, f in fits.items()) + ".\n")
        md.append(f"The heat map's cells are (τ, distance bin) with the bins {d['bins']}; max over them of "
                  f"abs(ours − Bayes), each averaged over the bin's distances: {_f(d['max_abs_diff_to_bayes'])} "
                  f"(per single distance: {_f(d['max_abs_diff_to_bayes_per_distance'])}).\n")
    if checks:
        md.append("### Checks (issue #3 acceptance, stated for the cpu scale)\n")
        md.append(checks_table(checks))
    md.append("### What this scale changes from the paper's flag files\n")
    lines = [f"- {run}: {', '.join(ch) if ch else 'nothing'}" for run, ch in changes.items()]
    md.append("\n".join(lines) + "\n")
    md.append("Panels c/d train one model per evaluated distance (c) or distance bin (d) "
              "(`--fig1_train_query=matched`, see docs/reproduction.md).\n")
    md.append(_table(["run", "wall time (s), including start-up"], [[r, w] for r, w in walls.items()]))
    return entry, "\n".join(md)
