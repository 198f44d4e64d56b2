"""P1 Figure 4 and the BFCL half of Figure 5 (tool calling): its checks' thresholds and its rows of the claim table
(what each holds and how the report reads them: ssmgate/programs/registry.py).
"""
from __future__ import annotations

from ssmgate.report.check_bars import Bars
from ssmgate.report.claims import Claim, at, largest
from ssmgate.report.format import cell

BARS = Bars()  # its checks are orderings between gates, no threshold

UNCLAIMED_CHECKS = ()


def _by_scale(e: dict, key: str) -> str:
    """Gate scale s: value at the largest pool size, weakest to strongest."""
    rows = at(e, key) or {}
    return ", ".join(f"s = {s}: {cell(largest(v))}" for s, v in sorted(rows.items(), key=lambda kv: float(kv[0])))


CLAIMS = (
    Claim("P1 Fig 4a", "with many retrieved tools the weak gates call the right tool more often", "weak 0.30, strong 0.21 at k = 72",
          "p1_tools", (r"^weak_gate_accuracy_above_strong_",), lambda e: _by_scale(e, "accuracy")),
    Claim("P1 Fig 4b", "with many retrieved tools strong gates name tools outside the pool more often",
          "s = 16: 0.50-0.54, s = 0.06: 0.30 at k = 72", "p1_tools", (r"^hallucination_s16_above_",),
          lambda e: _by_scale(e, "hallucination")),
    Claim("P1 Fig 4, Transformer",
          "the Transformer collapses beyond the training pools (k = 24), below every Mamba gate",
          "0.01-0.02 at k = 72 (Mamba 0.20-0.30)", "p1_tools", (r"^transformer_",),
          lambda e: f"Transformer {cell(largest(e['transformer_accuracy']))}, best gate "
                    f"{cell(max(largest(v) for v in e['accuracy'].values()))} at the largest k"),
    Claim("P1 Fig 5, BFCL", "with a weak retriever (no oracle) and beta = 10, s = 1 stays stable as pools grow while "
          "s = 0.06 drops", "qualitative (App. C)", "p1_tools", (r"^fig5_bfcl_",),
          lambda e: "beta 10, smallest -> largest k: " + ", ".join(
              f"s = {s} {cell(r[min(r, key=int)])} -> {cell(largest(r))}"
              for s, r in ((s, e["weak"]["10"][s]) for s in ("0.06", "1")))),
)
