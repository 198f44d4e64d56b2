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
    "fig1cd_bayes_tol": Bar(0.03, "scaled-down, P1 Fig 1c/d trained: accuracy within 0.03 of Bayes (paper scale 0.02)"),
    # P1 Figure 2
    "kv_plateau_tol": Bar(0.06, "scaled-down, P1 Fig 2a: plateau within 0.06 of the memoriser (1 - eps)^m"),
    "kv_escape_r2": Bar(0.7, "acceptance, P1 Fig 2b: R^2 of escape step vs e^delta >= 0.7 (paper 0.816)"),
    # P1 Figure 3 and Table 1
    "horn_rand_name_gap": Bar(0.1, "scaled-down, P1 Fig 3b/c: random-oracle-name accuracy, weak - strong gate >= 0.1"),
    "horn_strong_gate_offset": Bar(1.0, "P1 Fig 3d / Table 1: the strong gates are the offsets delta >= +1"),
    "horn_table1_factor": Bar(1.5, "acceptance, P1 Table 1: median tau within x1.5 of the paper's"),
    # P2 Table 2
    "st_solved": Bar(90.0, "acceptance, P2 Table 2: underdamped scaled accuracy >= 90"),
    "st_unsolved": Bar(10.0, "acceptance, P2 Table 2: real-spectrum models <= 10 on parity and mod 3"),
    "st_above_chance": Bar(10.0, "ours: 'best on arithmetic' counts above 10 scaled points (selection noise of "
                                 "six rows at chance, 2,048 test sequences)"),
    "st_phase_tol_deg": Bar(10.0, "P2 Fig 5 (protocol): the best pair's phases within 10 degrees of the ideal code"),
    # P2 language modelling
    "lm_table5_ratio": Bar(1.15, "acceptance, P2 Table 5: every intervention ratio to native PPL > 1.15"),
    "lm_min_seeds": Bar(2, "ours: a PPL gap counts only beyond the spread of >= 2 seeds per model (P2 reports "
                           "single runs)"),
    "lm_memory_growth": Bar(0.1, "ours: chunked scoring adds < 10% of what scoring the longest window in one "
                                 "piece adds"),
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
