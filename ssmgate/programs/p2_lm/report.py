"""The P2 language-modelling section of the reproduction report and its summary entry `p2_lm`.

`build(runs, ...)` takes the summaries of the `lm_rope05` (rotation) and `lm_rope0` (no rotation)
runs of ssmgate.programs.p2_lm.program and of their second seeds `*_seed1` (any may be missing) and returns
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
    "layer_heatmap", "memory", "checks", "wall_s"},
   markdown)
with the paper's numbers (protocol §8.2-8.4, SISO and MIMO 1.5B) beside ours.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from ssmgate.plotting import pyplot
from ssmgate.report import check_bars as bars
from ssmgate.report.format import Checks, report_tail, table

RUNS = {"lm_rope05": "rotation", "lm_rope0": "no_rotation"}  # seed 0: every measurement
SEED_RUNS = {"lm_rope05": ("rotation", 0), "lm_rope0": ("no_rotation", 0),  # the seed spread of the PPL claims
             "lm_rope05_seed1": ("rotation", 1), "lm_rope0_seed1": ("no_rotation", 1)}
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
    for key in ("intervention_ratio", "intervention_ppl", "bc_removal_ratio", "bc_removal_ppl", "bc_window",
                "layer_heatmap", "memory", "n_windows", "intervention_ratio_ci", "bc_removal_ratio_ci",
                "bc_removal_ppl_ci", "windows"):
        if key in rot:
            entry[key] = rot[key]
    traj = rot.get("phase_trajectories")
    if traj:
        entry["phase_trajectories"] = {k: v for k, v in traj.items() if k != "channels"}
    if "state_stats" in rot and "native" in rot["state_stats"]:
        stats = rot["state_stats"]
        entry["state_stats"] = {k: stats[k]["long"] for k in ("native", "removed")}
        entry["state_stats_by_span"] = {k: stats[k] for k in ("native", "removed")}
        entry["state_stats_spans"] = stats["spans"]
    return entry


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
    """The P2 LM claims at the papers' bars (check_bars.py); every ordering strict."""
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
    bc = entry.get("bc_removal_ratio")
    if bc:
        ci = entry.get("bc_removal_ratio_ci", {})
        one = lambda k: (bc[k], ci.get(k))  # noqa: E731
        out.add("table7_each_single_removal_gt_remove_both_gt_native",
                _above(*one("remove_B"), *one("remove_both")) and _above(*one("remove_C"), *one("remove_both"))
                and _above(*one("remove_both"), 1.0, None),
                "P2 Table 7: removing one side's rotation (B or C) hurts more than removing both, and removing both "
                "still hurts (a partial recovery); each beyond the 95% bootstrap intervals",
                "acceptance, P2 Table 7: remove-B, remove-C > remove-both > native; " + bars.source("lm_ci_level"))
        out.add("table7_remove_C_gt_remove_B", _above(*one("remove_C"), *one("remove_B")),
                "P2 Table 7: removing C's (read) rotation hurts more than removing B's (write), beyond the 95% "
                "bootstrap intervals",
                "acceptance, P2 Table 7: remove-C >= remove-B (strict here, as every ordering; paper 12.18 > 9.04 "
                "SISO, 5.74 > 4.89 MIMO); " + bars.source("lm_ci_level"))
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
    stats = entry.get("state_stats_by_span")
    if stats:
        spans = list(stats["native"])
        out.add("cosine_rises_after_phase_removal",
                all(stats["removed"][s]["cosine"] > stats["native"][s]["cosine"] for s in spans),
                "P2 Table 6: the history/update cosine is larger after phase removal, at both spans",
                "acceptance, P2 Table 6")
        out.add("rms_rises_after_phase_removal", all(stats["removed"][s]["rms"] > stats["native"][s]["rms"]
                                                     for s in spans),
                "P2 Table 6: the RMS state norm is larger after phase removal, at both spans", "acceptance, P2 Table 6")
    mem = entry.get("memory")
    if mem:
        frac = bars.bar("lm_memory_growth")
        out.add("window_memory_growth_below_a_tenth_of_unchunked_extra",
                mem["growth_mb"] < frac * mem["unchunked_extra_mb"],
                "ours: scoring a window in state-carrying pieces needs memory independent of its length",
                bars.source("lm_memory_growth"))
    return out


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


def build(runs: dict, scale: str, changes: dict, walls: dict, figure_dir: Path, run_root: Path):
    figure_dir.mkdir(parents=True, exist_ok=True)
    entry = collect(runs)
    entry["checks"] = checks(entry)
    entry["wall_s"] = walls
    lines = [f"## P2 language modelling and interventions ({scale} scale)", ""]
    if not entry["ppl"]:
        return entry, "\n".join(lines + report_tail({}, list(SEED_RUNS), changes)) + "\n"
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
        rows = [[f"{r['window']:,}", f"{r['piece_len']:,}", f"{r['peak_rss_mb']:.0f}"]
                for r in [*mem["runs"], mem["unchunked"]]]
        lines += [f"Memory of scoring one window (a fresh process per row, random weights; peak resident memory, "
                  f"measured as {mem['runs'][0]['method']}). In pieces of {mem['piece_len']} tokens that carry the "
                  f"state the peak varies by {mem['growth_mb']:.0f} MB across window lengths (allocator noise is "
                  f"some 20 MB); the longest window in one piece needs {mem['unchunked_extra_mb']:.0f} MB more "
                  f"(its logits alone are {mem['full_logits_mb']:.1f} MB).", "",
                  table(["window (tokens)", "piece (tokens)", "peak RSS (MB)"], rows)]
    lines += report_tail(entry["checks"], [r for r in SEED_RUNS if r not in runs], changes)
    return entry, "\n".join(lines) + "\n"
