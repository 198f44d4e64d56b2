"""Figures of P1 Figure 1, drawn like the paper's panels with the theory overlaid (ssmgate.theory.gating)."""
from __future__ import annotations

import numpy as np

from ssmgate.plotting import pyplot
from ssmgate.theory import gating as theory


def _finish(fig, ax, path, xlabel, ylabel, title, **legend):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, **legend)
    _save(fig, path)


def _save(fig, path):
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=130)
    tmp.replace(path)
    fig.clf()


def plot_a(path, cfg, alpha_r, dm, dr, s):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    grid = np.asarray(s["alpha0"])
    fine = np.logspace(np.log10(grid.min()), np.log10(grid.max()), 60)
    flow = np.array([theory.flow_margins(a, cfg.P, cfg.eps, s["flow_time"]) for a in fine])
    ax.loglog(alpha_r, dm, "o", color="C0", alpha=0.25, ms=3)
    ax.loglog(alpha_r, dr, "o", color="C3", alpha=0.25, ms=3)
    ax.loglog(grid, s["delta_m"], "o-", color="C0", label=r"$\delta_m$ (memorisation), SGD")
    ax.loglog(grid, s["delta_r"], "o-", color="C3", label=r"$\delta_r$ (retrieval), SGD")
    ax.loglog(fine, flow[:, 0], "--", color="navy", lw=1, zorder=3, label=f"gradient flow, t = {s['flow_time']:g}")
    ax.loglog(fine, flow[:, 1], "--", color="darkred", lw=1, zorder=3)
    ax.axvline(s["alpha_star"], color="k", ls=":", lw=1, label=rf"$\alpha^*$ = {s['alpha_star']:.3f}")
    ax.axvline(s["equal_rate_alpha"], color="gray", ls="-.", lw=1, label=f"equal initial rates {s['equal_rate_alpha']:.3f}")
    if s["crossing_alpha0"] is not None:
        ax.axvline(s["crossing_alpha0"], color="C2", lw=1.5, label=f"SGD crossing {s['crossing_alpha0']:.3f}")
    _finish(fig, ax, path, r"initial retention $\alpha_0$", f"margin after {cfg.steps} steps",
            f"Fig 1a: d={cfg.d}, P={cfg.P}, $\\ell$={cfg.ell}, $\\Delta$={cfg.delta}, $\\epsilon$={cfg.eps}")


def plot_b(path, cfg, alpha_r, steps_r, s):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    grid = np.asarray(s["alpha0"])
    ok = steps_r > 0
    ax.loglog(alpha_r[ok], cfg.lr * steps_r[ok], "o", color="C0", alpha=0.3, ms=3)
    means = np.array([np.nan if m is None else m for m in s["escape_steps"]], float)
    ax.loglog(grid, cfg.lr * means, "o-", color="C0", label=r"SGD: lr $\times$ escape step (mean of seeds)")
    fine = np.logspace(np.log10(grid.min()), np.log10(grid.max()), 25)
    ax.loglog(fine, [theory.flow_escape_time(a, cfg.P, cfg.eps) for a in fine], "--", color="C3", label="3-D gradient flow")
    ax.loglog(fine, [theory.reduced_escape_time(a, cfg.eps) for a in fine], ":", color="C2", label="reduced flow (Prop. 4)")
    # Theta-law shape, scaled to meet the reduced flow at the smallest alpha0.
    a_min = grid.min()
    c = theory.reduced_escape_time(a_min, cfg.eps) / theory.theta_law(a_min)
    ax.loglog(fine, c * theory.theta_law(fine), "-", color="gray", lw=0.8,
              label=rf"$\Theta$-law {c:.1f}/($\alpha_0\log(1/\alpha_0)$)")
    _finish(fig, ax, path, r"initial retention $\alpha_0$", "escape time (flow units)",
            f"Fig 1b: d={cfg.d}, P={cfg.P}, $\\ell$={cfg.ell}, $\\Delta$={cfg.delta}, lr={cfg.lr}")


def plot_c(path, cfg, acc, deltas, s):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    taus = np.asarray(cfg.tau, float)
    fine = np.logspace(np.log10(taus.min()), np.log10(taus.max()), 80)
    for j, dl in enumerate(deltas):
        color = f"C{j}"
        ax.semilogx(taus, acc[:, j], "o-", color=color, ms=4, label=rf"$\Delta$={dl}")
        ax.semilogx(fine, [theory.bayes_accuracy(t, dl, cfg.d, cfg.ell, average=True) for t in fine],
                    "--", color=color, lw=0.8)
    ax.axhline(s["no_decay_theory"], color="k", ls=":", lw=1, label=f"no decay {s['no_decay_theory']:.3f}")
    _finish(fig, ax, path, r"gate length $\tau = e^{-\lambda}$ (frozen)", "test accuracy",
            f"Fig 1c: d={cfg.d}, $\\ell$={cfg.ell}; dashed = Bayes (Lemma 6)", ncol=2)


def plot_d(path, cfg, acc, deltas, s):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 4.0))
    taus = np.asarray(cfg.tau, float)
    # The heat-map cells are the run's distance bins (the CSV has every distance).
    edges = [lo for lo, _ in s["bins"]] + [s["bins"][-1][1] + 1]
    mesh = ax.pcolormesh(np.arange(len(taus) + 1), edges, np.asarray(s["binned_accuracy"]).T, cmap="viridis",
                         vmin=0.5, vmax=1.0)
    fig.colorbar(mesh, ax=ax, label="test accuracy")
    x = np.arange(len(taus)) + 0.5
    ax.plot(x, np.maximum(s["bayes_delta_max_80"], 1), "w--", lw=1.2, label=r"Bayes $\Delta_{max}$ (acc $\geq$ 0.8)")
    ax.plot(x, np.maximum(s["delta_max_80"], 1), "wo", ms=4, label=r"ours $\Delta_{max}$ (acc $\geq$ 0.8)")
    tl = np.array([np.nan if v is None else v for v in s["tau_log_d_over_tau"]], float)
    ax.plot(x, tl, "r-", lw=1, label=r"$\tau\log(d/\tau)$")
    ax.set_yscale("log")
    ax.set_xticks(x, [f"{t:g}" for t in taus], fontsize=7)
    _finish(fig, ax, path, r"gate length $\tau$ (frozen)", r"query distance $\Delta$",
            f"Fig 1d: d={cfg.d}, $\\ell$={cfg.ell}", loc="upper left")
