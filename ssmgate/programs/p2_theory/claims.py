"""P2's theory (App. A Table 8, App. C): its checks' thresholds and its rows of the claim table
(what each holds and how the report reads them: ssmgate/programs/registry.py).
"""
from __future__ import annotations

from ssmgate.report.check_bars import Bar, Bars
from ssmgate.report.claims import Claim, at
from ssmgate.report.format import cell

BARS = Bars({
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
})

UNCLAIMED_CHECKS = ()


CLAIMS = (
    Claim("P2 theory", "Table 8's eigen-types and damping ratios of six linear-attention families hold on random "
          "draws; App C's modal persistence and steady-state gain", "App A (Table 8), App C; gain 100 / 0.7107",
          "p2_theory", (r"^table8_", r"^appC[123]_"),
          lambda e: f"type as stated on {sum(f['type_agree'] for f in e['table8'].values())} of "
                    f"{sum(f['draws'] for f in e['table8'].values())} draws; gain "
                    f"{cell(at(e, 'gain', 'simulated', '0'))} / {cell(at(e, 'gain', 'simulated', 'pi/2'))}"),
)
