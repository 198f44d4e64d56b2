"""P2's oscillator theory as a run (protocol §1.5-1.8; P2 App. A Table 8, App. C): nothing trains.

The run evaluates the closed forms of ssmgate.theory.oscillation where P2 states a fact that numbers
can test, and writes what it measured to summary.json:

- `table8`: per linear-attention family (P2 Table 8), over random draws of its frozen transition,
  how often its eigenvalues are complex, how often that agrees with the table's "complex iff"
  column, the range of the table's damping ratios (complex pairs and real rates apart) and the
  largest gap between the table's formulas and the ratios read off the eigenvalues (protocol §1.7,
  check C5 of protocol §9);
- `complex_kda_boundary`: the eigenvalue gap on the stated boundary |cos theta| = 2 sqrt(-alpha) /
  (1 - alpha), and whether the type changes across it;
- `closed_form`: exp(dt A(kappa)) in closed form against scipy's expm on the grid of check C3
  (protocol §1.5, P2 App. C.1);
- `modal`: the modal-persistence facts of protocol §1.6 (P2 App. C.2, check C4);
- `gain`: the steady-state gain of a rotating accumulator, closed form and simulation (protocol
  §1.8, P2 App. C.3, check C4).

report.py turns these numbers into the report's tables and checks.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import time

import numpy as np
from scipy import linalg

from ssmgate.config_error import ConfigError
from ssmgate.theory import oscillation as o

# Check C3's grid (protocol §9): dt, a, kappa.
C3_DT, C3_A, C3_KAPPA = (0.01, 0.7, 5.0), (0.1, 1.0, 3.0), (-4.0, -0.3, 0.0, 0.2, 0.81)
BOUNDARY_ALPHAS = (-0.9, -0.5, -0.1, -0.01)  # complex KDA: signed gates at which the boundary is probed
BOUNDARY_NUDGE = 1e-4  # theta steps into and out of the complex region
CRITICAL_OMEGA0, CRITICAL_T = (0.5, 1.0, 2.0), 1e3
OVERDAMPED_A, OVERDAMPED_T = (1.05, 1.5, 3.0), 60.0  # omega0 = 1
UNDERDAMPED_A, UNDERDAMPED_T = (0.1, 0.5, 0.9), 50.0  # omega0 = 1
FASTEST_OMEGA0, FASTEST_GRID = 1.3, (0.05, 5.0, 991)  # asymptotic decay rate over a in linspace(*grid)
GAIN_RHO = 0.99
GAIN_GRID_RHO = (0.5, 0.9, 0.99)
GAIN_GRID_THETA = tuple(np.linspace(0.0, math.pi, 13)[1:])  # theta in (0, pi]


@dataclasses.dataclass(frozen=True)
class TheoryCfg:
    draws: int = 1000       # random draws per Table 8 family (check C5: 1,000)
    key_dim: int = 4        # key dimension d of the d x d families
    gain_steps: int = 5000  # steps of the simulated accumulator (check C4: 5,000)
    seed: int = 0
    figure: bool = True     # draw the spectra of the families (spectra.png)

    def validate(self) -> "TheoryCfg":
        if self.draws < 1:
            raise ConfigError(f"--theory_draws={self.draws}: expected an integer >= 1")
        if self.key_dim < 2:
            raise ConfigError(f"--theory_key_dim={self.key_dim}: expected an integer >= 2")
        if self.gain_steps < 1:
            raise ConfigError(f"--theory_gain_steps={self.gain_steps}: expected an integer >= 1")
        return self


def _extreme(values, fn):
    values = [v for v in values if np.isfinite(v)]
    return float(fn(values)) if values else None


def table8(cfg: TheoryCfg) -> dict:
    """Per family: draws, complex shares (stated and found), agreement, damping ratios, formula gaps."""
    out = {}
    for i, model in enumerate(o.MODELS):
        draws = o.random_draws(model, cfg.draws, np.random.default_rng([cfg.seed, i]), d=cfg.key_dim)
        stated, found, agree = 0, 0, 0
        complex_zeta, real_zeta, real_inf, real_nan = [], [], 0, 0
        complex_gap, real_gap = [], []
        for params in draws:
            lam = o.spectrum(model, params)
            is_stated = o.stated_complex(model, params)
            is_complex = o.eigen_type(lam) == "complex"
            stated += is_stated
            found += is_complex
            agree += is_stated == is_complex
            table = o.table_damping_ratios(model, params)
            spectral = o.spectral_damping_ratios(model, lam)
            if table.shape != spectral.shape or not np.array_equal(np.isnan(table), np.isnan(spectral)):
                (complex_gap if is_complex else real_gap).append(math.inf)
                continue
            ok = ~np.isnan(table)
            if is_complex:
                complex_zeta += table.tolist()
                complex_gap += np.abs(table[ok] - spectral[ok]).tolist()
            else:
                real_nan += int(np.sum(~ok))
                real_inf += int(np.sum(np.isinf(table)))
                real_zeta += table[ok & np.isfinite(table)].tolist()
                with np.errstate(divide="ignore"):  # 1/zeta in [0, 1]: well-conditioned when a rate is tiny
                    real_gap += np.abs(1.0 / table[ok] - 1.0 / spectral[ok]).tolist()
        out[model] = {
            "draws": len(draws), "stated_complex": stated, "found_complex": found, "type_agree": agree,
            "complex_zeta_min": _extreme(complex_zeta, min), "complex_zeta_max": _extreme(complex_zeta, max),
            "real_zeta_min": _extreme(real_zeta, min), "real_zeta_max": _extreme(real_zeta, max),
            "real_zeta_values": len(real_zeta), "real_zeta_inf": real_inf, "real_zeta_nan": real_nan,
            "max_zeta_gap_complex": max(complex_gap, default=0.0),
            "max_inv_zeta_gap_real": max(real_gap, default=0.0),
        }
    return out


def complex_kda_boundary() -> dict:
    """On |cos theta| = 2 sqrt(-alpha)/(1 - alpha): the largest eigenvalue gap, and whether stepping
    into / out of the complex region gives complex / real eigenvalues and the stated condition agrees."""
    gaps, flips = [], True
    for alpha in BOUNDARY_ALPHAS:
        edge = math.acos(float(o.complex_kda_boundary_cos(alpha)))
        for theta in (edge, math.pi - edge):
            lam = np.linalg.eigvals(o.complex_kda_block(alpha, theta))
            gaps.append(float(abs(lam[0] - lam[1])))
            inward = 1.0 if theta < math.pi / 2 else -1.0  # |cos| falls towards pi/2: into the complex region
            for step, kind in ((inward * BOUNDARY_NUDGE, "complex"), (-inward * BOUNDARY_NUDGE, "real")):
                found = o.eigen_type(np.linalg.eigvals(o.complex_kda_block(alpha, theta + step)))
                stated = "complex" if o.complex_kda_is_complex(alpha, theta + step) else "real"
                flips &= found == kind and stated == kind
    return {"alphas": list(BOUNDARY_ALPHAS), "nudge": BOUNDARY_NUDGE, "max_eigenvalue_gap": max(gaps),
            "type_changes_across": bool(flips)}


def closed_form() -> dict:
    """Largest relative gap (max-norm) of the closed-form exp(dt A(kappa)) to scipy's expm on check C3's grid."""
    errs = []
    for dt, a, kappa in itertools.product(C3_DT, C3_A, C3_KAPPA):
        ref = linalg.expm(dt * o.continuous_generator(a, kappa))
        errs.append(float(np.max(np.abs(o.discrete_transition(dt, a, kappa) - ref)) / np.max(np.abs(ref))))
    return {"grid_points": len(errs), "max_rel_err_vs_expm": max(errs)}


def modal() -> dict:
    """The modal-persistence facts of protocol §1.6 as numbers."""
    critical = []
    for w in CRITICAL_OMEGA0:
        n = o.critical_limit(w)
        far = o.critical_scaled_propagator(w, CRITICAL_T)
        critical.append(float(np.linalg.norm(far - n, 2) / np.linalg.norm(n, 2)))
    over_cos = []
    for a in OVERDAMPED_A:
        _, fast = o.overdamped_rates(1.0, a)
        z0 = np.array([1.0, -fast]) / math.hypot(1.0, fast) + 0.01 * o.slow_eigenvector(1.0, a)  # near the fast mode
        cos = o.overdamped_direction_cosine(1.0, a, z0, [0.0, OVERDAMPED_T])
        over_cos.append([float(cos[0]), float(cos[-1])])
    rng = np.random.default_rng(3)
    z0, z1 = rng.standard_normal(2), rng.standard_normal(2)
    times = np.linspace(0.0, UNDERDAMPED_T, 101)
    drift, companion = [], []
    for a in UNDERDAMPED_A:
        ang = o.underdamped_angles(1.0, a, z0, z1, times)
        drift.append(float(np.max(np.abs(ang - ang[0]))))
        comp = o.underdamped_angles(1.0, a, z0, z1, times, coordinates="companion")
        companion.append(float(np.max(np.abs(comp - comp[0]))))
    grid = np.linspace(*FASTEST_GRID)
    rates = o.asymptotic_decay_rate(FASTEST_OMEGA0, grid)
    return {
        "critical": {"omega0": list(CRITICAL_OMEGA0), "t": CRITICAL_T, "rel_err_to_N": critical},
        "overdamped": {"omega0": 1.0, "a": list(OVERDAMPED_A), "t_end": OVERDAMPED_T, "cos_start_end": over_cos},
        "underdamped": {"omega0": 1.0, "a": list(UNDERDAMPED_A), "t_end": UNDERDAMPED_T,
                        "angle_drift_rotation": drift, "angle_drift_companion": companion},
        "fastest_decay": {"omega0": FASTEST_OMEGA0, "argmax_a": float(grid[np.argmax(rates)]),
                          "grid_step": float(grid[1] - grid[0]), "max_rate": float(np.max(rates))},
    }


def gain(cfg: TheoryCfg) -> dict:
    """Steady-state gains |z_inf| of z_t = rho e^{i theta} z_{t-1} + 1 (closed form) and |z_steps| (simulated)."""
    angles = (("0", 0.0), ("pi/2", math.pi / 2))
    closed = {k: float(o.steady_state_gain(GAIN_RHO, th)) for k, th in angles}
    simulated = {k: float(o.simulated_gain(GAIN_RHO, th, cfg.gain_steps)) for k, th in angles}
    rho = np.array(GAIN_GRID_RHO)[:, None]
    theta = np.array(GAIN_GRID_THETA)[None, :]
    sim_rot = o.simulated_gain(rho, theta, cfg.gain_steps)
    sim_none = o.simulated_gain(rho[:, 0], 0.0, cfg.gain_steps)
    return {"rho": GAIN_RHO, "steps": cfg.gain_steps, "closed_form": closed, "simulated": simulated,
            "grid": {"rho": list(GAIN_GRID_RHO), "theta": [float(t) for t in GAIN_GRID_THETA],
                     "max_rotated_over_unrotated": float(np.max(sim_rot / sim_none[:, None]))}}


def run(cfg: TheoryCfg, run_dir) -> dict:
    from ssmgate.train.run_dir import RunDir  # imports JAX: only when a run writes its folder

    rd = RunDir.of(run_dir)
    start = time.perf_counter()
    summary = {"config": dataclasses.asdict(cfg), "table8": table8(cfg), "complex_kda_boundary": complex_kda_boundary(),
               "closed_form": closed_form(), "modal": modal(), "gain": gain(cfg)}
    summary["compute_s"] = time.perf_counter() - start
    if cfg.figure:
        from ssmgate.theory.oscillation_plots import plot_spectra
        plot_spectra(rd.file("spectra.png"), n=min(cfg.draws, 300), seed=cfg.seed)
    rd.write_json("summary.json", summary)
    return summary
