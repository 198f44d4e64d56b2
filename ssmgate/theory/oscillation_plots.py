"""Figure of protocol §1.7 (P2 App. A, Table 8): frozen-transition spectra and damping ratios of six families."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ssmgate.plotting import pyplot
from ssmgate.theory import oscillation as theory

_LABELS = {
    "linear_attention": "Linear attention",
    "deltanet": "DeltaNet",
    "gated_deltanet": "Gated DeltaNet",
    "kda": "KDA",
    "complex_kda": "Complex KDA",
    "momentum_deltanet": "Momentum DeltaNet",
}
_NO_ZETA = {  # families whose Table 8 damping column is not a number
    "linear_attention": "no damping: pure\naccumulation (all " r"$\lambda = 1$)",
    "deltanet": "no restoring term\n" r"($\omega_0 = 0$): $\zeta = \infty$",
}
_ZETA_CAP = 1e3  # larger ratios (a rate near 0) are drawn at the cap


def _sample(n, seed):
    """Per family: (all eigenvalues, all table damping ratios) of n random draws."""
    out = {}
    for i, model in enumerate(theory.MODELS):
        draws = theory.random_draws(model, n, np.random.default_rng([seed, i]))
        eigs = np.concatenate([theory.spectrum(model, p).astype(complex) for p in draws])
        zetas = np.concatenate([theory.table_damping_ratios(model, p) for p in draws])
        out[model] = (eigs, zetas)
    return out


def _draw_spectrum(ax, eigs, color, title):
    circle = np.linspace(0.0, 2.0 * np.pi, 400)
    ax.plot(np.cos(circle), np.sin(circle), color="k", lw=0.7)
    ax.axhline(0.0, color="gray", lw=0.4)
    ax.axvline(0.0, color="gray", lw=0.4)
    ax.scatter(eigs.real, eigs.imag, s=5, alpha=0.35, color=color, edgecolors="none")
    complex_share = np.mean(np.abs(eigs.imag) > 1e-12)
    ax.set_title(f"{title}\n{100 * complex_share:.0f}% of eigenvalues complex", fontsize=8)
    ax.set_aspect("equal")
    ax.set_xlim(-1.15, 1.15)
    ax.set_ylim(-1.15, 1.15)
    ax.tick_params(labelsize=6)


def _draw_damping(ax, samples, rng):
    finite = np.concatenate([z[np.isfinite(z)] for _, z in samples.values()])
    low = 10.0 ** np.floor(np.log10(max(finite.min(), 1e-4)))
    ax.axvspan(low, 1.0, color="C0", alpha=0.06)
    ax.axvline(1.0, color="k", ls="--", lw=0.8, label=r"critical, $\zeta = 1$")
    rows, labels = list(samples), []
    for row, model in enumerate(rows):
        labels.append(_LABELS[model])
        zetas = samples[model][1]
        if model in _NO_ZETA:
            ax.text(1.4, row, _NO_ZETA[model], va="center", fontsize=7, color=f"C{row}")
            continue
        shown = zetas[np.isfinite(zetas)]
        jitter = rng.uniform(-0.25, 0.25, shown.size)
        ax.scatter(np.minimum(shown, _ZETA_CAP), row + jitter, s=5, alpha=0.4, color=f"C{row}", edgecolors="none")
        dropped = zetas.size - shown.size
        if dropped:  # negative real eigenvalues: no second-order damped analogue
            labels[-1] += f"\n({dropped} draws: real " r"$\lambda < 0$)"
    ax.set_xscale("log")
    ax.set_xlim(low, 3 * _ZETA_CAP)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set_xlabel(r"damping ratio $\zeta$ (Table 8 formulas; values above $10^3$ drawn at $10^3$)")
    ax.text(np.sqrt(low), len(rows) - 0.5, "underdamped", fontsize=7, ha="center", va="center", color="C0")
    ax.set_title("Damping ratios: " r"$\zeta<1$ complex pair, $\zeta\geq1$ two real rates" "\n(KDA: every pair of rates)",
                 fontsize=9)
    ax.legend(fontsize=7, loc="lower right")


def plot_spectra(path, n=300, seed=0):
    """Writes the figure of n random draws per Table 8 family to `path` (PNG); returns the Path.

    Left: each family's eigenvalues in the complex plane with the unit circle. Right: each family's damping
    ratios as a jittered strip on a log axis (complex pairs below 1, real-rate pairs at or above 1;
    linear attention and DeltaNet have no finite ratio and are labelled instead).
    """
    path = Path(path)
    if int(n) < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    plt = pyplot()
    samples = _sample(int(n), int(seed))
    fig = plt.figure(figsize=(14.0, 5.6), layout="constrained")
    grid = fig.add_gridspec(2, 5, width_ratios=[1, 1, 1, 0.1, 2.6])
    for i, (model, (eigs, _)) in enumerate(samples.items()):
        ax = fig.add_subplot(grid[i // 3, i % 3])
        _draw_spectrum(ax, eigs, f"C{i}", _LABELS[model])
        if i % 3 == 0:
            ax.set_ylabel(r"Im $\lambda$", fontsize=8)
        if i // 3 == 1:
            ax.set_xlabel(r"Re $\lambda$", fontsize=8)
    _draw_damping(fig.add_subplot(grid[:, 4]), samples, np.random.default_rng(seed))
    fig.suptitle(f"Frozen-transition spectra of linear-attention families (protocol §1.7, P2 Table 8): "
                 f"{n} random draws each, key dim 4 (unit circle drawn)", fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=130)
    plt.close(fig)
    tmp.replace(path)
    return path
