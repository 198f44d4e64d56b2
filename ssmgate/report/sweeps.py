"""Report helpers for gate-offset sweeps (P1's KV and Horn sections): offset keys in order, one
colour per offset, per-offset curves, and 95% intervals over seeds as text and as bands."""
from __future__ import annotations


def offset_keys(d: dict) -> list[str]:
    """Offset keys sorted by value."""
    return sorted(d, key=float)


def offset_colors(keys):
    import matplotlib
    cmap = matplotlib.colormaps["viridis"]
    return {o: cmap(i / max(len(keys) - 1, 1)) for i, o in enumerate(keys)}


def curves_by_offset(run: dict) -> tuple[list, dict, dict]:
    """(offset keys in increasing order, {key: [curves of its seeds]}, {key: colour}) of a run's
    per-replica curves."""
    by_offset = {}
    for c in run["curves"]:
        by_offset.setdefault(f"{c['offset']:g}", []).append(c)
    keys = sorted(by_offset, key=float)
    return keys, by_offset, offset_colors(keys)


def ci_bounds(cell: dict) -> tuple[float, float]:
    """A cell's 95% interval clipped to an accuracy's range [0, 1] (summaries written before
    `t_interval` clipped it hold the raw t-interval)."""
    return max(cell["ci95_lo"], 0.0), min(cell["ci95_hi"], 1.0)


def ci_text(cell: dict | None) -> str:
    """'mean [lo, hi]' of a length-generalisation cell, '–' for none."""
    if cell is None:
        return "–"
    lo, hi = ci_bounds(cell)
    return f"{cell['mean']:.3f} [{lo:.3f}, {hi:.3f}]"


def draw_lengen_bands(ax, acc: dict, transformer: dict | None) -> None:
    """Mean accuracy vs context size with its 95% CI band per offset ({offset: {size: {mean, ci95_lo,
    ci95_hi}}}), and the Transformer's run (offset 0) dashed in black when given."""
    def band(cells, color, label, ls="-"):
        sizes = sorted(cells, key=int)
        x = [int(n) for n in sizes]
        ax.plot(x, [cells[n]["mean"] for n in sizes], ls, color=color, marker="o", ms=3, label=label)
        ax.fill_between(x, [ci_bounds(cells[n])[0] for n in sizes], [ci_bounds(cells[n])[1] for n in sizes],
                        color=color, alpha=0.2)

    keys = offset_keys(acc)
    colors = offset_colors(keys)
    for o in keys:
        band(acc[o], colors[o], f"Mamba-2, δ = {o}")
    if transformer and transformer.get("lengen_accuracy"):
        (cells,) = transformer["lengen_accuracy"].values()
        band(cells, "k", "Transformer", ls="--")
