"""The thresholds of the reproduction checks, each with its source, in one table.

A check reads its threshold from `BARS`, never from a literal of its own, and
tests/programs/test_check_bars.py pins every value: loosening a bar is a visible change of this file
and of that test. Sources: "P1" is *On the Importance of Gating*, "P2" *Understanding Mamba-3
through oscillatory dynamics*; "acceptance" is the table of what each figure must show to count as
reproduced (docs/reproduction.md#thresholds), "scaled-down" a bar for the reduced CPU runs, where
the protocol states one.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Bar:
    value: float
    source: str


BARS = {
    # P1 Figure 1
    "fig1a_crossing_lo": Bar(0.15, "acceptance, P1 Fig 1a: margin crossing alpha0 in [0.15, 0.21] (alpha* ~ 0.158)"),
    "fig1a_crossing_hi": Bar(0.21, "acceptance, P1 Fig 1a: margin crossing alpha0 in [0.15, 0.21] (alpha* ~ 0.158)"),
    "fig1b_sgd_over_flow": Bar(0.40, "acceptance, P1 Fig 1b: SGD escape time x lr within +-40% of the 3-D flow's"),
    "fig1c_no_decay_tol": Bar(0.02, "acceptance, P1 Fig 1c: no decay scores the Bayes value 0.638 +- 0.02"),
    "fig1cd_bayes_tol": Bar(0.03, "ours: P1 Fig 1c/d trained, accuracy within 0.03 of Bayes at every single (tau, "
                                  "distance) (the paper shows curves and a binned heat map, no bar; the protocol's "
                                  "acceptance is 0.02 after 10k steps)"),
    "fig1d_contour_r2": Bar(0.9, "ours: P1 Fig 1d / Prop 9 states the contour Delta_max ~ tau log(d/tau) up to a "
                                 "constant; R^2 of the fit through the origin >= 0.9"),
    "fig1d_tau_ll_d": Bar(8, "ours: Prop 9's tau << d read as tau <= d/8"),
    # P1 Figure 2
    "kv_plateau_tol": Bar(0.06, "scaled-down, P1 Fig 2a: plateau within 0.06 of the memoriser (1 - eps)^m"),
    "kv_escape_r2": Bar(0.7, "acceptance, P1 Fig 2b: R^2 of escape step vs e^delta >= 0.7 (paper 0.816)"),
    "kv_fit_min_offsets": Bar(3, "ours: Fig 2b's R^2 counts over the escapes of >= 3 offsets (a line through the "
                                 "escapes of two offsets fits their means whatever the law)"),
    # P1 Figure 3 and Table 1
    "horn_rand_name_gap": Bar(0.1, "scaled-down, P1 Fig 3b/c: random-oracle-name accuracy, weak - strong gate >= 0.1"),
    "horn_strong_gate_offset": Bar(1.0, "P1 Fig 3d / Table 1: the strong gates are the offsets delta >= +1"),
    "horn_table1_factor": Bar(1.5, "acceptance, P1 Table 1: median tau within x1.5 of the paper's"),
    "horn_near_perfect": Bar(0.95, "acceptance, P1 Fig 3d: the strongest gate ~ 1.0 at the largest pool ('~ 1.0' read "
                                   "as >= 0.95, ours)"),
    "horn_copies": Bar(0.9, "ours: a gate 'can copy' when it answers the all-fresh-name training pools at >= 0.9 "
                            "(a uniform pick among the k = 8 names shown scores about 1/8)"),
    # P2 theory (App. A Table 8, App. C), as checks C3-C5 of protocol §9 state them
    "theory_type_agreement": Bar(1.0, "check C5 (protocol §9), P2 App. A Table 8: the eigenvalue type matches the "
                                      "'complex iff' column on 100% of the draws"),
    "theory_zeta_tol": Bar(1e-9, "check C5 (protocol §9), P2 App. A Table 8: the damping-ratio formulas equal "
                                 "-log rho / sqrt(log^2 rho + phi^2) of the eigenvalues within 1e-9 (ours: real "
                                 "rates compared as 1/zeta, which is bounded)"),
    "theory_expm_rel": Bar(1e-6, "check C3 (protocol §9), P2 App. C.1: the closed-form exp(dt A(kappa)) within 1e-6 "
                                 "relative of expm (the bar of the float32 cores; float64 here)"),
    "theory_critical_tol": Bar(1e-3, "check C4 (protocol §9), P2 App. C.2: critical e^{omega0 t} e^{At} / t within "
                                     "1e-3 of N at t = 1e3"),
    "theory_overdamped_cos": Bar(0.999, "check C4 (protocol §9), P2 App. C.2: an overdamped direction aligns with "
                                        "the slow eigenvector, cos > 0.999"),
    "theory_angle_tol": Bar(1e-9, "check C4 (protocol §9), P2 App. C.2: underdamped angles between trajectories kept "
                                  "within 1e-9 (rotation coordinates)"),
    "theory_gain_tol_0": Bar(0.1, "check C4 (protocol §9), P2 App. C.3: simulated gain at rho = 0.99, theta = 0 is "
                                  "100 +- 0.1 (a number computed from P2's formula, not one P2 prints)"),
    "theory_gain_tol_pi2": Bar(1e-3, "check C4 (protocol §9), P2 App. C.3: simulated gain at rho = 0.99, theta = "
                                     "pi/2 is 0.7107 +- 1e-3 (computed from P2's formula, not printed by P2)"),
    # P2 Table 2
    "st_solved": Bar(90.0, "acceptance, P2 Table 2: underdamped scaled accuracy >= 90"),
    "st_unsolved": Bar(10.0, "acceptance, P2 Table 2: real-spectrum models <= 10 on parity and mod 3"),
    "st_above_chance": Bar(10.0, "ours: 'best on arithmetic' counts above 10 scaled points (selection noise of "
                                 "six rows at chance, 2,048 test sequences)"),
    "st_phase_tol_deg": Bar(10.0, "P2 Fig 5 (protocol): the best pair's phases within 10 degrees of the ideal code"),
    # P2 language modelling
    "lm_fig2_change_lo": Bar(-45.0, "P2 Fig 2: the heat map's colour range -45 ... +3 pp (protocol §8.1), read "
                                    "as the range of every window's accuracy change"),
    "lm_fig2_change_hi": Bar(3.0, "P2 Fig 2: the heat map's colour range -45 ... +3 pp (protocol §8.1), read as "
                                  "the range of every window's accuracy change"),
    "lm_table5_ratio": Bar(1.15, "acceptance, P2 Table 5: every intervention ratio to native PPL > 1.15"),
    "lm_min_seeds": Bar(2, "ours: a PPL gap counts only beyond the spread of >= 2 seeds per model (P2 reports "
                           "single runs)"),
    "lm_memory_growth": Bar(0.1, "ours: chunked scoring adds < 10% of what scoring the longest window in one "
                                 "piece adds"),
    "lm_ci_level": Bar(0.95, "ours: an ordering of windowed PPLs or ratios (P2 Tables 5, 7) counts beyond the 95% "
                             "bootstrap intervals over windows (1,000 draws, seed 0; P2 reports no intervals)"),
    "lm_fig4_fast_over_slow": Bar(10.0, "ours: P2 Fig 4 draws the slow / medium / fast channels each on its own "
                                        "time scale (protocol §8.5); 'distinct' read as the fast channel travelling "
                                        ">= 10x (an order of magnitude) the slow one's phase"),
}


def bar(name: str) -> float:
    return BARS[name].value


def source(*names: str) -> str:
    """The sources of these bars, once each, in order."""
    return "; ".join(dict.fromkeys(BARS[n].source for n in names))


def markdown_table() -> str:
    """The table of docs/reproduction.md#thresholds (a test keeps the docs equal to it)."""
    lines = ["| bar | value | source |", "|---|---|---|"]
    lines += [f"| `{name}` | {b.value:g} | {b.source} |" for name, b in BARS.items()]
    return "\n".join(lines) + "\n"
