"""The P2 language-modelling section of the reproduction report and its summary entry `p2_lm`.

`build(runs, ...)` takes the summaries of the `lm_rope05` (rotation) and `lm_rope0` (no rotation)
runs of ssmgate.programs.p2_lm.program, of their second seeds `*_seed1` and of `lm_mimo` (the rotation
model at MIMO rank 4; any may be missing) and returns
  ({"ppl": {variant: held-out PPL of seed 0}, "window_ppl": {variant: {C: PPL}},
    "ppl_seeds": {variant: [PPL per seed]}, "window_ppl_seeds": {variant: {C: [PPL per seed]}},
    "bucket_ppl_seeds": {variant: {"lo-hi": [PPL per seed]}},
    "intervention_ratio": {intervention: {C: ratio to native}},
    "bc_removal_ratio": {remove_B | remove_C | remove_both: ratio},
    "window_ppl_ci", "intervention_ratio_ci", "bc_removal_ratio_ci": the same keys, [lo, hi] 95% bootstrap
      intervals over windows (seed 0's rotation model; "window_ppl_ci" per variant),
    "windows": the window layout (protocol §7.2 books or pseudo-books),
    "phase_trajectories": {"classes": {slow | medium | fast: {travel, cycles, tokens_per_cycle, ...}},
      "travel_ratio": {fast_over_slow, ...}, ...} (Fig 4),
    "window_ppl_along_training": {variant: {step: {C: PPL}}} (seed 0; Figs 8-9),
    "window_ppl_along_training_seeds": {variant: {step: {C: [PPL per seed]}}},
    "state_stats": {native | removed: {cosine, rms}} (the long span; "state_stats_by_span" has both),
    "val_curve": {variant: [[step, ppl], ...]}, "bucket_ppl": {variant: {"lo-hi": ppl, "rows": n}},
    "layer_heatmap", "memory", "checks", "wall_s",
    "mimo": {"ppl", "params", "window_ppl", and the intervention keys above (intervention_*, bc_*, state_stats*)
      of the MIMO rank-4 rotation model, run `lm_mimo`}},
   markdown)
with the paper's numbers (protocol §8.2-8.4, SISO and MIMO 1.5B) beside ours.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from ssmgate.plotting import pyplot
from ssmgate.report.format import Checks, report_tail, table

from .claims import BARS as bars

RUNS = {"lm_rope05": "rotation", "lm_rope0": "no_rotation"}  # seed 0: every measurement
SEED_RUNS = {"lm_rope05": ("rotation", 0), "lm_rope0": ("no_rotation", 0),  # the seed spread of the PPL claims
             "lm_rope05_seed1": ("rotation", 1), "lm_rope0_seed1": ("no_rotation", 1)}
# The MIMO rank-4 rotation model: its interventions and diagnostics beside the SISO model's (P2 Tables 5-7, MIMO).
MIMO_RUN = "lm_mimo"
INTERVENTION_NAMES = {"decay_permutation": "decay permutation", "phase_shuffle": "phase shuffle",
                      "phase_removal": "phase removal", "phase_reversal": "phase reversal"}
# protocol §8.2 Table 5: ratio to native PPL at 2K / 16K / 64K, SISO and MIMO 1.5B.
PAPER_TABLE5 = {
    "decay_permutation": ((5.43, 5.91, 6.08), (1.22, 1.21, 1.21)),
    "phase_shuffle": ((2.38, 4.49, 7.25), (3.05, 3.28, 3.20)),
    "phase_removal": ((3.22, 13.34, 41.33), (9.34, 14.92, 15.08)),
    "phase_reversal": ((7.22, 27.93, 74.10), (3.52, 3.67, 3.60)),
}
PAPER_TABLE7 = {"remove_B": (9.04, 4.89), "remove_C": (12.18, 5.74), "remove_both": (2.08, 2.90)}  # SISO, MIMO at 64K
PAPER_TABLE6 = {"short": ((0.293, 0.429), (7.635, 8.899)), "long": ((0.294, 0.474), (7.621, 9.437))}  # SISO 16K, 64K


def collect(runs: dict) -> dict:
    entry: dict = {"ppl": {}, "window_ppl": {}, "window_accuracy": {}, "val_curve": {}, "params": {}}
    for run, variant in RUNS.items():
        if run not in runs:
            continue
        s = runs[run]
        entry["ppl"][variant] = s["ppl"]
        entry["window_ppl"][variant] = s["long_eval"]["window_ppl"]
        if "window_ppl_ci" in s["long_eval"]:
            entry.setdefault("window_ppl_ci", {})[variant] = s["long_eval"]["window_ppl_ci"]
        if s.get("window_ppl_along_training"):
            entry.setdefault("window_ppl_along_training", {})[variant] = s["window_ppl_along_training"]
        entry["window_accuracy"][variant] = s["long_eval"]["window_accuracy"]
        entry["val_curve"][variant] = s["val_curve"]
        entry["params"][variant] = s["params"]
        if "bucket_ppl" in s["long_eval"]:
            entry.setdefault("bucket_ppl", {})[variant] = s["long_eval"]["bucket_ppl"]
    for run, (variant, _seed) in SEED_RUNS.items():  # seed 0 first: the runs above
        if run in runs:
            entry.setdefault("ppl_seeds", {}).setdefault(variant, []).append(runs[run]["ppl"])
            for c, v in runs[run]["long_eval"]["window_ppl"].items():
                entry.setdefault("window_ppl_seeds", {}).setdefault(variant, {}).setdefault(c, []).append(v)
            for span, v in runs[run]["long_eval"].get("bucket_ppl", {}).items():
                if "-" in span:
                    entry.setdefault("bucket_ppl_seeds", {}).setdefault(variant, {}).setdefault(span, []).append(v)
            for step, row in runs[run].get("window_ppl_along_training", {}).items():
                for c, v in row.items():
                    entry.setdefault("window_ppl_along_training_seeds", {}).setdefault(variant, {}).setdefault(
                        step, {}).setdefault(c, []).append(v)
    rot = runs.get("lm_rope05", {}).get("long_eval", {})
    entry.update(_interventions(rot))
    for key in ("layer_heatmap", "memory", "n_windows", "windows"):
        if key in rot:
            entry[key] = rot[key]
    traj = rot.get("phase_trajectories")
    if traj:
        entry["phase_trajectories"] = {k: v for k, v in traj.items() if k != "channels"}
    if MIMO_RUN in runs:
        s = runs[MIMO_RUN]
        entry["mimo"] = {"ppl": s["ppl"], "params": s["params"], "window_ppl": s["long_eval"]["window_ppl"],
                         **_interventions(s["long_eval"])}
    return entry


def _interventions(long_eval: dict) -> dict:
    """The intervention measurements of one model's long evaluation (Tables 5-7), as the summary keeps them."""
    out = {key: long_eval[key] for key in (
        "intervention_ratio", "intervention_ppl", "bc_removal_ratio", "bc_removal_ppl", "bc_window",
        "intervention_ratio_ci", "bc_removal_ratio_ci", "bc_removal_ppl_ci") if key in long_eval}
    stats = long_eval.get("state_stats")
    if stats and "native" in stats:
        out["state_stats"] = {k: stats[k]["long"] for k in ("native", "removed")}
        out["state_stats_by_span"] = {k: stats[k] for k in ("native", "removed")}
        out["state_stats_spans"] = stats["spans"]
    return out


