"""P1 Figure 3, Table 1 and the Horn half of Figure 5 (Horn-clause retrieval): its checks' thresholds and its rows of the claim table
(what each holds and how the report reads them: ssmgate/programs/registry.py).
"""
from __future__ import annotations

from typing import Optional

from ssmgate.report.check_bars import Bar, Bars
from ssmgate.report.claims import Claim, at, by_offset, largest, strongest
from ssmgate.report.format import cell

BARS = Bars({
    "horn_rand_name_gap": Bar(0.1, "scaled-down, P1 Fig 3b/c: random-oracle-name accuracy, weak - strong gate >= 0.1"),
    "horn_strong_gate_offset": Bar(1.0, "P1 Fig 3d / Table 1: the strong gates are the offsets delta >= +1"),
    "horn_table1_factor": Bar(1.5, "acceptance, P1 Table 1: median tau within x1.5 of the paper's"),
    "horn_near_perfect": Bar(0.95, "acceptance, P1 Fig 3d: the strongest gate ~ 1.0 at the largest pool ('~ 1.0' read "
                                   "as >= 0.95, ours)"),
    "horn_copies": Bar(0.9, "ours: a gate 'can copy' when it answers the all-fresh-name training pools at >= 0.9 "
                            "(a uniform pick among the k = 8 names shown scores about 1/8)"),
})

UNCLAIMED_CHECKS = ()


def _fig5_horn(e: dict) -> Optional[str]:
    """At the largest beta and pool: the best gate (every one tied there: the row must not depend on the
    order a summary stores its offsets in), the weakest gate and the Transformer."""
    f = at(e, "fig5_horn") or {}
    if not f.get("accuracy"):
        return None
    beta = max(f["accuracy"], key=float)
    final = {o: largest(v) for o, v in f["accuracy"][beta].items()}
    top, weakest = max(final.values()), min(final, key=float)
    best = [o for o in sorted(final, key=float) if final[o] == top]   # every gate tied at the top, weak to strong
    text = (f"beta {beta}, largest k: best gate{'s' if len(best) > 1 else ''} {', '.join(best)} {cell(top)}, "
            f"weakest {weakest} {cell(final[weakest])}")
    tf = largest((f.get("transformer") or {}).get(beta))
    return text + (f", Transformer {cell(tf)}" if tf is not None else "")


CLAIMS = (
    Claim("P1 Fig 3b", "the strong gate memorises: higher no-oracle accuracy than the weak gate", "qualitative", "p1_horn",
          (r"^no_oracle_strong_gt_weak_", r"^strong_gate_copies_"), lambda e: f"early strong {cell(strongest({o: v['early'] for o, v in (at(e, 'no_oracle') or {}).items()}))}"),
    Claim("P1 Fig 3c", "the weak gate retrieves renamed oracles, the strong gate does not", "qualitative", "p1_horn",
          (r"^rand_name_gap_", r"^strong_gate_copies_"), lambda e: f"final weak {cell(at(e, 'random_oracle_name', min(at(e, 'random_oracle_name') or {'0': 0}, key=float), 'final'))}"),
    Claim("P1 Fig 3d", "the strongest gate stays near perfect on larger pools than trained on; the weak gate and the "
          "Transformer decay",
          "strong gate ~ 1.0 at k = 128", "p1_horn", (r"^lengen_",),
          lambda e: ", ".join(f"{o}: {cell(largest(v))}" for o, v in by_offset(at(e, "lengen_accuracy")))
          + " at the largest k"),
    Claim("P1 Table 1", "training keeps the order and size of the gates' median time constants tau",
          "tau 2.1e4, 297, 17, 2.8 ... at init", "p1_horn", (r"^table1_",),
          lambda e: ", ".join(f"{o}: {cell(v['median_tau_before'])}" for o, v in by_offset(at(e, "table1")))),
    Claim("P1 Fig 5, Horn", "with a weak retriever (no oracle), moderate gates make the best use of larger pools; weak "
          "gates and the Transformer decline", "qualitative (App. C)", "p1_horn", (r"^fig5_horn_",), _fig5_horn),
)
