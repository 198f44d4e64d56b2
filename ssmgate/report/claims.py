"""The claim table that opens the reproduction report: one row per figure and table of both papers.

Each row states the claim in one line, the paper's number, ours (from the summary entry) and a status
computed from the checks the row names, never from prose:
  reproduced      every named check that ran passes;
  partly          some pass, some fail;
  not reproduced  every named check that ran fails;
  not attempted   no named check ran at this scale (or the row has none: what the report shows
                  there, if anything, is not checked), with the reason.
A row's checks are regular expressions over the check names of its experiment's `checks`.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Optional

from ssmgate.report.format import cell, table

STATUSES = ("reproduced", "partly", "not reproduced", "not attempted")


@dataclasses.dataclass(frozen=True)
class Claim:
    key: str                   # stable id, e.g. "P1 Fig 2b"
    claim: str
    paper: str                 # the paper's number(s)
    experiment: Optional[str]  # its summary entry; None: nothing runs it
    checks: tuple[str, ...] = ()
    ours: Optional[Callable[[dict], object]] = None
    unchecked: str = ""        # why a row without checks has none


def _at(entry: dict, *path):
    for p in path:
        if not isinstance(entry, dict) or p not in entry:
            return None
        entry = entry[p]
    return entry


def _largest(d: Optional[dict]):
    return None if not d else d[max(d, key=int)]


def _strongest(d: Optional[dict]):
    return None if not d else d[max(d, key=float)]


def _fig5_horn(e: dict) -> Optional[str]:
    """At the largest beta and pool: the best gate (every one tied there: the row must not depend on the
    order a summary stores its offsets in), the weakest gate and the Transformer."""
    f = _at(e, "fig5_horn") or {}
    if not f.get("accuracy"):
        return None
    beta = max(f["accuracy"], key=float)
    final = {o: _largest(v) for o, v in f["accuracy"][beta].items()}
    top, weakest = max(final.values()), min(final, key=float)
    best = [o for o in sorted(final, key=float) if final[o] == top]   # every gate tied at the top, weak to strong
    text = (f"beta {beta}, largest k: best gate{'s' if len(best) > 1 else ''} {', '.join(best)} {cell(top)}, "
            f"weakest {weakest} {cell(final[weakest])}")
    tf = _largest((f.get("transformer") or {}).get(beta))
    return text + (f", Transformer {cell(tf)}" if tf is not None else "")


def _by_offset(d: Optional[dict]) -> list:
    return sorted((d or {}).items(), key=lambda kv: float(kv[0]))


def _by_scale(e: dict, key: str) -> str:
    """Gate scale s: value at the largest pool size, weakest to strongest."""
    rows = _at(e, key) or {}
    return ", ".join(f"s = {s}: {cell(_largest(v))}" for s, v in sorted(rows.items(), key=lambda kv: float(kv[0])))


def _fmt_pair(a, b, names=("rotation", "no rotation")) -> str:
    return f"{names[0]} {cell(a)}, {names[1]} {cell(b)}" if a is not None and b is not None else "–"


def _lm_ppl(e):
    return _fmt_pair(_at(e, "ppl", "rotation"), _at(e, "ppl", "no_rotation"))


def _bucket_ratio(e) -> Optional[str]:
    """Rotation's PPL over no rotation's in each position bucket (seed 0): its range."""
    rot, base = _at(e, "bucket_ppl", "rotation") or {}, _at(e, "bucket_ppl", "no_rotation") or {}
    ratios = [rot[b] / base[b] for b in rot if b != "rows" and b in base]
    if not ratios:
        return None
    return f"rotation / no rotation {min(ratios):.3f}–{max(ratios):.3f}× over {len(ratios)} buckets"


def _st(task):
    return lambda e: (f"underdamped {cell(_at(e, 'scaled_accuracy', 'underdamped', task))}; best other "
                      f"{cell(max([v[task] for m, v in (_at(e, 'scaled_accuracy') or {}).items() if m != 'underdamped' and task in v], default=None))}")


def _ratio_range(e):
    ratios = [r for row in (_at(e, "intervention_ratio") or {}).values() for r in row.values() if r is not None]
    return f"{min(ratios):.2f}–{max(ratios):.2f}×" if ratios else None


def _lm_curve_end(e):
    """The windowed PPL at the last step of the curve along training (seed 0), at its largest window."""
    curves = e["window_ppl_along_training"]  # KeyError (no number) without the curves
    last = {v: curves[v][max(curves[v], key=int)] for v in ("rotation", "no_rotation")}
    c = max(last["rotation"], key=int)
    return f"C={c}: " + _fmt_pair(last["rotation"].get(c), last["no_rotation"].get(c))


CLAIMS = (
    Claim("P1 Fig 1a", "the memorisation margin leads for small alpha0, retrieval's for large; they cross near alpha*",
          "alpha* ~ 0.158", "p1_fig1", (r"^fig1a_",), lambda e: f"crossing at alpha0 = {cell(_at(e, 'fig1a', 'crossing_alpha0'))}"),
    Claim("P1 Fig 1b", "the escape from memorisation comes later for smaller alpha0, when the 3-D flow says",
          "flow escape x lr 10.6, 29.2, 58.5, 118.9, 234.5", "p1_fig1", (r"^fig1b_",),
          lambda e: "SGD / flow " + ", ".join(cell(r) for r in (_at(e, "fig1b", "sgd_over_flow") or []))),
    Claim("P1 Fig 1c", "without decay the model scores the Bayes value; for distant keys accuracy rises then falls with tau",
          "no decay 0.638", "p1_fig1", (r"^fig1c_",), lambda e: f"no decay {cell(_at(e, 'fig1c', 'no_decay_accuracy'))}"),
    Claim("P1 Fig 1d", "the accuracy contour grows as tau log(d/tau) for tau << d (Prop 9), the trained models at Bayes",
          "contour ~ tau log(d/tau)", "p1_fig1", (r"^fig1d_contour_", r"^fig1cd_"),
          lambda e: f"max gap {cell(_at(e, 'fig1d', 'max_abs_diff_to_bayes_per_distance'))} per distance (our bar)"),
    Claim("P1 Fig 2a", "strong decay sits on the memoriser's plateau, the weak gate escapes to retrieval",
          "plateau 0.43", "p1_kv", (r"^plateau_within_", r"^smallest_offset_escapes$"),
          lambda e: f"plateau {cell(_at(e, 'plateau_accuracy'))} (memoriser {cell(_at(e, 'memoriser_accuracy'))})"),
    Claim("P1 Fig 2b", "the escape step grows linearly with e^delta", "R^2 0.816", "p1_kv",
          (r"^escape_fit_r2_", r"^escape_later_as_offset_grows$"), lambda e: f"R^2 {cell(_at(e, 'escape_fit_r2'))}"),
    Claim("P1 Fig 2c", "stronger gates generalise to more pairs, by retrieval, not memory", "delta = +1: 0.35 at 2,048 pairs",
          "p1_kv", (r"^strongest_gate_",), lambda e: f"strongest gate {cell(_strongest({o: _largest(v) for o, v in (_at(e, 'lengen_accuracy') or {}).items()}))} at the largest n"),
    Claim("P1 Fig 3b", "the strong gate memorises: higher no-oracle accuracy than the weak gate", "qualitative", "p1_horn",
          (r"^no_oracle_strong_gt_weak_", r"^strong_gate_copies_"), lambda e: f"early strong {cell(_strongest({o: v['early'] for o, v in (_at(e, 'no_oracle') or {}).items()}))}"),
    Claim("P1 Fig 3c", "the weak gate retrieves renamed oracles, the strong gate does not", "qualitative", "p1_horn",
          (r"^rand_name_gap_", r"^strong_gate_copies_"), lambda e: f"final weak {cell(_at(e, 'random_oracle_name', min(_at(e, 'random_oracle_name') or {'0': 0}, key=float), 'final'))}"),
    Claim("P1 Fig 3d", "the strongest gate stays near perfect on larger pools than trained on; the weak gate and the "
          "Transformer decay",
          "strong gate ~ 1.0 at k = 128", "p1_horn", (r"^lengen_",),
          lambda e: ", ".join(f"{o}: {cell(_largest(v))}" for o, v in _by_offset(_at(e, "lengen_accuracy")))
          + " at the largest k"),
    Claim("P1 Table 1", "training keeps the order and size of the gates' median time constants tau",
          "tau 2.1e4, 297, 17, 2.8 ... at init", "p1_horn", (r"^table1_",),
          lambda e: ", ".join(f"{o}: {cell(v['median_tau_before'])}" for o, v in _by_offset(_at(e, "table1")))),
    Claim("P1 Fig 4a", "with many retrieved tools the weak gates call the right tool more often", "weak 0.30, strong 0.21 at k = 72",
          "p1_tools", (r"^weak_gate_accuracy_above_strong_",), lambda e: _by_scale(e, "accuracy")),
    Claim("P1 Fig 4b", "with many retrieved tools strong gates name tools outside the pool more often",
          "s = 16: 0.50-0.54, s = 0.06: 0.30 at k = 72", "p1_tools", (r"^hallucination_s16_above_",),
          lambda e: _by_scale(e, "hallucination")),
    Claim("P1 Fig 4, Transformer",
          "the Transformer collapses beyond the training pools (k = 24), below every Mamba gate",
          "0.01-0.02 at k = 72 (Mamba 0.20-0.30)", "p1_tools", (r"^transformer_",),
          lambda e: f"Transformer {cell(_largest(e['transformer_accuracy']))}, best gate "
                    f"{cell(max(_largest(v) for v in e['accuracy'].values()))} at the largest k"),
    Claim("P1 Fig 5, BFCL", "with a weak retriever (no oracle) and beta = 10, s = 1 stays stable as pools grow while "
          "s = 0.06 drops", "qualitative (App. C)", "p1_tools", (r"^fig5_bfcl_",),
          lambda e: "beta 10, smallest -> largest k: " + ", ".join(
              f"s = {s} {cell(r[min(r, key=int)])} -> {cell(_largest(r))}"
              for s, r in ((s, e["weak"]["10"][s]) for s in ("0.06", "1")))),
    Claim("P1 Fig 5, Horn", "with a weak retriever (no oracle), moderate gates make the best use of larger pools; weak "
          "gates and the Transformer decline", "qualitative (App. C)", "p1_horn", (r"^fig5_horn_",), _fig5_horn),
    Claim("P2 theory", "Table 8's eigen-types and damping ratios of six linear-attention families hold on random "
          "draws; App C's modal persistence and steady-state gain", "App A (Table 8), App C; gain 100 / 0.7107",
          "p2_theory", (r"^table8_", r"^appC[123]_"),
          lambda e: f"type as stated on {sum(f['type_agree'] for f in e['table8'].values())} of "
                    f"{sum(f['draws'] for f in e['table8'].values())} draws; gain "
                    f"{cell(_at(e, 'gain', 'simulated', '0'))} / {cell(_at(e, 'gain', 'simulated', 'pi/2'))}"),
    Claim("P2 Table 2, parity", "only the underdamped (rotating) model solves parity", "100 vs <= 4.05",
          "p2_state_tracking", (r"^parity_underdamped_", r"^parity_real_spectrum_"), _st("parity")),
    Claim("P2 Table 2, mod 3", "only the underdamped model solves mod 3 counting", "95.26 vs <= 0.85",
          "p2_state_tracking", (r"^mod3_underdamped_", r"^mod3_real_spectrum_"), _st("mod3")),
    Claim("P2 Table 2, arithmetic", "the underdamped model is best on arithmetic", "95.68; overdamped 81.60",
          "p2_state_tracking", (r"^arith_",), _st("arith")),
    Claim("P2 Fig 5", "a solved model turns one pair by 180 (parity) / 120 (mod 3) degrees per 1", "179.51 / 119.78 degrees",
          "p2_state_tracking", (r"_phase_code_",),
          lambda e: ", ".join(f"{k.split('_')[0]} {cell(v[1])}"   # parity first, as the paper's column
                              for k, v in sorted((_at(e, "phase_code") or {}).items(), key=lambda kv: kv[0] != "parity_deg"))),
    Claim("P2 Figs 3/7", "rotation lowers held-out and windowed PPL", "rotation lower at every C", "p2_lm",
          (r"^rotation_heldout_", r"^rotation_window_"), _lm_ppl),
    Claim("P2 Fig 6", "rotation lowers PPL in every position bucket", "rotation lower in every bucket", "p2_lm",
          (r"^rotation_bucket_",), _bucket_ratio),
    Claim("P2 Figs 8-9", "along training, rotation ends with the lower windowed PG-19 PPL, clearer for 444M at long "
          "windows", "PG-19 PPL at 2K-64K vs step, 187M and 444M", "p2_lm", (r"^fig8_9_",), _lm_curve_end),
    Claim("P2 Tables 3-4", "downstream scores (LAMBADA, FineWeb-Edu, LongBench) favour rotation", "Tables 3-4", None,
          unchecked="needs the paper-scale 187M/444M models and the data of LongBench-E, LAMBADA and six "
          "zero-shot tasks, which cannot be had here; no evaluator for them yet (docs/reproduction.md, P2 LM)"),
    Claim("P2 Table 5", "every phase intervention raises PPL, more at longer windows", "x1.22-x74 (SISO grows with C)",
          "p2_lm", (r"^every_phase_intervention_ratio_gt_", r"^every_intervention_ratio_grows_"), _ratio_range),
    Claim("P2 Table 6", "phase removal raises the history/update cosine and the state norm", "cosine 0.29 -> 0.43",
          "p2_lm", (r"^cosine_rises_", r"^rms_rises_"),
          lambda e: f"cosine {cell(_at(e, 'state_stats', 'native', 'cosine'))} -> {cell(_at(e, 'state_stats', 'removed', 'cosine'))}"),
    Claim("P2 Table 7", "removing one side's rotation hurts more than removing both, which still hurts; C's more than "
          "B's", "x12.18 > x9.04 > x2.08 (SISO)", "p2_lm",
          (r"^table7_each_single_removal_gt_remove_both_gt_native$", r"^table7_remove_C_gt_remove_B$"),
          lambda e: ", ".join(f"{k} {cell(v)}" for k, v in (_at(e, "bc_removal_ratio") or {}).items())),
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
          lambda e: ", ".join(f"{k} {cell(_largest(v))}" for k, v in (_at(e, "mimo", "intervention_ratio") or {}).items())
          + " at the largest C"),
)


def status(claim: Claim, summary: dict) -> tuple[str, str]:
    """(status, why) of one row from the checks of its experiment's entry."""
    entry = summary.get(claim.experiment) if claim.experiment else None
    if not claim.checks:
        return "not attempted", claim.unchecked
    if not entry:
        return "not attempted", "not run at this scale"
    names = [n for n in entry.get("checks", {}) if any(re.search(p, n) for p in claim.checks)]
    if not names:
        return "not attempted", "its checks did not run at this scale"
    failed = [n for n in names if not entry["checks"][n]]
    if not failed:
        return "reproduced", f"{len(names)} of {len(names)} checks pass"
    why = "fails " + ", ".join(f"`{n}`" for n in failed)
    return ("not reproduced" if len(failed) == len(names) else "partly"), why


