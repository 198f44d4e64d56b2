"""P1 Figure 1 (the simplified SSM and its theory): its checks' thresholds and its rows of the claim table
(what each holds and how the report reads them: ssmgate/programs/registry.py).
"""
from __future__ import annotations

from ssmgate.report.check_bars import Bar, Bars
from ssmgate.report.claims import Claim, at
from ssmgate.report.format import cell

BARS = Bars({
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
})

UNCLAIMED_CHECKS = ()


CLAIMS = (
    Claim("P1 Fig 1a", "the memorisation margin leads for small alpha0, retrieval's for large; they cross near alpha*",
          "alpha* ~ 0.158", "p1_fig1", (r"^fig1a_",), lambda e: f"crossing at alpha0 = {cell(at(e, 'fig1a', 'crossing_alpha0'))}"),
    Claim("P1 Fig 1b", "the escape from memorisation comes later for smaller alpha0, when the 3-D flow says",
          "flow escape x lr 10.6, 29.2, 58.5, 118.9, 234.5", "p1_fig1", (r"^fig1b_",),
          lambda e: "SGD / flow " + ", ".join(cell(r) for r in (at(e, "fig1b", "sgd_over_flow") or []))),
    Claim("P1 Fig 1c", "without decay the model scores the Bayes value; for distant keys accuracy rises then falls with tau",
          "no decay 0.638", "p1_fig1", (r"^fig1c_",), lambda e: f"no decay {cell(at(e, 'fig1c', 'no_decay_accuracy'))}"),
    Claim("P1 Fig 1d", "the accuracy contour grows as tau log(d/tau) for tau << d (Prop 9), the trained models at Bayes",
          "contour ~ tau log(d/tau)", "p1_fig1", (r"^fig1d_contour_", r"^fig1cd_"),
          lambda e: f"max gap {cell(at(e, 'fig1d', 'max_abs_diff_to_bayes_per_distance'))} per distance (our bar)"),
)
