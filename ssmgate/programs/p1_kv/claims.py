"""P1 Figure 2 (key-value retrieval): its checks' thresholds and its rows of the claim table
(what each holds and how the report reads them: ssmgate/programs/registry.py).
"""
from __future__ import annotations

from ssmgate.report.check_bars import Bar, Bars
from ssmgate.report.claims import Claim, at, largest, strongest
from ssmgate.report.format import cell

BARS = Bars({
    "kv_plateau_tol": Bar(0.06, "scaled-down, P1 Fig 2a: plateau within 0.06 of the memoriser (1 - eps)^m"),
    "kv_escape_r2": Bar(0.7, "acceptance, P1 Fig 2b: R^2 of escape step vs e^delta >= 0.7 (paper 0.816)"),
    "kv_fit_min_offsets": Bar(3, "ours: Fig 2b's R^2 counts over the escapes of >= 3 offsets (a line through the "
                                 "escapes of two offsets fits their means whatever the law)"),
})

UNCLAIMED_CHECKS = ()


CLAIMS = (
    Claim("P1 Fig 2a", "strong decay sits on the memoriser's plateau, the weak gate escapes to retrieval",
          "plateau 0.43", "p1_kv", (r"^plateau_within_", r"^smallest_offset_escapes$"),
          lambda e: f"plateau {cell(at(e, 'plateau_accuracy'))} (memoriser {cell(at(e, 'memoriser_accuracy'))})"),
    Claim("P1 Fig 2b", "the escape step grows linearly with e^delta", "R^2 0.816", "p1_kv",
          (r"^escape_fit_r2_", r"^escape_later_as_offset_grows$"), lambda e: f"R^2 {cell(at(e, 'escape_fit_r2'))}"),
    Claim("P1 Fig 2c", "stronger gates generalise to more pairs, by retrieval, not memory", "delta = +1: 0.35 at 2,048 pairs",
          "p1_kv", (r"^strongest_gate_",), lambda e: f"strongest gate {cell(strongest({o: largest(v) for o, v in (at(e, 'lengen_accuracy') or {}).items()}))} at the largest n"),
)