def rows(summary: dict) -> dict:
    """{claim key: {"status", "why", "ours", "checks"}} for summary.json."""
    out = {}
    for c in CLAIMS:
        st, why = status(c, summary)
        entry = summary.get(c.experiment) or {}
        ours = None
        if c.ours is not None and entry:
            try:
                ours = str(c.ours(entry))
            except (KeyError, TypeError, ValueError):  # a partial entry (a run missing): no number
                ours = None
        out[c.key] = {"status": st, "why": why, "ours": ours,
                      "checks": sorted(n for n in entry.get("checks", {}) if any(re.search(p, n) for p in c.checks))}
    return out


def markdown(summary: dict, scale: str, reference: Optional[dict] = None) -> str:
    """The claim table; `reference` (the committed cpu-scale summary) adds its statuses beside ours."""
    table_rows = rows(summary)
    ref_rows = rows(reference) if reference else None
    header = ["artefact", "claim", "paper", f"ours ({scale})", "status", "why"]
    if ref_rows:
        header.insert(5, "cpu-scale status (committed)")
    body = []
    for c in CLAIMS:
        r = table_rows[c.key]
        row = [c.key, c.claim, c.paper, r["ours"] or "–", f"**{r['status']}**", r["why"] or "–"]
        if ref_rows:
            row.insert(5, ref_rows[c.key]["status"])
        body.append(row)
    counts = {s: sum(r["status"] == s for r in table_rows.values()) for s in STATUSES}
    lines = ["## What reproduced", "",
             f"{counts['reproduced']} reproduced, {counts['partly']} partly, {counts['not reproduced']} not "
             f"reproduced, {counts['not attempted']} not attempted (of {len(CLAIMS)} figures and tables). A status "
             "comes from the checks named in each section below (thresholds and their sources: "
             "docs/reproduction.md#thresholds), never from prose.", "", table(header, body)]
    return "\n".join(lines) + "\n"
