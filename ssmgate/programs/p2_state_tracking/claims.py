"""P2 Table 2 and Figure 5 (state tracking): its checks' thresholds and its rows of the claim table
(what each holds and how the report reads them: ssmgate/programs/registry.py).
"""
from __future__ import annotations

from ssmgate.report.check_bars import Bar, Bars
from ssmgate.report.claims import Claim, at
from ssmgate.report.format import cell

BARS = Bars({
    "st_solved": Bar(90.0, "acceptance, P2 Table 2: underdamped scaled accuracy >= 90"),
    "st_unsolved": Bar(10.0, "acceptance, P2 Table 2: real-spectrum models <= 10 on parity and mod 3"),
    "st_above_chance": Bar(10.0, "ours: 'best on arithmetic' counts above 10 scaled points (selection noise of "
                                 "six rows at chance, 2,048 test sequences)"),
    "st_phase_tol_deg": Bar(10.0, "P2 Fig 5 (protocol): the best pair's phases within 10 degrees of the ideal code"),
})

UNCLAIMED_CHECKS = ('cpu_grid_within_60_min',)


def _st(task):
    return lambda e: (f"underdamped {cell(at(e, 'scaled_accuracy', 'underdamped', task))}; best other "
                      f"{cell(max([v[task] for m, v in (at(e, 'scaled_accuracy') or {}).items() if m != 'underdamped' and task in v], default=None))}")


CLAIMS = (
    Claim("P2 Table 2, parity", "only the underdamped (rotating) model solves parity", "100 vs <= 4.05",
          "p2_state_tracking", (r"^parity_underdamped_", r"^parity_real_spectrum_"), _st("parity")),
    Claim("P2 Table 2, mod 3", "only the underdamped model solves mod 3 counting", "95.26 vs <= 0.85",
          "p2_state_tracking", (r"^mod3_underdamped_", r"^mod3_real_spectrum_"), _st("mod3")),
    Claim("P2 Table 2, arithmetic", "the underdamped model is best on arithmetic", "95.68; overdamped 81.60",
          "p2_state_tracking", (r"^arith_",), _st("arith")),
    Claim("P2 Fig 5", "a solved model turns one pair by 180 (parity) / 120 (mod 3) degrees per 1", "179.51 / 119.78 degrees",
          "p2_state_tracking", (r"_phase_code_",),
          lambda e: ", ".join(f"{k.split('_')[0]} {cell(v[1])}"   # parity first, as the paper's column
                              for k, v in sorted((at(e, "phase_code") or {}).items(), key=lambda kv: kv[0] != "parity_deg"))),
)
