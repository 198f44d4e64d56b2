"""The P2 theory section of the reproduction report and its summary entry `p2_theory`.

`build(runs, ...)` takes the summary of the `theory` run (ssmgate.programs.p2_theory.program:
"table8", "complex_kda_boundary", "closed_form", "modal", "gain", "config") and returns that summary
with its checks, scale changes and wall time as the entry, and the section: P2 Table 8 (App. A)
beside ours over random draws, App. C's facts beside ours, and the checks. Every check states a
claim of P2 first and reads its threshold from this package's claims.py.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from ssmgate.report.format import Checks, cell, report_tail, table

from .claims import BARS as bars

RUN = "theory"
FAMILY_NAMES = {
    "linear_attention": "Linear attention", "deltanet": "DeltaNet", "gated_deltanet": "Gated DeltaNet",
    "kda": "KDA", "complex_kda": "Complex KDA", "momentum_deltanet": "Momentum DeltaNet",
}
# P2 Table 8 (protocol §1.7): "complex eigenvalues iff" and "damping" columns.
PAPER_TABLE8 = {
    "linear_attention": ("never", "none: pure accumulation (all eigenvalues 1)"),
    "deltanet": ("never", "no restoring term (omega0 = 0)"),
    "gated_deltanet": ("never", "zeta = (2 gamma + b) / (2 sqrt(gamma (gamma + b))) > 1"),
    "kda": ("never", "zeta = (b_i + b_j) / (2 sqrt(b_i b_j)) > 1"),
    "complex_kda": ("\\|cos theta\\| < 2 sqrt(-alpha) / (1 - alpha)", "underdamped (zeta < 1) when complex"),
    "momentum_deltanet": ("tau^2 < 4 alpha mu", "underdamped (zeta < 1) when complex"),
}
COMPLEX_FAMILIES = ("complex_kda", "momentum_deltanet")
REAL_RATE_FAMILIES = ("gated_deltanet", "kda")  # Table 8: zeta > 1
GAIN_REF = {"0": 100.0, "pi/2": 0.7107}  # protocol §1.8's worked numbers at rho = 0.99 (computed, not P2's)


def _damping_column_holds(name: str, f: dict) -> bool:
    """Table 8's damping column for one family, on every draw (the counts and ranges of the entry)."""
    n = f["draws"]
    if name == "linear_attention":  # no damping at all: no ratio on any draw
        return f["real_zeta_nan"] == n and f["real_zeta_values"] == 0 and f["found_complex"] == 0
    if name == "deltanet":  # no restoring term: omega0 = 0, zeta infinite on every draw
        return f["real_zeta_inf"] == n and f["real_zeta_values"] == 0 and f["found_complex"] == 0
    if name in REAL_RATE_FAMILIES:  # two real rates on every draw, zeta > 1
        return (f["found_complex"] == 0 and f["real_zeta_nan"] == 0 and f["real_zeta_inf"] == 0
                and f["real_zeta_min"] is not None and f["real_zeta_min"] > 1.0)
    # complex families: every complex draw underdamped, 0 < zeta < 1
    return (f["found_complex"] > 0 and f["complex_zeta_min"] is not None and f["complex_zeta_min"] > 0.0
            and f["complex_zeta_max"] < 1.0)