def _below_beyond_spread(low: list, high: list) -> bool:
    """Every seed of `low` strictly below every seed of `high`, with >= lm_min_seeds seeds each: the
    gap is larger than the spread between seeds (a tie, or one seed, fails)."""
    n = bars.bar("lm_min_seeds")
    clean = lambda vs: [v for v in vs if v is not None]  # noqa: E731
    low, high = clean(low), clean(high)
    return len(low) >= n and len(high) >= n and max(low) < min(high)


def _lo(ci, point):
    """The lower end of a [lo, hi] interval; the point value where none was recorded (a summary from
    before the intervals)."""
    return point if not ci else ci[0]


def _hi(ci, point):
    return point if not ci else ci[1]


def _above(a, a_ci, b, b_ci) -> bool:
    """a > b beyond both intervals: a's lower end above b's upper end (None never is)."""
    return a is not None and b is not None and _lo(a_ci, a) > _hi(b_ci, b)


def _last_shared_step(curves: dict, n: int):
    """The last step at which every variant of `curves` ({variant: {step: {C: [per seed]}}}) has >= n
    seeds at every C it measured; None if there is none."""
    steps = [set(st for st, row in curve.items() if row and all(len(vs) >= n for vs in row.values()))
             for curve in curves.values()]
    shared = set.intersection(*steps) if steps else set()
    return max(shared, key=int) if shared else None


def _log_gap_range(rot: list, norot: list) -> tuple:
    """(smallest, largest) log(no-rotation PPL / rotation PPL) over every pair of seeds."""
    gaps = [np.log(b) - np.log(a) for a in rot for b in norot]
    return min(gaps), max(gaps)


def _strictly_increasing(values) -> bool:
    return len(values) > 1 and all(v is not None for v in values) and all(a < b for a, b in zip(values, values[1:]))


def _mean_change_by_width(cells: list) -> dict:
    """{window width: mean accuracy change (pp) over the layer windows of that width}, widths ascending."""
    widths: dict = {}
    for c in cells:
        widths.setdefault(int(c["width"]), []).append(c["accuracy_change_pp"])
    return {w: (None if any(v is None for v in vs) else sum(vs) / len(vs)) for w, vs in sorted(widths.items())}


