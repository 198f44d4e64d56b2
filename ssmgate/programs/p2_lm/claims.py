"""P2's language-model claims (Figs 2-4 and 6-9, Tables 3-7): its checks' thresholds and its rows of the claim table
(what each holds and how the report reads them: ssmgate/programs/registry.py).
"""
from __future__ import annotations

from typing import Optional

from ssmgate.report.check_bars import Bar, Bars
from ssmgate.report.claims import Claim, at, largest
from ssmgate.report.format import cell

BARS = Bars({
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
})

UNCLAIMED_CHECKS = ('window_memory_growth_below_a_tenth_of_unchunked_extra',)


def _fmt_pair(a, b, names=("rotation", "no rotation")) -> str:
    return f"{names[0]} {cell(a)}, {names[1]} {cell(b)}" if a is not None and b is not None else "–"


def _lm_ppl(e):
    return _fmt_pair(at(e, "ppl", "rotation"), at(e, "ppl", "no_rotation"))


def _bucket_ratio(e) -> Optional[str]:
    """Rotation's PPL over no rotation's in each position bucket (seed 0): its range."""
    rot, base = at(e, "bucket_ppl", "rotation") or {}, at(e, "bucket_ppl", "no_rotation") or {}
    ratios = [rot[b] / base[b] for b in rot if b != "rows" and b in base]
    if not ratios:
        return None
    return f"rotation / no rotation {min(ratios):.3f}–{max(ratios):.3f}× over {len(ratios)} buckets"


def _ratio_range(e):
    ratios = [r for row in (at(e, "intervention_ratio") or {}).values() for r in row.values() if r is not None]
    return f"{min(ratios):.2f}–{max(ratios):.2f}×" if ratios else None


def _lm_curve_end(e):
    """The windowed PPL at the last step of the curve along training (seed 0), at its largest window."""
    curves = e["window_ppl_along_training"]  # KeyError (no number) without the curves
    last = {v: curves[v][max(curves[v], key=int)] for v in ("rotation", "no_rotation")}
    c = max(last["rotation"], key=int)
    return f"C={c}: " + _fmt_pair(last["rotation"].get(c), last["no_rotation"].get(c))


CLAIMS = (
    Claim("P2 Figs 3/7", "rotation lowers held-out and windowed PPL", "rotation lower at every C", "p2_lm",
          (r"^rotation_heldout_", r"^rotation_window_"), _lm_ppl),
    Claim("P2 Fig 6", "rotation lowers PPL in every position bucket", "rotation lower in every bucket", "p2_lm",
          (r"^rotation_bucket_",), _bucket_ratio),
    Claim("P2 Figs 8-9", "along training, rotation ends with the lower windowed PG-19 PPL, clearer for 444M at long "
          "windows", "PG-19 PPL at 2K-64K vs step, 187M and 444M", "p2_lm", (r"^fig8_9_",), _lm_curve_end),
    Claim("P2 Tables 3-4", "downstream scores (LAMBADA, FineWeb-Edu, LongBench) favour rotation", "Tables 3-4", "p2_lm",
          unchecked="needs the paper-scale 187M/444M models and the data of LongBench-E, LAMBADA and six "
          "zero-shot tasks, which cannot be had here; no evaluator for them yet (docs/reproduction.md, P2 LM)"),
    Claim("P2 Table 5", "every phase intervention raises PPL, more at longer windows", "x1.22-x74 (SISO grows with C)",
          "p2_lm", (r"^every_phase_intervention_ratio_gt_", r"^every_intervention_ratio_grows_"), _ratio_range),
    Claim("P2 Table 6", "phase removal raises the history/update cosine and the state norm", "cosine 0.29 -> 0.43",
          "p2_lm", (r"^cosine_rises_", r"^rms_rises_"),
          lambda e: f"cosine {cell(at(e, 'state_stats', 'native', 'cosine'))} -> {cell(at(e, 'state_stats', 'removed', 'cosine'))}"),
    Claim("P2 Table 7", "removing one side's rotation hurts more than removing both, which still hurts; C's more than "
          "B's", "x12.18 > x9.04 > x2.08 (SISO)", "p2_lm",
          (r"^table7_each_single_removal_gt_remove_both_gt_native$", r"^table7_remove_C_gt_remove_B$"),
          lambda e: ", ".join(f"{k} {cell(v)}" for k, v in (at(e, "bc_removal_ratio") or {}).items())),
    Claim("P2 Fig 2", "phase removal in a window of layers changes accuracy by -45 to +3 points, more for wider "
          "windows", "-45 ... +3 pp", "p2_lm", (r"^fig2_",),
          lambda e: f"{cell(min(c['accuracy_change_pp'] for c in e['layer_heatmap']['cells']))} ... "
                    f"{cell(max(c['accuracy_change_pp'] for c in e['layer_heatmap']['cells']))} pp over "
                    f"{len(e['layer_heatmap']['cells'])} windows"),
    Claim("P2 Fig 4", "slow, medium and fast channels trace distinct phase trajectories", "qualitative", "p2_lm",
          (r"^fig4_",),
          lambda e: "cycles slow / medium / fast " + " / ".join(
              cell(e["phase_trajectories"]["classes"][k]["cycles"]) for k in ("slow", "medium", "fast"))
          + f"; travel fast / slow x{cell(e['phase_trajectories']['travel_ratio']['fast_over_slow'])}"),
    Claim("P2 MIMO contrasts", "MIMO's ratios are flat in C and its removal ranking differs from SISO",
          "Tables 5-7, MIMO: removal x15.08 largest, decay permutation x1.21 smallest at 64K", "p2_lm", (r"^mimo_",),
          lambda e: ", ".join(f"{k} {cell(largest(v))}" for k, v in (at(e, "mimo", "intervention_ratio") or {}).items())
          + " at the largest C"),
)
