"""What a gate-offset sweep checks and reports, shared by the programs that sweep offsets: the
offsets' checks, the JSON key of an offset, a seed interval, a least-squares fit, the gate statistics
before and after training, the step at which an early-stopped sweep ended (so that a rerun does not
train past it), the eval curves from metrics.jsonl and the length-generalisation evaluation."""
from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from ssmgate.config_error import ConfigError
from ssmgate.models import gates
from ssmgate.models.config import ModelCfg
from ssmgate.train import lm_runs, sweep
from ssmgate.train.checkpoint import CheckpointError, Checkpointer
from ssmgate.train.run_dir import RunDir, say


def offset_key(offset: float) -> str:
    """The JSON key of an offset: '-6', '0', '0.5'."""
    return f"{float(offset):g}"


def linear_fit(x, y) -> dict:
    """Least squares y = slope x + intercept: {slope, intercept, r2, n}; slope/intercept None with < 2
    points or one distinct x, r2 None with < 3 points or zero variance of x or y."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    out = {"slope": None, "intercept": None, "r2": None, "n": int(x.size)}
    if x.size < 2 or np.ptp(x) == 0:
        return out
    slope, intercept = np.polyfit(x, y, 1)
    out.update(slope=float(slope), intercept=float(intercept))
    ss_tot = float(((y - y.mean()) ** 2).sum())
    if x.size >= 3 and ss_tot > 0:
        ss_res = float(((y - (slope * x + intercept)) ** 2).sum())
        out["r2"] = 1.0 - ss_res / ss_tot
    return out


def t_interval(values, bounds=(0.0, 1.0)) -> dict:
    """{mean, ci95_lo, ci95_hi, per_seed}: mean +- t_{0.975, s-1} sd / sqrt(s) over s seeds (protocol §0.2),
    clipped to `bounds` (an accuracy's range: with 2 seeds t = 12.7 reaches far outside it); with one
    seed the interval is the mean itself."""
    v = np.asarray(values, np.float64)
    mean = float(v.mean())
    half = 0.0
    if v.size > 1:
        from scipy import stats
        half = float(stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
    lo, hi = max(mean - half, bounds[0]), min(mean + half, bounds[1])
    return {"mean": mean, "ci95_lo": lo, "ci95_hi": hi, "per_seed": [float(a) for a in v]}


def stopped_at_checkpoint(rd: RunDir, abstract, fingerprint: str, steps: int) -> Optional[int]:
    """The step of the latest checkpoint when every replica had stopped there before `steps`
    (a finished early-stopped run): resuming must not train past it."""
    path = rd.file("checkpoints")
    if not path.exists():
        return None
    ckpt = Checkpointer(path)
    try:
        latest = ckpt.latest_step()
        if latest is None or latest >= steps:
            return None
        try:
            step, state, _ = ckpt.restore(abstract, expect_fingerprint=fingerprint)
        except CheckpointError:
            return None  # the loop reports it
        return step if sweep.all_stopped(state) else None
    finally:
        ckpt.close()


def gate_stats(run_built, model_cfg: ModelCfg, replicas, final_params) -> dict:
    """Median tau over the heads of all layers (protocol §2.5) at initialisation and after training, and the
    median |delta alpha|, per offset and seed (Mamba-2 only)."""
    if model_cfg.block != "mamba2":
        return {}
    init = jax.jit(lm_runs.init_params_fn(run_built.model, model_cfg))
    tau, change = {}, {}
    for r, rep in enumerate(replicas):
        key_init, _ = jax.random.split(jax.random.PRNGKey(rep.seed))  # as sweep.init_sweep
        before = jax.device_get(init(key_init, jnp.float32(rep.offset)))
        after = jax.device_get(jax.tree.map(lambda a: a[r], final_params))
        entry = tau.setdefault(offset_key(rep.offset), {"init": [], "final": []})
        entry["init"].append(gates.median_tau(before))
        entry["final"].append(gates.median_tau(after))
        change.setdefault(offset_key(rep.offset), []).append(gates.median_alpha_change(before, after))
    return {"median_tau": tau, "median_alpha_change": change}


def check_offsets(offsets, block: str) -> None:
    """A sweep's gate offsets: at least one, distinct, finite, and only 0 for a model without Mamba-2's A_log."""
    text = ",".join(f"{o:g}" for o in offsets)
    if not offsets:
        raise ConfigError("--gate_offset: expected at least one gate offset")
    if len(set(offsets)) != len(offsets):
        raise ConfigError(f"--gate_offset={text}: expected distinct offsets")
    if not all(math.isfinite(o) for o in offsets):
        raise ConfigError(f"--gate_offset={text}: expected finite offsets")
    if block != "mamba2" and any(o != 0.0 for o in offsets):
        raise ConfigError(f"--gate_offset={text}: gate offsets act on Mamba-2's A_log; --block={block} has none "
                          "(expected --gate_offset=0)")


def length_generalisation(sizes, make_set, evaluate, params, replicas, offsets, metric: str, tag: str,
                          keep: Optional[tuple] = None) -> dict:
    """Every replica of a sweep at each size on its fixed set `make_set(size)`, one replica at a time (the
    longest sets are the largest arrays of a run): {"lengen_accuracy" {offset: {size: t_interval over
    seeds of `metric`}}, "lengen_examples" {size: examples}, "lengen_detail" {size: [per replica, the
    metrics `keep` (default all)]}}. evaluate(params, data) -> metrics, jitted here."""
    one = jax.jit(evaluate)
    acc, count, detail = {}, {}, {}
    for size in sizes:
        data = make_set(size)
        count[str(size)] = int(data.inputs.shape[0] * data.inputs.shape[1])
        per_replica = []
        for r in range(len(replicas)):
            m = jax.device_get(one(jax.tree.map(lambda a: a[r], params), data))
            per_replica.append({k: float(v) for k, v in m.items() if keep is None or k in keep})
        detail[str(size)] = per_replica
        for o in offsets:
            vals = [per_replica[r][metric] for r, rep in enumerate(replicas) if rep.offset == o]
            acc.setdefault(offset_key(o), {})[str(size)] = t_interval(vals)
        say(f"[{tag}] length generalisation at {size}: " + ", ".join(
            f"delta {o}: {v[str(size)]['mean']:.3f}" for o, v in acc.items()))
    return {"lengen_accuracy": acc, "lengen_examples": count, "lengen_detail": detail}


def eval_curves(records: list, n_replicas: int, metrics) -> tuple[list, dict]:
    """(eval steps, {metric: (steps, K) array}) from metrics.jsonl records (metric names without 'eval_');
    a step evaluated twice (a resumed run re-evaluates its last checkpoint) keeps its last record."""
    by_step = {}
    for r in records:
        if r.get("kind") == "eval" and all(f"eval_{m}" in r for m in metrics):
            by_step[int(r["step"])] = {m: np.asarray(r[f"eval_{m}"], np.float64).reshape(n_replicas) for m in metrics}
    steps = sorted(by_step)
    values = {m: (np.stack([by_step[s][m] for s in steps]) if steps else np.zeros((0, n_replicas))) for m in metrics}
    return steps, values