def checks(entry: dict) -> Checks:
    """P2 App. A / App. C as checks C3-C5 of protocol §9 state them; thresholds from claims.py."""
    out = Checks()
    fams = entry.get("table8")
    if fams:
        agree = bars.bar("theory_type_agreement")
        both_sides = all(0 < fams[m]["stated_complex"] < fams[m]["draws"] for m in COMPLEX_FAMILIES if m in fams)
        out.add("table8_eigen_type_matches_stated_condition_on_every_draw",
                all(f["draws"] > 0 and f["type_agree"] / f["draws"] >= agree for f in fams.values()) and both_sides
                and all(fams[m]["stated_complex"] == 0 for m in fams if m not in COMPLEX_FAMILIES),
                "P2 Table 8: the frozen transition has complex eigenvalues exactly when the 'complex iff' column "
                "says (never for the four real families); the complex families' draws fall on both sides",
                bars.source("theory_type_agreement"))
        tol = bars.bar("theory_zeta_tol")
        out.add(f"table8_damping_ratio_formulas_match_eigenvalues_within_{tol:g}",
                all(f["max_zeta_gap_complex"] is not None and f["max_zeta_gap_complex"] <= tol
                    and f["max_inv_zeta_gap_real"] is not None and f["max_inv_zeta_gap_real"] <= tol
                    for f in fams.values()),
                "P2 Table 8 / App. A: each family's damping-ratio formula equals the ratio of its eigenvalues, "
                "-log rho / sqrt(log^2 rho + phi^2) for a complex pair", bars.source("theory_zeta_tol"))
        out.add("table8_damping_column_holds_on_every_draw",
                set(fams) == set(PAPER_TABLE8) and all(_damping_column_holds(m, f) for m, f in fams.items()),
                "P2 Table 8: linear attention has no damping, DeltaNet no restoring term, Gated DeltaNet and KDA "
                "zeta > 1 (overdamped), complex KDA and momentum DeltaNet 0 < zeta < 1 when complex",
                "P2 App. A, Table 8's damping column (no threshold)")
    boundary = entry.get("complex_kda_boundary")
    if boundary:
        out.add("table8_complex_kda_boundary_separates_real_and_complex", bool(boundary["type_changes_across"]),
                "P2 Table 8: complex KDA's eigenvalues turn complex exactly where abs(cos theta) falls below "
                "2 sqrt(-alpha) / (1 - alpha)", "P2 App. A, Table 8 (protocol §9 C5; no threshold)")
    closed = entry.get("closed_form")
    if closed:
        tol = bars.bar("theory_expm_rel")
        out.add(f"appC1_closed_form_transition_within_{tol:g}_of_expm", closed["max_rel_err_vs_expm"] <= tol,
                "P2 App. C.1: exp(dt A(kappa)) = e^{-a dt} [c(kappa) I + s(kappa) N] in every regime",
                bars.source("theory_expm_rel"))
    modal = entry.get("modal")
    if modal:
        tol = bars.bar("theory_critical_tol")
        out.add(f"appC2_critical_scaled_propagator_within_{tol:g}_of_N",
                all(e <= tol for e in modal["critical"]["rel_err_to_N"]),
                "P2 App. C.2: at critical damping e^{omega0 t} e^{At} / t tends to the rank-1 nilpotent N",
                bars.source("theory_critical_tol"))
        cos = bars.bar("theory_overdamped_cos")
        out.add(f"appC2_overdamped_direction_cos_above_{cos:g}",
                all(end > cos for _, end in modal["overdamped"]["cos_start_end"]),
                "P2 App. C.2: an overdamped state collapses onto the slow mode's direction",
                bars.source("theory_overdamped_cos"))
        tol = bars.bar("theory_angle_tol")
        out.add(f"appC2_underdamped_angles_kept_within_{tol:g}",
                all(d <= tol for d in modal["underdamped"]["angle_drift_rotation"]),
                "P2 App. C.2: an underdamped block shrinks every state alike and keeps the angles between them",
                bars.source("theory_angle_tol"))
        fast = modal["fastest_decay"]
        out.add("appC2_critical_damping_decays_fastest",
                abs(fast["argmax_a"] - fast["omega0"]) <= fast["grid_step"],
                "P2 App. C.2: at a fixed natural frequency the slowest mode decays fastest at critical damping "
                "(a = omega0)", "P2 App. C.2 (the grid step of a is the resolution)")
    gain = entry.get("gain")
    if gain:
        sim = gain["simulated"]
        tol0, tol90 = bars.bar("theory_gain_tol_0"), bars.bar("theory_gain_tol_pi2")
        out.add(f"appC3_gain_rho0.99_theta0_within_{tol0:g}_of_100", abs(sim["0"] - GAIN_REF["0"]) <= tol0,
                "P2 App. C.3: without rotation a constant write accumulates to 1 / (1 - rho)",
                bars.source("theory_gain_tol_0"))
        out.add(f"appC3_gain_rho0.99_theta_pi2_within_{tol90:g}_of_0.7107",
                abs(sim["pi/2"] - GAIN_REF["pi/2"]) <= tol90,
                "P2 App. C.3: the gain of a rotating accumulator is 1 / abs(1 - rho e^{i theta})",
                bars.source("theory_gain_tol_pi2"))
        out.add("appC3_rotation_lowers_gain_at_every_theta", gain["grid"]["max_rotated_over_unrotated"] < 1.0,
                "P2 App. C.3: any rotation theta != 0 (mod 2 pi) lowers the accumulation of a constant write at the "
                "same rho", "P2 App. C.3 (an ordering, strict)")
    return out