def checks(entry: dict) -> Checks:
    """The P2 LM claims at the papers' bars (claims.py); every ordering strict."""
    out = Checks()
    seeds, win_seeds = entry.get("ppl_seeds", {}), entry.get("window_ppl_seeds", {})
    if {"rotation", "no_rotation"} <= set(entry["ppl"]):
        n = {v: len(seeds.get(v, [])) for v in ("rotation", "no_rotation")}
        out.add("rotation_heldout_ppl_below_no_rotation_beyond_seed_spread",
                _below_beyond_spread(seeds.get("rotation", []), seeds.get("no_rotation", [])),
                f"P2 Fig 7 / Table 3: rotation has the lower held-out PPL, every seed below every seed "
                f"({n['rotation']} and {n['no_rotation']} seeds)", bars.source("lm_min_seeds"))
        rot, norot = win_seeds.get("rotation", {}), win_seeds.get("no_rotation", {})
        shared = sorted(set(rot) & set(norot), key=int)
        out.add("rotation_window_ppl_below_no_rotation_every_C_beyond_seed_spread",
                bool(shared) and all(_below_beyond_spread(rot[c], norot[c]) for c in shared),
                "P2 Fig 3: rotation has the lower windowed PPL at every window size C, beyond the seed spread",
                bars.source("lm_min_seeds"))
    buckets = entry.get("bucket_ppl_seeds", {})
    if {"rotation", "no_rotation"} <= set(buckets):
        shared = sorted(set(buckets["rotation"]) & set(buckets["no_rotation"]), key=lambda k: int(k.split("-")[0]))
        out.add("rotation_bucket_ppl_below_no_rotation_every_bucket_beyond_seed_spread",
                bool(shared) and all(_below_beyond_spread(buckets["rotation"][k], buckets["no_rotation"][k])
                                     for k in shared),
                "P2 Fig 6: rotation has the lower PPL in every position bucket, beyond the seed spread",
                bars.source("lm_min_seeds"))
    curves = entry.get("window_ppl_along_training_seeds", {})
    if {"rotation", "no_rotation"} <= set(curves):
        pair = {v: curves[v] for v in ("rotation", "no_rotation")}
        last = _last_shared_step(pair, bars.bar("lm_min_seeds"))
        rot, norot = (pair[v].get(last, {}) if last else {} for v in ("rotation", "no_rotation"))
        shared = sorted(set(rot) & set(norot), key=int)
        out.add("fig8_9_rotation_window_ppl_below_no_rotation_at_the_last_step_every_C_beyond_seed_spread",
                bool(shared) and all(_below_beyond_spread(rot[c], norot[c]) for c in shared),
                f"P2 Figs 8-9: along training the rotation model ends with the lower windowed PPL: at the last step "
                f"measured ({last}) every rotation seed below every no-rotation seed at every curve window "
                f"({', '.join(shared) or 'none'})", bars.source("lm_min_seeds"))
        widens = False
        if len(shared) > 1:
            small, large = shared[0], shared[-1]
            widens = _log_gap_range(rot[large], norot[large])[0] > _log_gap_range(rot[small], norot[small])[1] > 0
        out.add("fig8_9_rotation_gap_widens_from_smallest_to_largest_C_beyond_seed_spread", widens,
                "P2 Figs 8-9 (444M): the rotation model's advantage is larger at long windows: at the last step the "
                "smallest log PPL gap (no rotation / rotation) over seed pairs at the largest curve window exceeds "
                "the largest gap at the smallest window, which is > 0", bars.source("lm_min_seeds"))
    ratios = entry.get("intervention_ratio")
    if ratios:
        bar = bars.bar("lm_table5_ratio")
        ci = entry.get("intervention_ratio_ci", {})
        out.add(f"every_phase_intervention_ratio_gt_{bar:g}",
                all(r is not None and _lo(ci.get(k, {}).get(c), r) > bar
                    for k, row in ratios.items() for c, r in row.items()),
                f"P2 Table 5: every intervention raises PPL by more than x{bar:g} at every C (the lower end of the "
                "95% bootstrap interval over windows)", bars.source("lm_table5_ratio", "lm_ci_level"))
        out.add("every_intervention_ratio_grows_from_smallest_to_largest_C_beyond_ci",
                all(len(row) > 1 and _above(row[max(row, key=int)], ci.get(k, {}).get(max(row, key=int)),
                                            row[min(row, key=int)], ci.get(k, {}).get(min(row, key=int)))
                    for k, row in ratios.items()),
                "P2 Table 5 (SISO): the intervention ratios grow with the window C; here every intervention's ratio "
                "at the largest C exceeds its ratio at the smallest C beyond both 95% bootstrap intervals",
                "acceptance, P2 Table 5: SISO ratios grow with C; " + bars.source("lm_ci_level"))
    _table7_checks(out, entry)
    traj = entry.get("phase_trajectories")
    if traj:
        bar = bars.bar("lm_fig4_fast_over_slow")
        classes, ratio = traj.get("classes"), traj.get("travel_ratio", {})
        travel = [classes[k]["travel"] for k in ("slow", "medium", "fast")] if classes else []
        out.add(f"fig4_phase_travel_slow_lt_medium_lt_fast_and_fast_over_slow_ge_{bar:g}",
                _strictly_increasing(travel) and ratio.get("fast_over_slow", 0.0) >= bar,
                "P2 Fig 4: the slow, medium and fast channels (10th / 50th / 99th percentile of phase travel among "
                "those turning at least once) trace distinct trajectories: their travel is ordered and the fast one "
                f"travels >= {bar:g}x the slow one's phase (fails when no channel turns once)",
                bars.source("lm_fig4_fast_over_slow"))
    heat = entry.get("layer_heatmap")
    if heat and heat.get("cells"):
        changes = [c["accuracy_change_pp"] for c in heat["cells"]]
        by_width = _mean_change_by_width(heat["cells"])
        out.add("fig2_mean_accuracy_change_falls_strictly_with_window_width",
                len(by_width) > 1 and _strictly_increasing([-v for v in by_width.values()]),
                "P2 Fig 2: removing the phases of a wider window of layers costs more accuracy (the mean change "
                "over the windows of each width falls strictly as the width grows)",
                "P2 Fig 2 (protocol §8.1): LAMBADA drops more with wider windows (an ordering, strict)")
        lo, hi = bars.bar("lm_fig2_change_lo"), bars.bar("lm_fig2_change_hi")
        out.add(f"fig2_every_window_accuracy_change_within_[{lo:+g},{hi:+g}]_pp",
                all(v is not None and lo <= v <= hi for v in changes),
                "P2 Fig 2: phase removal in a window of layers changes accuracy by -45 to +3 points",
                bars.source("lm_fig2_change_lo", "lm_fig2_change_hi"))
    _table6_checks(out, entry)
    _mimo_checks(out, entry)
    mem = entry.get("memory")
    if mem:
        frac = bars.bar("lm_memory_growth")
        out.add("window_memory_growth_below_a_tenth_of_unchunked_extra",
                mem["growth_mb"] < frac * mem["unchunked_extra_mb"],
                "ours: scoring a window in state-carrying pieces needs memory independent of its length",
                bars.source("lm_memory_growth"))
    return out


