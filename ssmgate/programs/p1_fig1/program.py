"""P1 Figure 1: the simplified SSM on the perturbed-label task, four panels (protocol §2.6).

- a: margins delta_m, delta_r after a few SGD steps vs the initial retention alpha0 (short context).
- b: SGD steps until retrieval overtakes memorisation (delta_r >= delta_m) vs alpha0.
- c: test accuracy vs the frozen gate's length tau for a few query distances (long context).
- d: accuracy over (tau, query distance) as a heat map (long context).

Every grid point x seed is a replica of one vmapped, jitted SGD program (ssmgate.train.sgd_sweep);
replicas with the same seed share their data. The run directory receives the CSV of protocol §0.1,
summary.json, metrics.jsonl (progress of the compiled segments), params.npz and the panel's figure
with the theory of ssmgate.theory.gating overlaid.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.models.simplified_ssm import SimplifiedSSM, logistic_loss, margins
from ssmgate.programs.p1_fig1 import plots as p1_fig1_plots
from ssmgate.config_error import ConfigError  # noqa: F401  (re-exported: p1_fig1.ConfigError)
from ssmgate.tasks import perturbed_labels as tasks
from ssmgate.theory import gating as theory
from ssmgate.train.run_dir import Progress, RunDir
from ssmgate.train.sgd_sweep import UntilState, sgd_run, sgd_until

PANELS = ("a", "b", "c", "d")
CSV_NAME = {"a": "fig1a.csv", "b": "fig1b.csv", "c": "fig1cd.csv", "d": "fig1cd.csv"}


@dataclasses.dataclass(frozen=True)
class ToyGateCfg:
    """One Figure 1 panel (protocol §0.2 ToyGateCfg). Grids: alpha0 for a/b, tau for c/d."""
    panel: str
    d: int
    ell: int
    delta: int | None  # query distance (1 = last token); None = uniform over the context
    lr: float
    batch: int
    steps: int  # a/c/d: SGD steps; b: the step cap before "no escape"
    seeds: int
    seed: int = 0
    P: int = 32  # a/b: dictionary size
    eps: float = 0.1  # a/b: label-flip probability
    alpha0: tuple[float, ...] = ()
    tau: tuple[float, ...] = ()
    train_lambda: bool = False  # c/d: the paper freezes the gate
    n_test: int = 0  # c/d: test contexts; every context answers a query at each evaluated distance
    eval_delta: tuple[int, ...] = ()  # c: distances to evaluate; d: () = every distance 1..ell
    train_query: str = "matched"  # c/d: "matched" (train on the evaluated distances) or "uniform"
    delta_bins: int = 12  # d with matched training: log-spaced distance ranges, one model each
    segment: int = 500  # steps per compiled segment (progress and metrics between segments)

    @property
    def short(self) -> bool:
        return self.panel in ("a", "b")


def _require(ok: bool, flag: str, allowed: str, value) -> None:
    if not ok:
        raise ConfigError(f"--{flag}={value}: expected {allowed}")


def validate(cfg: ToyGateCfg) -> ToyGateCfg:
    _require(cfg.panel in PANELS, "fig1_panel", "one of a, b, c, d", cfg.panel)
    _require(cfg.d >= 1, "fig1_d", "an integer >= 1", cfg.d)
    _require(cfg.ell >= 1, "fig1_ell", "an integer >= 1", cfg.ell)
    if cfg.delta is not None:
        _require(1 <= cfg.delta <= cfg.ell, "fig1_query_distance", f"an integer in [1, ell={cfg.ell}] or 'uniform'",
                 cfg.delta)
    _require(cfg.lr > 0 and math.isfinite(cfg.lr), "lr", "a finite number > 0", cfg.lr)
    _require(cfg.batch >= 1, "batch", "an integer >= 1", cfg.batch)
    _require(cfg.steps >= 1, "steps", "an integer >= 1", cfg.steps)
    _require(cfg.seeds >= 1, "seeds", "an integer >= 1", cfg.seeds)
    _require(cfg.segment >= 1, "fig1_segment", "an integer >= 1", cfg.segment)
    if cfg.short:
        _require(0 < cfg.eps < 0.5, "fig1_eps", "a label-flip probability in (0, 0.5)", cfg.eps)
        _require(cfg.P >= cfg.ell, "fig1_P", f"a dictionary size >= ell={cfg.ell} (contexts hold distinct keys)", cfg.P)
        _require(cfg.delta is not None, "fig1_query_distance", "a fixed query distance for panels a and b", "uniform")
        _require(len(cfg.alpha0) >= 1, "fig1_alpha0", "at least one value", "")
        for a in cfg.alpha0:
            _require(0 < a < 1, "fig1_alpha0", "values in (0, 1)", a)
    else:
        _require(len(cfg.tau) >= 1, "fig1_tau", "at least one value", "")
        for t in cfg.tau:
            _require(t > 0 and math.isfinite(t), "fig1_tau", "finite values > 0", t)
        _require(cfg.n_test >= 1, "fig1_n_test", "an integer >= 1", cfg.n_test)
        for dl in cfg.eval_delta:
            _require(1 <= dl <= cfg.ell, "fig1_eval_distances", f"distances in [1, ell={cfg.ell}]", dl)
        if cfg.panel == "c":
            _require(len(cfg.eval_delta) >= 1, "fig1_eval_distances", "at least one distance for panel c", "")
        _require(cfg.train_query in ("matched", "uniform"), "fig1_train_query", "matched or uniform", cfg.train_query)
        _require(cfg.delta_bins >= 1, "fig1_delta_bins", "an integer >= 1", cfg.delta_bins)
    return cfg


# ---------------------------------------------------------------------------------------------------
# Model and loss shared by the panels

def _model(cfg):
    return SimplifiedSSM(d=cfg.d)


def _loss_fn(model):
    def loss(params, batch):
        """batch: a LabelBatch, or (dictionary keys, IndexedBatch) for the fixed-key task."""
        keys_pd, batch = (None, batch) if isinstance(batch, tasks.LabelBatch) else batch
        return logistic_loss(model.apply({"params": params}, batch, keys_pd), tasks.targets(batch))
    return loss


def _replicas(grid, cfg):
    """Grid-major, seed-minor replica lists: (grid value per replica, seed per replica)."""
    seeds = np.arange(cfg.seed, cfg.seed + cfg.seeds)
    return np.repeat(np.asarray(grid, np.float64), cfg.seeds), np.tile(seeds, len(grid))


def _init_params(cfg, lambda0_r):
    R = len(lambda0_r)
    return {"w": jnp.zeros((R, cfg.d + 1), jnp.float32), "log_rate": jnp.asarray(lambda0_r, jnp.float32)}


def _seed_keys(seeds_r, stream: int):
    """Per-replica PRNG keys of one stream (0: dictionary, 1: training data, 2: test data)."""
    return jax.vmap(lambda s: jax.random.fold_in(jax.random.key(s), stream))(jnp.asarray(seeds_r))


def _raise_if_nonfinite(bad_r, labels, what):
    bad = np.asarray(bad_r)
    if (bad >= 0).any():
        i = int(np.argmax(bad >= 0))
        raise FloatingPointError(f"non-finite loss at step {int(bad[i])} for {what}={labels[i]:g} "
                                 f"(replica {i}); lower --lr or check the grid")


# ---------------------------------------------------------------------------------------------------
# Short context: panels a and b

def _short_setup(cfg):
    """Replicas (alpha0 x seeds), their initial parameters, the per-seed data (dictionary, batch key)
    shared by the seed's alpha0, the batch function and the lift of a per-alpha0 vmapped function
    to all replicas (see `_over_seeds`)."""
    alpha_r, seed_r = _replicas(cfg.alpha0, cfg)
    lambda0_r = [theory.lambda0_from_alpha0(a, cfg.delta) for a in alpha_r]
    seeds = np.arange(cfg.seed, cfg.seed + cfg.seeds)
    dictionaries = jax.vmap(lambda k: tasks.make_fixed_keys(k, cfg.d, cfg.P))(_seed_keys(seeds, 0))
    data = (dictionaries, _seed_keys(seeds, 1))

    def batch_fn(data, k):
        dictionary, key = data
        batch = tasks.sample_fixed(jax.random.fold_in(key, k), dictionary, cfg.batch, cfg.ell, cfg.eps, cfg.delta)
        return dictionary.keys, batch

    lift = functools.partial(_over_seeds, n_cells=len(cfg.alpha0), n_seeds=cfg.seeds)
    return alpha_r, seed_r, _init_params(cfg, lambda0_r), data, batch_fn, lift


def _margin_fn(cfg):
    return lambda params, dictionary: margins(params, dictionary.keys, dictionary.labels, cfg.delta)


def run_panel_a(cfg, out: RunDir) -> dict:
    alpha_r, seed_r, params, data, batch_fn, lift = _short_setup(cfg)
    loss = _loss_fn(_model(cfg))
    margin = _margin_fn(cfg)

    def one(params, data):
        bad = jnp.asarray(-1)
        params, bad, hist = sgd_run(loss, params, bad, batch_fn, data, 0, lr=cfg.lr, steps=cfg.steps)
        return params, bad, hist["loss"], margin(params, data[0])

    t0 = time.perf_counter()
    params, bad, losses, (dm, dr) = jax.jit(lift(jax.vmap(one, in_axes=(0, None)), 1))(params, data)
    _raise_if_nonfinite(bad, alpha_r, "alpha0")
    wall = time.perf_counter() - t0
    out.log_metrics({"panel": "a", "steps": cfg.steps, "replicas": len(alpha_r), "wall_s": wall,
                     "final_loss_mean": float(np.mean(losses[:, -1]))})
    dm, dr = np.asarray(dm, np.float64), np.asarray(dr, np.float64)
    out.write_csv(CSV_NAME["a"], ["alpha0", "seed", "delta_m", "delta_r"], zip(alpha_r, seed_r, dm, dr))
    _save_params(out, params, alpha0=alpha_r, seed=seed_r)

    grid = np.asarray(cfg.alpha0, np.float64)
    mean_dm = dm.reshape(len(grid), cfg.seeds).mean(1)
    mean_dr = dr.reshape(len(grid), cfg.seeds).mean(1)
    t_flow = cfg.lr * cfg.steps
    summary = {
        "crossing_alpha0": _log_crossing(grid, (mean_dr - mean_dm) / (np.abs(mean_dr) + np.abs(mean_dm) + 1e-30)),
        "alpha_star": theory.alpha_star(cfg.P, cfg.eps),
        "equal_rate_alpha": theory.equal_rate_alpha(cfg.P, cfg.eps),
        "flow_crossing_alpha0": _flow_crossing(cfg.P, cfg.eps, t_flow),
        "flow_time": t_flow,
        "alpha0": grid, "delta_m": mean_dm, "delta_r": mean_dr,
        "paper_alpha_star": 0.158, "target_range": [0.15, 0.21], "wall_s": wall,
    }
    summary["crossing_in_target_range"] = (summary["crossing_alpha0"] is not None
                                           and 0.15 <= summary["crossing_alpha0"] <= 0.21)
    p1_fig1_plots.plot_a(out.file("fig1a.png"), cfg, alpha_r, dm, dr, summary)
    return summary


def _flow_crossing(P, eps, t):
    try:
        return theory.flow_crossing_alpha0(P, eps, t)
    except ValueError:  # no crossing inside the solver's bracket for this (P, eps, t)
        return None


def _log_crossing(grid, g):
    """The grid value where g changes sign from < 0 to >= 0, interpolated linearly in log(grid)."""
    order = np.argsort(grid)
    x, y = np.log(grid[order]), g[order]
    for i in range(len(x) - 1):
        if y[i] < 0 <= y[i + 1]:
            return float(np.exp(x[i] + (x[i + 1] - x[i]) * (-y[i]) / (y[i + 1] - y[i])))
    return None


def run_panel_b(cfg, out: RunDir) -> dict:
    alpha_r, seed_r, params, data, batch_fn, lift = _short_setup(cfg)
    loss = _loss_fn(_model(cfg))
    margin = _margin_fn(cfg)

    def one(state, data, start, n):
        def stop(p):
            dm, dr = margin(p, data[0])
            return dr >= dm
        return sgd_until(loss, state, batch_fn, data, start, lr=cfg.lr, steps=n, stop_fn=stop)

    segment_fn = jax.jit(lift(jax.vmap(one, in_axes=(0, None, None, None)), 1))
    R = len(alpha_r)
    state = UntilState(params, -jnp.ones(R, jnp.int32), -jnp.ones(R, jnp.int32))
    progress = Progress("fig1b", cfg.steps)
    done = 0
    while done < cfg.steps:
        n = min(cfg.segment, cfg.steps - done)
        state = segment_fn(state, data, done, n)
        done += n
        escaped = int((np.asarray(state.stopped) > 0).sum())
        progress.update(done, extra=f"escaped {escaped}/{R}")
        out.log_metrics({"panel": "b", "step": done, "escaped": escaped, "replicas": R,
                         "elapsed_s": progress.elapsed()})
        _raise_if_nonfinite(state.bad, alpha_r, "alpha0")
        if escaped == R:
            break
    steps_r = np.asarray(state.stopped)
    T_full = {a: theory.flow_escape_time(a, cfg.P, cfg.eps) for a in cfg.alpha0}
    T_reduced = {a: theory.reduced_escape_time(a, cfg.eps) for a in cfg.alpha0}
    out.write_csv(CSV_NAME["b"], ["alpha0", "seed", "escape_step", "ode_T_full", "ode_T_reduced"],
                  [(a, s, (k if k > 0 else None), T_full[a], T_reduced[a]) for a, s, k in zip(alpha_r, seed_r, steps_r)])
    _save_params(out, state.params, alpha0=alpha_r, seed=seed_r, escape_step=steps_r)

    grid = list(cfg.alpha0)
    per_seed = steps_r.reshape(len(grid), cfg.seeds)
    mean_steps = [float(row.mean()) if (row > 0).all() else None for row in per_seed]
    ratios = [(cfg.lr * m / T_full[a]) if (m is not None and T_full[a] > 0) else None
              for a, m in zip(grid, mean_steps)]
    by_alpha = sorted(zip(grid, mean_steps), reverse=True)  # decreasing alpha0
    seq = [m for _, m in by_alpha]
    increasing = all(m is not None for m in seq) and all(b > a for a, b in zip(seq, seq[1:]))
    summary = {
        "alpha0": grid, "escape_steps": mean_steps, "escape_steps_per_seed": per_seed,
        "lr": cfg.lr, "step_cap": cfg.steps,
        "flow_escape_time": [T_full[a] for a in grid], "reduced_escape_time": [T_reduced[a] for a in grid],
        "sgd_over_flow": ratios,
        "sgd_over_flow_within_40pct": [r is not None and 0.6 <= r <= 1.4 for r in ratios],
        "escape_steps_strictly_increasing": increasing,
        "theta_law": [theory.theta_law(a) for a in grid],
        "wall_s": progress.elapsed(),
    }
    p1_fig1_plots.plot_b(out.file("fig1b.png"), cfg, alpha_r, steps_r, summary)
    return summary


# ---------------------------------------------------------------------------------------------------
# Long context: panels c and d

def _eval_deltas(cfg):
    return tuple(cfg.eval_delta) if cfg.eval_delta else tuple(range(1, cfg.ell + 1))


def delta_bins(ell: int, n_bins: int) -> list[tuple[int, int]]:
    """Up to n_bins contiguous, log-spaced distance ranges [lo, hi] covering 1..ell."""
    edges = np.unique(np.round(np.logspace(0, np.log10(ell + 1), n_bins + 1)).astype(int))
    return [(int(lo), int(hi) - 1) for lo, hi in zip(edges[:-1], edges[1:])]


def _cells(cfg):
    """Training cells (tau, lo, hi): the query distance of a cell's training batches is uniform in
    [lo, hi]. 'uniform': one cell per tau over 1..ell (protocol [REC]); 'matched': one cell per tau and
    evaluated distance (panel c) or distance bin (panel d), so each accuracy is measured on the
    distances its model was trained on."""
    if cfg.train_query == "uniform":
        ranges = [(1, cfg.ell)]
    elif cfg.panel == "c":
        ranges = [(dl, dl) for dl in cfg.eval_delta]
    else:
        ranges = delta_bins(cfg.ell, cfg.delta_bins)
    return [(t, lo, hi) for t in cfg.tau for lo, hi in ranges]


def run_panel_long(cfg, out: RunDir) -> dict:
    cells = _cells(cfg)
    cell_r, seed_r = _replicas(range(len(cells)), cfg)
    cell_r = cell_r.astype(int)
    tau_r = np.array([cells[c][0] for c in cell_r])
    lo_r = jnp.asarray([cells[c][1] for c in cell_r], jnp.int32)
    hi_r = jnp.asarray([cells[c][2] for c in cell_r], jnp.int32)
    params = _init_params(cfg, np.log(1.0 / tau_r))
    model = _model(cfg)
    loss = _loss_fn(model)
    trainable = {"log_rate": cfg.train_lambda}
    seeds = np.arange(cfg.seed, cfg.seed + cfg.seeds)
    train_keys = _seed_keys(seeds, 1)
    lift = functools.partial(_over_seeds, n_cells=len(cells), n_seeds=cfg.seeds)

    def batch_fn(data, k):
        # The contexts depend on the seed's key only (shared by its cells); the query distance is
        # drawn from one shared uniform and mapped into the cell's range.
        key, lo, hi = data
        k_ctx, k_q = jax.random.split(jax.random.fold_in(key, k))
        ctx = tasks.sample_fresh(k_ctx, cfg.batch, cfg.d, cfg.ell, 1)
        u = jax.random.uniform(k_q, (cfg.batch,))
        distance = jnp.minimum(lo + jnp.floor(u * (hi - lo + 1)).astype(jnp.int32), hi)
        return ctx._replace(query_pos=cfg.ell - distance)

    def sweep(params, bad, lo, hi, start, steps):
        def one(p, b, lo, hi, key, k0):
            return sgd_run(loss, p, b, batch_fn, (key, lo, hi), k0, lr=cfg.lr, steps=steps, trainable=trainable)
        return lift(jax.vmap(one, in_axes=(0, 0, 0, 0, None, None)), 4)(params, bad, lo, hi, train_keys, start)

    sweep_jit = jax.jit(sweep, static_argnums=(5,))
    R = len(cell_r)
    bad = -jnp.ones(R, jnp.int32)
    progress = Progress(f"fig1{cfg.panel}", cfg.steps)
    done = 0
    while done < cfg.steps:
        n = min(cfg.segment, cfg.steps - done)
        params, bad, hist = sweep_jit(params, bad, lo_r, hi_r, done, n)
        done += n
        mean_loss = float(np.mean(np.asarray(hist["loss"])[:, -1]))
        progress.update(done, extra=f"loss {mean_loss:.4f} (mean of {R} replicas)")
        out.log_metrics({"panel": cfg.panel, "step": done, "loss_mean": mean_loss, "elapsed_s": progress.elapsed()})
        _raise_if_nonfinite(bad, tau_r, "tau")
    train_s = progress.elapsed()

    deltas = _eval_deltas(cfg)
    acc_rd, n_test = _test_accuracy(cfg, model, params, seeds, deltas, lift)
    # Each (tau, Delta) cell is read from the replicas trained on that distance.
    acc = np.full((len(cfg.tau), len(deltas)), np.nan)
    rows = []
    bayes = np.array([[theory.bayes_accuracy(t, dl, cfg.d, cfg.ell, average=True) for dl in deltas] for t in cfg.tau])
    for i, t in enumerate(cfg.tau):
        for j, dl in enumerate(deltas):
            mine = [r for r in range(R) if tau_r[r] == t and cells[cell_r[r]][1] <= dl <= cells[cell_r[r]][2]]
            acc[i, j] = np.mean(acc_rd[mine, j])
            rows += [(cfg.panel, t, seed_r[r], dl, acc_rd[r, j], bayes[i, j], n_test) for r in mine]
    out.write_csv(CSV_NAME[cfg.panel], ["panel", "tau", "seed", "Delta", "acc", "bayes_acc", "n_test"], rows)
    _save_params(out, params, tau=tau_r, seed=seed_r, train_lo=lo_r, train_hi=hi_r)

    w = np.asarray(params["w"])
    summary = {
        "tau": list(cfg.tau), "Delta": list(deltas), "accuracy": acc, "bayes_accuracy": bayes,
        "max_abs_diff_to_bayes": float(np.max(np.abs(acc - bayes))),
        "n_test": n_test, "steps": cfg.steps, "train_lambda": cfg.train_lambda, "train_query": cfg.train_query,
        "wx_norm_over_v_max": float(np.max(np.linalg.norm(w[:, :-1], axis=1) / np.abs(w[:, -1]))),
        "train_s": train_s, "wall_s": progress.elapsed(),
    }
    if cfg.panel == "c":
        summary.update(_summary_c(cfg, acc, deltas))
        p1_fig1_plots.plot_c(out.file("fig1c.png"), cfg, acc, deltas, summary)
    else:
        summary.update(_summary_d(cfg, acc, bayes, deltas))  # its cells are distance bins
        p1_fig1_plots.plot_d(out.file("fig1d.png"), cfg, acc, deltas, summary)
    return summary


def _over_seeds(per_cell_fn, n_replicated: int, *, n_cells: int, n_seeds: int):
    """Lifts fn(*replicated, key, *shared), vmapped over cells with one shared key, to all replicas.

    The first n_replicated arguments carry the flat replica axis, laid out cell-major and seed-minor
    (r = i_cell * seeds + i_seed); the next is the per-seed key array (seeds,); outputs come back flat.
    """
    grid = lambda a: a.reshape((n_cells, n_seeds) + a.shape[1:])
    flat = lambda a: a.reshape((n_cells * n_seeds,) + a.shape[2:])

    def lifted(*args):
        replicated, keys, shared = args[:n_replicated], args[n_replicated], args[n_replicated + 1:]
        in_axes = (1,) * n_replicated + (0,) + (None,) * len(shared)
        out = jax.vmap(per_cell_fn, in_axes=in_axes, out_axes=1)(*jax.tree.map(grid, replicated), keys, *shared)
        return jax.tree.map(flat, out)

    return lifted


def _test_accuracy(cfg, model, params, seeds, deltas, lift):
    """Accuracy (replica, Delta) on n_test fresh contexts per seed, shared by the seed's replicas.
    Each context is queried at every evaluated distance: its state does not depend on the query."""
    positions = jnp.asarray([cfg.ell - dl for dl in deltas], jnp.int32)
    per_chunk = max(1, min(cfg.n_test, (1 << 21) // (cfg.ell * cfg.d)))
    n_chunks = -(-cfg.n_test // per_chunk)
    test_keys = _seed_keys(seeds, 2)

    def correct(params_c, key, i):
        """Hits (cells, Delta) of one seed's cells."""
        ctx = tasks.sample_fresh(jax.random.fold_in(key, i), per_chunk, cfg.d, cfg.ell, None)
        pos = jnp.broadcast_to(positions, (per_chunk, len(deltas)))
        target = jnp.take_along_axis(ctx.labels, pos, axis=1)

        def one(p):
            logits = model.apply({"params": p}, ctx.keys, ctx.labels, pos, method="logits_at")
            return jnp.sum(logits * target > 0, axis=0)

        return jax.vmap(one)(params_c)

    count = jax.jit(lift(correct, 1))
    hits = np.zeros((len(jax.tree.leaves(params)[0]), len(deltas)))
    progress = Progress(f"fig1{cfg.panel} test", n_chunks)
    for c in range(n_chunks):
        hits += np.asarray(count(params, test_keys, c))
        if (c + 1) % max(1, n_chunks // 4) == 0 or c + 1 == n_chunks:
            progress.update(c + 1, what="test chunk")
    n = n_chunks * per_chunk
    return hits / n, n


def _summary_c(cfg, acc, deltas):
    taus = np.asarray(cfg.tau)
    big = int(np.argmax(taus))
    rise_fall = {}
    for j, dl in enumerate(deltas):
        if dl >= 16:
            col = acc[:, j]
            k = int(np.argmax(col))
            rise_fall[str(dl)] = bool(0 < k < len(col) - 1 and col[k] > col[0] + 0.01 and col[k] > col[-1] + 0.01)
    return {
        "no_decay_accuracy": float(acc[big].mean()), "no_decay_tau": float(taus[big]),
        "no_decay_theory": theory.no_decay_accuracy(cfg.d, cfg.ell, average=True),
        "paper_no_decay": 0.638,
        "rise_then_fall": rise_fall,
    }


def _summary_d(cfg, acc, bayes, deltas):
    """Panel d's heat-map cells are (tau, distance bin): accuracy and Bayes accuracy averaged over the
    distances of a bin (each has n_test examples). The per-distance gap is reported too."""
    bins = delta_bins(cfg.ell, cfg.delta_bins)
    deltas = np.asarray(deltas)
    cols = [np.flatnonzero((deltas >= lo) & (deltas <= hi)) for lo, hi in bins]
    binned = np.array([[row[c].mean() for c in cols] for row in acc])
    binned_bayes = np.array([[row[c].mean() for c in cols] for row in bayes])
    out = {
        "bins": bins, "binned_accuracy": binned, "binned_bayes_accuracy": binned_bayes,
        "max_abs_diff_to_bayes": float(np.max(np.abs(binned - binned_bayes))),
        "max_abs_diff_to_bayes_per_distance": float(np.max(np.abs(acc - bayes))),
    }
    for level in (0.8, 0.9):
        ours = []
        for row in acc:  # per distance
            # Largest distance before the first one below the level (noise-robust; Bayes is monotone).
            below = [dl for dl, a in zip(deltas, row) if a < level]
            ours.append((min(below) - 1) if below else max(deltas))
        out[f"delta_max_{int(level * 100)}"] = ours
        out[f"bayes_delta_max_{int(level * 100)}"] = [theory.delta_max(t, cfg.d, cfg.ell, level, average=True)
                                                       for t in cfg.tau]
    out["tau_log_d_over_tau"] = [theory.tau_log_d_over_tau(t, cfg.d) if t < cfg.d else None for t in cfg.tau]
    return out


# ---------------------------------------------------------------------------------------------------

def _save_params(out: RunDir, params, **columns):
    """Final parameters of every replica with their grid coordinates (npz: small, no framework needed)."""
    arrays = {f"params/{k}": np.asarray(v) for k, v in params.items()}
    arrays.update({k: np.asarray(v) for k, v in columns.items()})
    tmp = out.file("params.tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(out.file("params.npz"))


def run(cfg: ToyGateCfg, run_dir) -> dict:
    """Runs one panel into run_dir; returns (and writes) its summary."""
    validate(cfg)
    out = RunDir.of(run_dir)
    out.write_json("config.json", dataclasses.asdict(cfg))
    if cfg.panel == "a":
        summary = run_panel_a(cfg, out)
    elif cfg.panel == "b":
        summary = run_panel_b(cfg, out)
    else:
        summary = run_panel_long(cfg, out)
    summary = {"panel": cfg.panel, **summary}
    out.write_json("summary.json", summary)
    return summary