def recheck(entry: dict) -> Checks:
    """The checks of a summary entry written earlier (its run folder gone)."""
    return checks(entry)


def _zeta(x) -> str:
    """A damping ratio with the digits that show its side of 1 (0.9998, 1 + 2e-07)."""
    if x is not None and x != 1.0 and abs(x - 1.0) < 1e-4:  # four digits would print 1
        return f"1 {'+' if x > 1.0 else '-'} {abs(x - 1.0):.1e}"
    return cell(x, 4)


def _range(lo, hi) -> str:
    return "–" if lo is None else f"[{_zeta(lo)}, {_zeta(hi)}]"


def _ours_zeta(name: str, f: dict) -> str:
    if name == "linear_attention":
        return f"none on {f['real_zeta_nan']} of {f['draws']} draws (all eigenvalues 1)"
    if name == "deltanet":
        return f"infinite on {f['real_zeta_inf']} of {f['draws']} draws"
    parts = []
    if f["found_complex"]:
        parts.append(f"complex: {_range(f['complex_zeta_min'], f['complex_zeta_max'])}")
    if f["real_zeta_values"]:
        parts.append(("real: " if f["found_complex"] else "") + _range(f["real_zeta_min"], f["real_zeta_max"]))
    if f["real_zeta_nan"]:
        parts.append(f"{f['real_zeta_nan']} real draws with a negative eigenvalue (no damped analogue)")
    return "; ".join(parts)


def _table8(fams: dict) -> str:
    rows = []
    for name in sorted(fams, key=lambda m: list(PAPER_TABLE8).index(m) if m in PAPER_TABLE8 else len(PAPER_TABLE8)):
        f = fams[name]
        paper_iff, paper_zeta = PAPER_TABLE8.get(name, ("–", "–"))
        rows.append([FAMILY_NAMES.get(name, name), paper_iff, f"{f['stated_complex']} / {f['found_complex']}",
                     f"{f['type_agree']} of {f['draws']}", paper_zeta, _ours_zeta(name, f),
                     cell(max(f["max_zeta_gap_complex"], f["max_inv_zeta_gap_real"]))])
    return table(["family", "paper: complex iff", "ours: complex, stated / found", "ours: type as stated",
                  "paper: damping", "ours: zeta (min, max)", "ours: largest formula gap"], rows)


def _appendix_c(entry: dict) -> str:
    rows = []
    closed = entry.get("closed_form")
    if closed:
        rows.append(["C.1", "exp(dt A(kappa)) = e^{-a dt} [c(kappa) I + s(kappa) N] (closed form)",
                     f"largest relative gap to expm over {closed['grid_points']} (dt, a, kappa): "
                     f"{cell(closed['max_rel_err_vs_expm'])}"])
    modal = entry.get("modal")
    if modal:
        crit, over, under, fast = (modal[k] for k in ("critical", "overdamped", "underdamped", "fastest_decay"))
        rows.append(["C.2", "critical: e^{omega0 t} e^{At} / t -> N, rank 1, N^2 = 0",
                     f"relative gap at t = {cell(crit['t'])}: " + ", ".join(
                         f"{cell(e)} (omega0 = {cell(w)})" for w, e in zip(crit["omega0"], crit["rel_err_to_N"]))])
        rows.append(["C.2", "overdamped: the direction collapses onto the slow mode",
                     f"cos to the slow eigenvector, t = 0 -> {cell(over['t_end'])}: " + ", ".join(
                         f"{cell(s)} -> {cell(e)} (a = {cell(a)})"
                         for a, (s, e) in zip(over["a"], over["cos_start_end"]))])
        rows.append(["C.2", "underdamped: norms shrink alike, angles between trajectories kept",
                     f"largest angle change to t = {cell(under['t_end'])}: " + ", ".join(
                         cell(d) for d in under["angle_drift_rotation"])
                     + " (rotation coordinates); " + ", ".join(cell(d) for d in under["angle_drift_companion"])
                     + " in companion coordinates (H, H'), which are not a similarity of the plane"])
        rows.append(["C.2", "critical damping decays fastest (rate omega0)",
                     f"fastest asymptotic rate {cell(fast['max_rate'])} at a = {cell(fast['argmax_a'])} "
                     f"(omega0 = {cell(fast['omega0'])}, grid step {cell(fast['grid_step'])})"])
    gain = entry.get("gain")
    if gain:
        closed_g, sim = gain["closed_form"], gain["simulated"]
        for key, formula in (("0", "1 / (1 - rho) = 100"), ("pi/2", "1 / sqrt(1 + rho^2) = 0.7107")):
            rows.append(["C.3", f"gain at rho = {cell(gain['rho'])}, theta = {key}: {formula} (computed)",
                         f"closed form {cell(closed_g[key], 6)}, simulated {gain['steps']:,} steps "
                         f"{cell(sim[key], 6)}"])
        grid = gain["grid"]
        rows.append(["C.3", "any theta != 0 lowers the gain at the same rho",
                     f"largest rotated / unrotated gain over rho in {{{', '.join(cell(r) for r in grid['rho'])}}}, "
                     f"{len(grid['theta'])} theta in (0, pi]: {cell(grid['max_rotated_over_unrotated'])}"])
    return table(["App. C", "paper (the fact)", "ours"], rows)