def _table7_checks(out: Checks, m: dict, prefix: str = "", model: str = "") -> None:
    """P2 Table 7 on one model's entry `m` (the SISO rotation model's, or entry["mimo"] with prefix "mimo_")."""
    bc = m.get("bc_removal_ratio")
    if not bc:
        return
    ci = m.get("bc_removal_ratio_ci", {})
    one = lambda k: (bc[k], ci.get(k))  # noqa: E731
    out.add(f"{prefix}table7_each_single_removal_gt_remove_both_gt_native",
            _above(*one("remove_B"), *one("remove_both")) and _above(*one("remove_C"), *one("remove_both"))
            and _above(*one("remove_both"), 1.0, None),
            f"P2 Table 7{model}: removing one side's rotation (B or C) hurts more than removing both, and removing "
            "both still hurts (a partial recovery); each beyond the 95% bootstrap intervals",
            "acceptance, P2 Table 7: remove-B, remove-C > remove-both > native, both models; "
            + bars.source("lm_ci_level"))
    out.add(f"{prefix}table7_remove_C_gt_remove_B", _above(*one("remove_C"), *one("remove_B")),
            f"P2 Table 7{model}: removing C's (read) rotation hurts more than removing B's (write), beyond the 95% "
            "bootstrap intervals",
            "acceptance, P2 Table 7: remove-C >= remove-B (strict here, as every ordering; paper 12.18 > 9.04 "
            "SISO, 5.74 > 4.89 MIMO); " + bars.source("lm_ci_level"))


def _table6_checks(out: Checks, m: dict, prefix: str = "", model: str = "") -> None:
    stats = m.get("state_stats_by_span")
    if not stats:
        return
    spans = list(stats["native"])
    for stat, name in (("cosine", "the history/update cosine"), ("rms", "the RMS state norm")):
        out.add(f"{prefix}{stat}_rises_after_phase_removal",
                all(stats["removed"][s][stat] > stats["native"][s][stat] for s in spans),
                f"P2 Table 6{model}: {name} is larger after phase removal, at both spans",
                "acceptance, P2 Table 6 (both models)")


def _growth_bounds(row: dict, ci: dict) -> tuple:
    """(lowest, highest) ratio(largest C) / ratio(smallest C) within the 95% intervals of both ends."""
    small, large = min(row, key=int), max(row, key=int)
    return (_lo(ci.get(large), row[large]) / _hi(ci.get(small), row[small]),
            _hi(ci.get(large), row[large]) / _lo(ci.get(small), row[small]))


def _mimo_checks(out: Checks, entry: dict) -> None:
    """P2 Tables 5-7, MIMO: the MIMO rank-4 rotation model (entry["mimo"]) on its own and against the SISO one."""
    m = entry.get("mimo")
    if not m:
        return
    ratios, ci = m.get("intervention_ratio"), m.get("intervention_ratio_ci", {})
    if ratios:
        bar = bars.bar("lm_table5_ratio")
        out.add(f"mimo_every_phase_intervention_ratio_gt_{bar:g}",
                all(r is not None and _lo(ci.get(k, {}).get(c), r) > bar
                    for k, row in ratios.items() for c, r in row.items()),
                f"P2 Table 5, MIMO: every intervention raises PPL by more than x{bar:g} at every C (the lower end of "
                "the 95% bootstrap interval over windows)", bars.source("lm_table5_ratio", "lm_ci_level"))
        at = {k: (row[max(row, key=int)], ci.get(k, {}).get(max(row, key=int))) for k, row in ratios.items()}
        others = lambda k: [o for o in at if o != k]  # noqa: E731
        out.add("mimo_phase_removal_largest_decay_permutation_smallest_at_largest_C_beyond_ci",
                {"phase_removal", "decay_permutation"} <= set(at) and len(at) > 2
                and all(_above(*at["phase_removal"], *at[o]) for o in others("phase_removal"))
                and all(_above(*at[o], *at["decay_permutation"]) for o in others("decay_permutation")),
                "P2 Table 5, MIMO: at the largest window phase removal hurts most and the decay permutation least "
                "(every phase intervention exceeds it), each beyond the 95% bootstrap intervals",
                "acceptance, P2 Table 5: MIMO removal largest, decay-perm smallest (paper 15.08 > 3.60 > 3.20 > "
                "1.21 at 64K); " + bars.source("lm_ci_level"))
        siso, siso_ci = entry.get("intervention_ratio") or {}, entry.get("intervention_ratio_ci", {})
        shared = [k for k in ratios if k in siso and len(ratios[k]) > 1 and len(siso[k]) > 1]
        out.add("mimo_ratio_growth_with_C_below_siso_every_intervention_beyond_ci",
                bool(shared) and all(_growth_bounds(ratios[k], ci.get(k, {}))[1]
                                     < _growth_bounds(siso[k], siso_ci.get(k, {}))[0] for k in shared),
                "P2 Table 5: SISO's ratios grow with C while MIMO's stay roughly flat: for every intervention the "
                "MIMO ratio's growth from the smallest to the largest C (its highest within the intervals) is below "
                "the SISO one's (its lowest)",
                "acceptance, P2 Table 5: SISO ratios grow with C, MIMO roughly flat (paper growth 2K -> 64K: SISO "
                "x1.1-x12.8, MIMO x0.99-x1.6 per intervention); " + bars.source("lm_ci_level"))
    _table7_checks(out, m, "mimo_", ", MIMO")
    _table6_checks(out, m, "mimo_", ", MIMO")
    siso_stats, mimo_stats = entry.get("state_stats"), m.get("state_stats")
    if siso_stats and mimo_stats:
        shift = lambda st: st["removed"]["cosine"] - st["native"]["cosine"]  # noqa: E731
        out.add("mimo_cosine_shift_larger_than_siso", shift(mimo_stats) > shift(siso_stats),
                "P2 Table 6: phase removal moves the history/update cosine more in the MIMO model than in the SISO "
                "one (long span)", "acceptance, P2 Table 6: MIMO cosine shift larger than SISO")


def recheck(entry: dict) -> Checks:
    """The checks of a summary entry written earlier (its runs' folders gone)."""
    return checks(entry)


def _window_axis(ax, sizes) -> None:
    """Log-scaled window sizes, ticked at the sizes measured."""
    ax.set_xscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([f"{c // 1000}K" if c >= 1000 and c % 1000 == 0 else str(c) for c in sizes])
    ax.minorticks_off()


def _plot_ci(ax, row: dict, ci: dict, label: str) -> None:
    """{C: value} against C, with the [lo, hi] intervals of `ci` as error bars where recorded."""
    cs = sorted((int(c), v) for c, v in row.items() if v is not None)
    xs, ys = [c for c, _ in cs], [v for _, v in cs]
    err = [[v - (ci.get(str(c)) or (v, v))[0] for c, v in cs], [(ci.get(str(c)) or (v, v))[1] - v for c, v in cs]]
    ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)


def _training_curve_figure(curves: dict, path: Path) -> None:
    """P2 Figs 8-9: the windowed PPL against the training step, one panel per window C, one line per
    variant and seed (curves: {variant: {step: {C: [PPL per seed]}}})."""
    sizes = sorted({c for curve in curves.values() for row in curve.values() for c in row}, key=int)
    plt = pyplot()
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 3.4), squeeze=False)
    for ax, c in zip(axes[0], sizes):
        for i, (variant, curve) in enumerate(curves.items()):
            n = max((len(row.get(c, [])) for row in curve.values()), default=0)
            for seed in range(n):
                pts = sorted((int(st), row[c][seed]) for st, row in curve.items() if len(row.get(c, [])) > seed)
                ax.plot([st for st, _ in pts], [v for _, v in pts], marker="o", ms=3, color=f"C{i}",
                        ls="-" if seed == 0 else "--", label=f"{variant.replace('_', ' ')} seed {seed}")
        ax.set(xlabel="training step", ylabel="windowed PPL", title=f"C = {c} (cf. Figs 8-9)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ppl_figure(entry: dict, path: Path) -> None:
    sizes = sorted({int(c) for row in entry["window_ppl"].values() for c in row})
    plt = pyplot()
    fig, axes = plt.subplots(1, 3 if entry.get("intervention_ratio") else 2, figsize=(13, 3.6), squeeze=False)
    ax = axes[0][0]
    for variant, curve in entry["val_curve"].items():
        if curve:
            steps, values = zip(*curve)
            ax.plot(steps, values, marker="o", ms=3, label=variant.replace("_", " "))
    ax.set(xlabel="step", ylabel="validation PPL (bytes)", title="held-out PPL during training (cf. Fig 7)")
    ax.legend(fontsize=8)
    ax = axes[0][1]
    for variant, row in entry["window_ppl"].items():
        _plot_ci(ax, row, entry.get("window_ppl_ci", {}).get(variant, {}), variant.replace("_", " "))
    ax.set(xlabel="window C (tokens)", ylabel="PPL of the scored tokens", title="windowed PPL (protocol §7.2; cf. Fig 3)")
    _window_axis(ax, sizes)
    ax.legend(fontsize=8)
    if entry.get("intervention_ratio"):
        ax = axes[0][2]
        for kind, row in entry["intervention_ratio"].items():
            _plot_ci(ax, row, entry.get("intervention_ratio_ci", {}).get(kind, {}), INTERVENTION_NAMES.get(kind, kind))
        ax.axhline(1.0, color="grey", lw=0.6)
        ax.set(xlabel="window C (tokens)", ylabel="PPL ratio to native",
               title="interventions on the rotation model (cf. Table 5)")
        _window_axis(ax, sizes)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _heatmap_figure(heat: dict, path: Path) -> None:
    cells = heat["cells"]
    n = max(c["start"] + c["width"] for c in cells)
    grid = np.full((n, n), np.nan)
    for c in cells:
        grid[c["width"] - 1, c["start"]] = c["accuracy_change_pp"]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.2, 3.6))
    lim = max(1e-9, np.nanmax(np.abs(grid)))
    im = ax.imshow(grid, origin="lower", cmap="RdBu", vmin=-lim, vmax=lim)
    ax.set(xlabel="first layer of the window", ylabel="window width (layers)", xticks=range(n), yticks=range(n),
           yticklabels=range(1, n + 1), title=f"phase removal in a layer window\naccuracy change (pp), C={heat['window']}")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(v, digits=3):
    return "–" if v is None else f"{v:.{digits}f}"