def build(runs: dict, scale: str, changes: dict, walls: dict, figure_dir: Path, run_root: Path):
    figure_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"## P2 theory: the oscillator view of frozen transitions ({scale} scale)", ""]
    run = runs.get(RUN)
    if not run:
        entry = {"checks": Checks(), "changes_from_paper": changes, "wall_s": walls}
        return entry, "\n".join(lines + report_tail({}, [RUN], changes)) + "\n"
    entry = dict(run)
    entry["checks"] = checks(entry)
    entry["changes_from_paper"] = changes
    entry["wall_s"] = walls
    cfg = run.get("config", {})
    lines += ["Nothing trains here: `ssmgate/theory/oscillation.py` (protocol §1.5-1.8) evaluated on random "
              f"draws of each family's frozen transition ({cfg.get('draws', '–')} per family, key dimension "
              f"{cfg.get('key_dim', '–')}, seed {cfg.get('seed', '–')}; the ranges of Table 8) and on closed "
              "forms, "
              "as checks C3-C5 of protocol §9 ask.", "",
              "P2 Table 8 (App. A): when a frozen transition has complex eigenvalues, and its damping ratio zeta "
              "(Table 8's formula; 'formula gap' is its largest difference to the ratio read off the eigenvalues, "
              "1/zeta for real rates).", "", _table8(run["table8"])]
    boundary = run.get("complex_kda_boundary")
    if boundary:
        lines += [f"Complex KDA on its stated boundary |cos theta| = 2 sqrt(-alpha) / (1 - alpha), alpha in "
                  f"{{{', '.join(cell(a) for a in boundary['alphas'])}}}: the two eigenvalues meet (largest gap "
                  f"{cell(boundary['max_eigenvalue_gap'])}, a double eigenvalue known to sqrt(machine epsilon)), and "
                  f"theta moved {cell(boundary['nudge'])} inside / outside gives complex / real eigenvalues: "
                  f"{cell(bool(boundary['type_changes_across']))}.", ""]
    figure = run_root / RUN / "spectra.png"
    if figure.exists():
        shutil.copy(figure, figure_dir / "p2_theory_spectra.png")
        lines += ["![spectra](figures/p2_theory_spectra.png)", ""]
    lines += ["P2 App. C: the damped second-order block (C.1), modal persistence (C.2) and the steady-state gain "
              "of a rotating accumulator (C.3). The gains at rho = 0.99 are numbers computed from P2's formula, "
              "not numbers P2 prints.", "", _appendix_c(run)]
    lines += report_tail(entry["checks"], [], changes)
    timed = {r: w for r, w in walls.items() if w is not None}
    if timed:
        lines += [table(["run", "wall time (s), including start-up"], [[r, w] for r, w in timed.items()])]
    return entry, "\n".join(lines) + "\n"