def _ratio_cell(ppl, ratio, ci=None):
    if ppl is None:
        return "–"
    return f"{ppl:.3f} ({ratio:.2f}×" + (f", {ci[0]:.2f}–{ci[1]:.2f}" if ci else "") + ")"


def _ci(ci, digits=3):
    return "–" if not ci else f"[{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def _mimo_section(entry: dict, sizes: list) -> list:
    """The MIMO rank-4 model's Tables 5-7 beside the SISO model's ratios and the paper's MIMO ones."""
    m = entry["mimo"]
    lines = [f"MIMO rank 4 (run `{MIMO_RUN}`: the rotation model with rank-4 MIMO, {m['params']:,} parameters, the "
             f"same data and schedule; held-out PPL {_fmt(m['ppl'])}; native windowed PPL "
             + ", ".join(f"C={c} {_fmt(m['window_ppl'].get(c))}" for c in sizes) + "). The paper's MIMO contrasts "
             "(Tables 5-7) are on the official 1.5B MIMO checkpoint.", ""]
    ratio, kci, siso = m.get("intervention_ratio", {}), m.get("intervention_ratio_ci", {}), entry.get("intervention_ratio", {})
    if ratio:
        rows = [[INTERVENTION_NAMES.get(k, k),
                 *[_ratio_cell(m["intervention_ppl"][k][c], ratio[k][c], kci.get(k, {}).get(c)) for c in sizes],
                 ", ".join(f"{siso[k][c]:.2f}" for c in sizes) if k in siso else "–",
                 ", ".join(f"{v:g}" for v in PAPER_TABLE5.get(k, ((), ()))[1])] for k in ratio]
        lines += ["Phase-structure interventions on the MIMO model (protocol §8.2, Table 5): PPL (ratio to native, "
                  "95% interval), the SISO model's ratios at the same C, and the paper's MIMO ratios at 2K / 16K / 64K.",
                  "", table(["intervention", *[f"C={c}" for c in sizes], "ours SISO", "paper MIMO"], rows)]
    if m.get("bc_removal_ratio"):
        r, rci = m["bc_removal_ratio"], m.get("bc_removal_ratio_ci", {})
        rows = [[k.replace("_", " "), _ratio_cell(m["bc_removal_ppl"][k], r[k], rci.get(k)),
                 _fmt((entry.get("bc_removal_ratio") or {}).get(k), 2), f"{PAPER_TABLE7[k][1]:g}"] for k in PAPER_TABLE7]
        lines += [f"Write/read rotation removal on the MIMO model (C={m['bc_window']}, Table 7):", "",
                  table(["intervention", "PPL (ratio, interval)", "ours SISO ratio", "paper MIMO ratio"], rows)]
    if m.get("state_stats"):
        st, siso_st = m["state_stats"], entry.get("state_stats")
        lines += ["State diagnostics of the MIMO model over the long span (Table 6): cosine "
                  f"{st['native']['cosine']:.3f} → {st['removed']['cosine']:.3f}, RMS {st['native']['rms']:.3f} → "
                  f"{st['removed']['rms']:.3f}"
                  + (f" (SISO: cosine {siso_st['native']['cosine']:.3f} → {siso_st['removed']['cosine']:.3f})"
                     if siso_st else "") + ".", ""]
    return lines


def build(runs: dict, scale: str, changes: dict, walls: dict, figure_dir: Path, run_root: Path):
    figure_dir.mkdir(parents=True, exist_ok=True)
    entry = collect(runs)
    entry["checks"] = checks(entry)
    entry["wall_s"] = walls
    lines = [f"## P2 language modelling and interventions ({scale} scale)", ""]
    if not entry["ppl"]:
        return entry, "\n".join(lines + report_tail({}, [*SEED_RUNS, MIMO_RUN], changes)) + "\n"
    win = entry["window_ppl"]
    sizes = sorted({c for row in win.values() for c in row}, key=int)
    rows = [[v.replace("_", " "), f"{entry['params'][v]:,}", _fmt(entry["ppl"][v]),
             *[_fmt(win[v].get(c)) for c in sizes]] for v in entry["ppl"]]
    layout = entry.get("windows", {})
    where = ("the evaluation books" if layout.get("layout") != "pseudo_books" else
             f"{layout['pseudo_books']} pseudo-books of {layout['pseudo_book_tokens']:,} tokens (the evaluation "
             f"books joined with EOS; every C's windows end where the C={layout['anchor']} windows end, so every C "
             "scores the same tokens)")
    lines += ["Held-out PPL (validation rows, state reset per row) and the windowed PPL of protocol §7.2 (last "
              f"scored tokens of every window, pooled) on {where}. The paper (Fig 3, 7) has rotation lower at every "
              "window size and during training.", "",
              table(["model", "params", "held-out PPL", *[f"C={c}" for c in sizes]], rows)]
    ci = entry.get("window_ppl_ci", {})
    if ci:
        lines += ["95% bootstrap intervals of the windowed PPL over windows (seed 0; 1,000 draws of a fixed seed): "
                  + "; ".join(f"{v.replace('_', ' ')} " + ", ".join(f"C={c} {_ci(row.get(c))}" for c in sizes)
                              for v, row in ci.items()) + ".", ""]
    seeds = entry.get("ppl_seeds", {})
    if seeds:
        lines += ["Held-out PPL per seed (the claims above count only a gap larger than this spread): " + "; ".join(
            f"{v.replace('_', ' ')} " + " / ".join(_fmt(x) for x in vs) for v, vs in seeds.items()) + ".", ""]
    _ppl_figure(entry, figure_dir / "p2_lm_ppl.png")
    lines += ["![PPL](figures/p2_lm_ppl.png)", ""]
    buckets = entry.get("bucket_ppl", {})
    spans = sorted({k for row in buckets.values() for k in row if "-" in k}, key=lambda k: int(k.split("-")[0]))
    if spans:
        rows = [[v.replace("_", " "), str(row.get("rows", "–")), *[_fmt(row.get(k)) for k in spans]]
                for v, row in buckets.items()]
        lines += ["PPL per position bucket (protocol §7.3): the evaluation books joined with EOS, cut into rows, the "
                  "state reset per row (the paper's Fig 6 on four other corpora).", "",
                  table(["model", "rows", *[f"[{k.replace('-', ', ')})" for k in spans]], rows)]
    if entry.get("intervention_ratio"):
        ppl, ratio = entry["intervention_ppl"], entry["intervention_ratio"]
        rows = [["native", *[_fmt(win["rotation"][c]) for c in sizes], "1, 1, 1", "1, 1, 1"]]
        for kind in ppl:
            paper = PAPER_TABLE5.get(kind, ((None,) * 3,) * 2)
            kci = entry.get("intervention_ratio_ci", {}).get(kind, {})
            rows.append([INTERVENTION_NAMES.get(kind, kind),
                         *[_ratio_cell(ppl[kind][c], ratio[kind][c], kci.get(c)) for c in sizes],
                         ", ".join(f"{v:g}" for v in paper[0]), ", ".join(f"{v:g}" for v in paper[1])])
        lines += ["Phase-structure interventions on the rotation model, all layers (protocol §8.2, Table 5): PPL "
                  "(ratio to native, its 95% bootstrap interval over windows, paired with native's). The paper's "
                  "ratios are at 2K / 16K / 64K.", "",
                  table(["intervention", *[f"C={c}" for c in sizes], "paper SISO", "paper MIMO"], rows)]
    if entry.get("bc_removal_ratio"):
        bc, r = entry["bc_removal_ppl"], entry["bc_removal_ratio"]
        rci = entry.get("bc_removal_ratio_ci", {})
        rows = [["native", _fmt(bc["native"]), "1", "1"]] + [
            [k.replace("_", " "), _ratio_cell(bc[k], r[k], rci.get(k)), f"{PAPER_TABLE7[k][0]:g}",
             f"{PAPER_TABLE7[k][1]:g}"] for k in PAPER_TABLE7]
        lines += [f"Write/read rotation removal on the scored positions of C={entry['bc_window']} windows "
                  "(protocol §8.4, Table 7; paper at 64K); ratio to native with its 95% bootstrap interval:", "",
                  table(["intervention", "PPL (ratio, interval)", "paper SISO ratio", "paper MIMO ratio"], rows)]
    if entry.get("mimo"):
        lines += _mimo_section(entry, sizes)
    if entry.get("state_stats_by_span"):
        st, spans = entry["state_stats_by_span"], entry["state_stats_spans"]
        rows = []
        for span, paper in PAPER_TABLE6.items():
            lo, hi = spans[span]
            rows.append([f"[{lo}, {hi})", f"{st['native'][span]['cosine']:.3f} → {st['removed'][span]['cosine']:.3f}",
                         f"{st['native'][span]['rms']:.3f} → {st['removed'][span]['rms']:.3f}",
                         f"{paper[0][0]} → {paper[0][1]}", f"{paper[1][0]} → {paper[1][1]}"])
        lines += ["State diagnostics (protocol §8.3, Table 6): history/update cosine and RMS state norm, native → "
                  "phase removal; positions of one run from a zero state (paper: [2000, 16000) and [2000, 64000) "
                  "of PG-19 books, SISO).", "",
                  table(["span", "cosine", "RMS", "paper cosine (SISO)", "paper RMS (SISO)"], rows)]
    if entry.get("layer_heatmap"):
        heat = entry["layer_heatmap"]
        _heatmap_figure(heat, figure_dir / "p2_lm_layer_heatmap.png")
        lines += [f"Phase removal in every window of consecutive layers (protocol §8.1, Fig 2): change of next-token "
                  f"accuracy on the scored tokens at C={heat['window']} (native {100 * heat['native_accuracy']:.2f}%), "
                  "in place of the paper's LAMBADA / relations accuracy (range −45 … +3 pp).", "",
                  "![layer windows](figures/p2_lm_layer_heatmap.png)", ""]
    trajectories = run_root / "lm_rope05" / "phase_trajectories.png"
    if trajectories.exists():
        shutil.copy(trajectories, figure_dir / "p2_lm_phase_trajectories.png")
        lines += ["Phase trajectories of slow / medium / fast channels of the rotation model on one evaluation "
                  "book (protocol §8.5, Fig 4):", "", "![phase trajectories](figures/p2_lm_phase_trajectories.png)", ""]
    traj = entry.get("phase_trajectories", {})
    if traj.get("classes"):
        rows = [[name, f"{c['percentile']:g}", f"L{c['layer']} h{c['head']} pair {c['pair']}", f"{c['travel']:.1f}",
                 f"{c['cycles']:.2f}", f"{c['tokens_per_cycle']:.0f}"] for name, c in traj["classes"].items()]
        r = traj["travel_ratio"]
        lines += [f"Fig 4 in numbers: phase travel Σ|Δφ| over the {traj['tokens']:,} tokens, the cycles it completes "
                  f"(travel / 2π) and the tokens per cycle, of the channels picked at the 10th / 50th / 99th "
                  f"percentile of travel among the {traj['channels_with_full_turn']} channels turning at least once. "
                  f"Travel ratio fast / slow {r['fast_over_slow']:.1f}, medium / slow {r['medium_over_slow']:.1f}, "
                  f"fast / medium {r['fast_over_medium']:.1f}.", "",
                  table(["class", "percentile", "channel", "travel (rad)", "cycles", "tokens per cycle"], rows)]
    elif traj.get("skipped"):
        lines += [f"Fig 4 in numbers: none, {traj['skipped']}.", ""]
    curves = entry.get("window_ppl_along_training_seeds", {})
    if curves:
        _training_curve_figure(curves, figure_dir / "p2_lm_window_ppl_training.png")
        steps = sorted({st for curve in curves.values() for st in curve}, key=int)
        cs = sorted({c for curve in curves.values() for row in curve.values() for c in row}, key=int)
        rows = [[st, *[" / ".join(_fmt(x) for x in curves.get(v, {}).get(st, {}).get(c, [])) or "–"
                       for v in curves for c in cs]] for st in steps]
        lines += ["Windowed PPL along training (P2 Figs 8-9, where the paper plots PG-19 PPL at 2K-64K against the "
                  "step): the native windowed PPL at each curve window, measured during training on the same "
                  "windows as above (per seed, seed 0 first).", "",
                  table(["step", *[f"{v.replace('_', ' ')} C={c}" for v in curves for c in cs]], rows),
                  "![windowed PPL along training](figures/p2_lm_window_ppl_training.png)", ""]
    if entry.get("memory"):
        mem = entry["memory"]
        rows = [[f"{r['window']:,}", f"{r['piece_len']:,}", f"{r['peak_rss_mb']:.0f}",
                 *([" / ".join(f"{x:.0f}" for x in r["peaks_mb"])] if "peaks_mb" in r else [])]
                for r in [*mem["runs"], mem["unchunked"]]]
        each = ["each process (MB)"] if "peaks_mb" in mem["runs"][0] else []
        # Summaries written before rows were repeated hold one process per row and no spread.
        repeats = mem.get("repeats", 1)
        per_row = (f"the median of {repeats} fresh processes per row" if repeats > 1 else "a fresh process per row")
        noise = (f" (one row's processes spread by up to {mem['spread_mb']:.0f} MB)" if "spread_mb" in mem else "")
        lines += [f"Memory of scoring one window ({per_row}, random weights; peak resident memory, "
                  f"measured as {mem['runs'][0]['method']}). In pieces of {mem['piece_len']} tokens that carry the "
                  f"state the peak varies by {mem['growth_mb']:.0f} MB across window lengths{noise}; the longest "
                  f"window in one piece needs {mem['unchunked_extra_mb']:.0f} MB more "
                  f"(its logits alone are {mem['full_logits_mb']:.1f} MB).", "",
                  table(["window (tokens)", "piece (tokens)", "peak RSS (MB)", *each], rows)]
    lines += report_tail(entry["checks"], [r for r in (*SEED_RUNS, MIMO_RUN) if r not in runs], changes)
    return entry, "\n".join(lines) + "\n"
